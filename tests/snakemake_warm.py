"""Preloaded by the forkserver of tests/prewarmed.py: what every `snakemake` process would do
before reading the Snakefile, done once. Building Snakemake's argument parser collects its
executor, storage, report, logger and scheduler plugins, each kind a scan of every sys.path
entry; the registries are singletons, so the forked runs find them filled."""

import jsonschema  # noqa: F401  (decodelab.config.check's; a forked run re-imports only decodelab)
from snakemake.cli import get_argument_parser

get_argument_parser()
