"""The config: the schema's checks and the typed settings every job reads."""
