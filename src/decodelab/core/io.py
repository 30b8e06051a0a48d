"""Tables on disk. Writes are atomic: a crashed job leaves no file that a rerun could mistake for a
finished one. Raw files (one measuring job's rows) also carry the row count their spec makes, so
that a reader refuses one that was cut short or replaced after the job."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from decodelab.core.errors import DecodelabError

EXPECTED_ROWS = "decodelab.expected_rows"  # the stamp's keys, in parquet and JSON alike
SPEC = "decodelab.spec"
# Committed reference runs predate the stamp; their raw files are read as they are.
REFERENCE = ("results", "reference")


def atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_table(df: pd.DataFrame, path: str | Path) -> Path:
    if str(path).endswith(".parquet"):
        return atomic(path, lambda p: df.to_parquet(p, index=False))
    return atomic(path, lambda p: df.to_csv(p, index=False))


def read_table(path: str | Path) -> pd.DataFrame:
    return pd.read_parquet(path) if str(path).endswith(".parquet") else pd.read_csv(path)


def write_json(obj, path: str | Path) -> Path:
    text = json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"
    return atomic(path, lambda p: p.write_text(text))


def redo_hint(path: str | Path, rule: str) -> str:
    return (f"delete {path} and run snakemake again to redo that job (or `snakemake --forcerun "
            f"{rule}` to redo every {rule} job)")


def is_reference(path: str | Path) -> bool:
    parts = Path(path).absolute().parts
    return any(parts[i:i + 2] == REFERENCE for i in range(len(parts)))


def write_raw(df: pd.DataFrame, path: str | Path, expected: int, spec: str) -> Path:
    """One job's rows as parquet, stamped with the row count its spec makes (`spec` says of
    what) in the schema metadata."""
    if len(df) != expected:
        raise DecodelabError(f"{path}: the job measured {len(df)} rows but should have "
                             f"measured {expected} ({spec}); nothing written")
    table = pa.Table.from_pandas(df, preserve_index=False)
    stamp = {EXPECTED_ROWS: str(expected), SPEC: spec}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **stamp})
    return atomic(path, lambda p: pq.write_table(table, p))


def read_raw(path: str | Path, rule: str) -> pd.DataFrame:
    """A raw parquet file of `rule`, refused unless it holds the rows its stamp says."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise DecodelabError(f"{path}: not a readable parquet file ({err}); "
                             f"{redo_hint(path, rule)}") from err
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if EXPECTED_ROWS not in meta:
        check_unstamped(path, rule)
    else:
        check_count(path, rule, "rows", table.num_rows, meta[EXPECTED_ROWS],
                    meta.get(SPEC, "its stamp"))
    return table.to_pandas()


def write_report(report: dict, path: str | Path) -> Path:
    """A JSON report, stamped with the length of each of its lists of rows."""
    counts = {key: len(rows) for key, rows in report.items() if isinstance(rows, list)}
    return write_json({**report, EXPECTED_ROWS: counts}, path)


def read_report(path: str | Path, rule: str) -> dict:
    """A JSON report of `rule`, refused unless each list holds the rows its stamp says."""
    try:
        report = json.loads(Path(path).read_text())
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        raise DecodelabError(f"{path}: not a readable JSON report ({err}); "
                             f"{redo_hint(path, rule)}") from err
    counts = report.get(EXPECTED_ROWS)
    if not isinstance(counts, dict):
        check_unstamped(path, rule)
        return report
    for key, expected in counts.items():
        rows = report.get(key)
        check_count(path, rule, f"{key!r} rows", len(rows) if isinstance(rows, list) else 0,
                    expected, "as its job wrote them")
    return report


def check_unstamped(path: str | Path, rule: str) -> None:
    if not is_reference(path):
        raise DecodelabError(
            f"{path}: no {EXPECTED_ROWS} stamp, so whether it is complete cannot be told (it was "
            f"not written by this version of decodelab's {rule} job); {redo_hint(path, rule)}")


def check_count(path: str | Path, rule: str, what: str, count: int, expected,
                made_of: str) -> None:
    if str(count) != str(expected):
        raise DecodelabError(
            f"{path}: holds {count} {what} but should hold {expected} ({made_of}): the file was "
            f"cut short or replaced after its job; {redo_hint(path, rule)}")


def as_bool(series: pd.Series) -> pd.Series:
    """CSV round trips turn booleans into strings; accept both."""
    if series.dtype == bool:
        return series
    return series.astype(str).str.strip().str.lower().isin(["true", "1", "yes"])
