class DecodelabError(Exception):
    """A problem the user can fix (config, environment, input): printed without a traceback."""
