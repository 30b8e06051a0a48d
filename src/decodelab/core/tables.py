"""Every statistics table, declared once: its file, the study it belongs to, the rule that writes
it, its typed columns, what the host contract requires of it and its HTML-report category.

The Snakemake rules expand their outputs from here; the figures, the paper, the host contract
(`decodelab.core.hosts`) and the reference comparison read the tables through `read`/`read_group`.
The tables no single study owns are declared below; a study declares its own in its folder
(`decodelab/studies/<name>/declared.py`), and `all_tables` puts them together. Adding a table is
one declaration plus the code that computes it.

No pandas at import time: the DAG imports this module.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from decodelab.core.errors import DecodelabError

BACKEND_ORDER = ("cpu", "cuda", "mps")
BACKEND_LABELS = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}
# A group's file names share its prefix; read_group's keys drop it (speculative_hf -> "hf").
PREFIXES = {"speculative": "speculative_", "verification": "verification_",
            "regime_depth": "regime_", "quantized": "quantized_", "verdicts": "verdicts_",
            "long": "long_", "batched": "batched_"}
ALL_OR_NONE = ("regime_depth",)  # read_group gives None unless every table asked for is there


@dataclass(frozen=True)
class Table:
    """results/<host>/stats/<name>.csv.

    numeric, flags and text are the columns a reader converts (to numbers, booleans, strings
    with '' for a missing value) where present; a numeric cell that is neither empty nor a
    number is refused. An `optional` table absent or empty reads as no rows; any other table
    must be there.
    `required` is what the host contract (`decodelab import`, the merge) demands: None for a
    table a host may lack. `per_host`: False for a table only the merge writes.
    """
    name: str
    group: str
    rule: str
    category: str
    numeric: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    text: tuple[str, ...] = ()
    optional: bool = False
    required: tuple[str, ...] | None = None
    per_host: bool = True

    @property
    def key(self) -> str:
        """The name within its group, as read_group keys it."""
        return self.name.removeprefix(PREFIXES.get(self.group, ""))


# The long-context pair's name in the verification tables: this and its drafter's ("long:self");
# no configured pair has a colon (config names), so its rows stand apart
# (decodelab.studies.verification.run).
LONG_PAIR = "long:"


CI = ("ci_low", "ci_high")
# Every row's stability verdict (decodelab.analysis.stability). Not required of a host: results from
# before it (results/reference/, older imports) lack it.
STABLE, REASON = ("stable",), ("unstable_reason",)
NOT_JUDGED = "not judged (no stability verdict: results from before it)"
SWEEP_KEYS = ("experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache",
              "budget", "metric")
SPREADS = ("processes", "cv_between", "cv_within", "max_over_median", "background",
           "cv_between_low", "cv_within_low", "load_max")


def verdicts(study: str, numeric: tuple[str, ...], text: tuple[str, ...],
             flags: tuple[str, ...] = ()) -> Table:
    """A study's verdict per configuration (`stability.verdicts`), by its key columns: written
    once by the `verdicts` rule, read by every rule whose tables carry verdicts."""
    return Table(f"verdicts_{study}", "verdicts", "verdicts", "Hosts and reference",
                 numeric=(*numeric, *SPREADS), flags=(*flags, *STABLE), text=(*text, *REASON),
                 optional=True)


# The tables no single study owns, in the order the merge writes them (its --tables argument);
# each study's follow (`all_tables`).
CORE_TABLES = (
    verdicts("sweep", ("prompt_len", "budget"),
             ("experiment", "backend", "model", "family", "dtype"), flags=("use_cache",)),
    verdicts("speculative", ("k",), ("pair", "method", "mode")),
    verdicts("parallelism", ("context", "tokens"), ("backend", "model")),
    Table("stability", "stability", "stability", "Hosts and reference",
          numeric=("configurations", "unstable", "unstable_share", "load_max",
                   "background_max"),
          flags=("noisy",), text=("job", "experiment", "backend", "model", "governor", "reason"),
          optional=True),
    Table("stability_summary", "stability", "stability", "Hosts and reference",
          numeric=("configurations", "stable", "stable_share"), flags=("noisy",),
          text=("judged_by", "remeasure"), optional=True),
    Table("selection", "selection", "selection", "Hosts and reference",
          numeric=("estimate", *CI, "n", "naive"), flags=("distinguishable",),
          text=("claim", "label", "selected_on", "estimated_on", "reason"), optional=True),
    Table("environment", "environment", "collect", "Hosts and reference",
          numeric=("cpu_count", "ram_bytes"),
          required=("backend", "device_name", "cpu_model", "cpu_count", "ram_bytes", "os",
                    "python", "torch", "transformers", "git_commit")),
    Table("skipped", "environment", "skipped", "Hosts and reference",
          required=("backend", "reason")),
    Table("models", "environment", "model_table", "Speculative", optional=True),
    Table("reference_comparison", "artifact", "reference_comparison", "Hosts and reference",
          optional=True),
    Table("benchmarks", "artifact", "benchmark_summary", "Benchmarks",
          numeric=("jobs", "expected", "total_s", "median_s", "max_s", "median_rss_mb",
                   "max_rss_mb"), optional=True),
    Table("hosts", "hosts", "merge_hosts", "Hosts and reference", optional=True,
          per_host=False),
)


# -----------------------------------------------------------------------------
# the registry

@cache
def all_tables() -> tuple[Table, ...]:
    """Every table: the core's, then each study's, as the registry (`decodelab.studies`) finds
    them in the studies' folders. Found by name at the first call: the core imports no study."""
    studies = importlib.import_module("decodelab.studies")
    return (*CORE_TABLES, *studies.tables())


def table(name: str) -> Table:
    for t in all_tables():
        if t.name == name:
            return t
    raise DecodelabError(f"no statistics table {name!r}; known: {', '.join(names())}")


def group(name: str) -> list[Table]:
    """A group's tables in declaration order."""
    return [t for t in all_tables() if t.group == name]


def names(group_name: str | None = None) -> list[str]:
    """Table names in declaration order, of one group or of all."""
    return [t.name for t in (all_tables() if group_name is None else group(group_name))]


def local_tables() -> list[str]:
    """The tables every host writes in results/<host>/stats/ (the merge's inputs)."""
    return [t.name for t in all_tables() if t.per_host]


def required() -> dict[str, tuple[str, ...]]:
    """The host contract: table -> the columns the merge, the figures and the paper read."""
    return {t.name: t.required for t in all_tables() if t.required is not None}


def report_category(name: str) -> str:
    return table(name).category


def path(stats_dir: str | Path, name: str) -> Path:
    return Path(stats_dir) / f"{table(name).name}.csv"


def ordered_backends(backends: Iterable[str]) -> list[str]:
    """Known backends in BACKEND_ORDER, then any other, sorted."""
    present = set(backends)
    return [b for b in BACKEND_ORDER if b in present] + sorted(present - set(BACKEND_ORDER))


# -----------------------------------------------------------------------------
# reading and writing

def typed(df, t: Table):
    """The declared columns of `t` present in `df` as numbers, booleans and strings. A row
    without a stability verdict (a table from before them, or merged with one) reads as not
    stable, its reason NOT_JUDGED: never a claim."""
    import pandas as pd

    from decodelab.core.io import as_bool

    if set(STABLE) <= set(t.flags):
        judged = df["stable"].notna() if "stable" in df else pd.Series(False, index=df.index)
        reason = df["unstable_reason"] if "unstable_reason" in df else pd.Series("", df.index)
        df["stable"] = df["stable"].where(judged, False) if "stable" in df else False
        df["unstable_reason"] = reason.where(judged, NOT_JUDGED)
    for col in [c for c in t.numeric if c in df.columns]:
        df[col] = pd.to_numeric(df[col], errors="coerce" if t.optional else "raise")
    for col in [c for c in t.flags if c in df.columns]:
        df[col] = as_bool(df[col])
    for col in [c for c in t.text if c in df.columns]:
        df[col] = df[col].astype("string").fillna("").astype(str)
    return df


def read(stats_dir: str | Path, name: str):
    """One table with its declared columns typed; an optional one absent or empty -> no rows."""
    import pandas as pd

    from decodelab.core.text import check_cells

    t = table(name)
    file = path(stats_dir, name)
    try:
        df = pd.read_csv(file)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        if not t.optional:
            raise
        return pd.DataFrame()
    check_cells(df, str(file))
    check_numbers(df, t, str(file))
    return typed(df, t)


def check_numbers(df, t: Table, what: str) -> None:
    """Every cell of `t`'s numeric columns is empty or a number; else an error naming `what`,
    the row (from 1 below the header) and the column."""
    import pandas as pd

    for col in [c for c in t.numeric if c in df.columns]:
        bad = (df[col].notna() & pd.to_numeric(df[col], errors="coerce").isna()).to_numpy()
        if bad.any():
            row = bad.nonzero()[0][0]
            raise DecodelabError(f"{what} row {row + 1}, column {col}: "
                                 f"{str(df[col].iloc[row])[:40]!r} is not a number")


def read_group(stats_dir: str | Path, group_name: str, keys: Iterable[str] | None = None
               ) -> dict | None:
    """key -> table for a group's tables (or those of `keys`). For regime_depth, None unless
    every one of them exists (the rule has not run)."""
    chosen = group(group_name)
    if keys is not None:
        by_key = {t.key: t for t in chosen}
        chosen = [by_key[k] for k in keys]
    if group_name in ALL_OR_NONE and not all(path(stats_dir, t.name).exists() for t in chosen):
        return None
    return {t.key: read(stats_dir, t.name) for t in chosen}


def write_group(out_dir: str | Path, group_name: str, frames: dict) -> list[Path]:
    """Write key -> table as the group's files; the keys must be exactly the group's."""
    from decodelab.core.io import write_table

    declared = group(group_name)
    if set(frames) != {t.key for t in declared}:
        raise DecodelabError(f"tables of group {group_name!r}: computed {sorted(frames)}, "
                             f"declared {sorted(t.key for t in declared)} (decodelab.core.tables)")
    return [write_table(frames[t.key], path(out_dir, t.name)) for t in declared]
