"""What the `decodelab` verbs of the CLI and of every study's cli.py share, without torch: a JSON
argument read as typed settings, a verdicts table read typed, and a study's figures verb."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from decodelab.core.errors import DecodelabError


def typed(settings: type, text: str, arg: str = "--spec"):
    """A JSON argument as the typed settings of config.py that the rule wrote it from; bad JSON
    or a missing or unknown key is an error naming the argument and the key."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise DecodelabError(f"{arg}: not JSON ({err})") from None
    if not isinstance(spec, dict):
        raise DecodelabError(f"{arg}: expected a JSON object of {settings.__name__}'s keys, "
                             f"got {type(spec).__name__}")
    try:
        return settings.from_spec(spec)
    except DecodelabError as err:
        raise DecodelabError(f"{arg} ({settings.__name__}): {err}") from None


def read_verdicts(path: str, study: str):
    """A verdicts_<study>.csv table (the `verdicts` verb's), typed."""
    import pandas as pd

    from decodelab.core import tables

    try:
        return tables.typed(pd.read_csv(path), tables.table(f"verdicts_{study}"))
    except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError) as err:
        raise DecodelabError(f"{path}: not a readable verdicts table ({err}); rerun the "
                             "verdicts rule") from err


def add_figures_verb(verbs, name: str, what: str, draw: str) -> None:
    """`decodelab <name> --stats DIR --out DIR`: a study's figures, drawn by `draw`
    ('module:function', imported when the verb runs, so that the parser loads no matplotlib)."""
    module, function = draw.split(":")

    def run(args):
        getattr(importlib.import_module(module), function)(Path(args.stats), Path(args.out))

    p = verbs.add_parser(name, help=f"draw {what}")
    p.add_argument("--stats", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(func=run)
