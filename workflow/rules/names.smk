# Names that become path components (the host, models, pairs) and the trees this run may write,
# checked from the config alone, before the rules that need torch are read. The checks are
# decodelab.config.settings's; the name rule itself is decodelab.core.names, and the schema has already held
# every name to it.
import re
import socket

from snakemake.exceptions import WorkflowError

from decodelab.config.settings import (
    Settings,
    check_engines,
    check_hosts,
    check_model_names,
    check_names_differ_by_more_than_case,
    check_verification_pairs,
    this_host,
)
from decodelab.core.errors import DecodelabError
from decodelab.core.names import NAME_REGEX


def checked(check, *args):
    """Run a decodelab.config.settings check: its error stops the DAG, as one line."""
    try:
        return check(*args)
    except DecodelabError as err:
        raise WorkflowError(str(err)) from None


# The validated config, typed: every rule reads its settings from here.
SETTINGS = Settings.from_config(config)
# Other hosts: results imported with `decodelab import` into results/<host>/ that the paper
# merges beside this host's. They are inputs, never outputs: only this host's rules match.
IMPORTED = list(SETTINGS.hosts)
HOST = checked(this_host, SETTINGS.host, socket.gethostname())
checked(check_model_names, SETTINGS)
checked(check_verification_pairs, SETTINGS)
checked(check_engines, SETTINGS)
checked(check_names_differ_by_more_than_case, SETTINGS)
checked(check_hosts, HOST, IMPORTED)


# Model and pair wildcards match names only, so that no name reaches two rules.
wildcard_constraints:
    host=re.escape(HOST),
    model=NAME_REGEX,
    pair=NAME_REGEX,
