"""Tables on disk. Writes are atomic: a crashed job leaves no file that a rerun could mistake for a
finished one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd


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


def as_bool(series: pd.Series) -> pd.Series:
    """CSV round trips turn booleans into strings; accept both."""
    if series.dtype == bool:
        return series
    return series.astype(str).str.strip().str.lower().isin(["true", "1", "yes"])
