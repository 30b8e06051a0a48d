"""The stats tables as the paper reads them, beyond `decodelab.core.tables`: models.csv with its
manifest dicts flattened, and the orders of pairs, modes and samplers (from the figures).

The one place the paper imports from `decodelab.report.figures`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from decodelab.core import tables
from decodelab.core.text import check_cells
from decodelab.report.figures import SAMPLER_ORDER, ordered_samplers, spec_modes, spec_pairs

__all__ = ["SAMPLER_ORDER", "model_field", "ordered_samplers", "read_models", "spec_modes",
           "spec_pairs"]

MODEL_FIELDS = {          # models.csv column -> aliases (manifest keys, flattened or not)
    "train_loss": ("train_loss", "final_train_loss"),
    "heldout_loss": ("heldout_loss", "held_out_loss"),
    "beta": ("beta",),
    "greedy_agreement": ("greedy_agreement",),
    "wall_s": ("wall_s", "wall_seconds", "train_seconds"),
    "corpus_sha256": ("corpus_sha256", "sha256"),
    "corpus_bytes": ("corpus_bytes",),
    "teacher": ("teacher", "spec_teacher"),
    "parameters": ("parameters",),
    "source": ("source",),
    "python": ("python",),
    "n_layer": ("n_layer", "spec_n_layer"),
    "n_embd": ("n_embd", "spec_n_embd"),
}


def read_models(stats_dir: Path) -> pd.DataFrame:
    """models.csv with manifest dicts (corpus, spec) flattened to corpus_sha256, spec_n_layer..."""
    file = tables.path(stats_dir, "models")
    try:
        df = pd.read_csv(file)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame(columns=["model"])
    check_cells(df, str(file))
    df.columns = [re.sub(r"[^A-Za-z0-9]+", "_", str(c)).strip("_") for c in df.columns]
    for col in list(df.columns):
        parsed = df[col].map(as_dict)
        if parsed.map(bool).any():
            for key in sorted({k for d in parsed for k in d}):
                name = f"{col}_{re.sub(r'[^A-Za-z0-9]+', '_', str(key))}"
                if name not in df:
                    df[name] = parsed.map(lambda d, key=key: d.get(key))
    return df


def as_dict(value) -> dict:
    """A manifest dict that a CSV round trip turned into text (repr or JSON); else {}."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, str) or not value.startswith("{"):
        return {}
    for parse in (json.loads, ast.literal_eval):
        try:
            out = parse(value)
        except (ValueError, SyntaxError):
            continue
        return out if isinstance(out, dict) else {}
    return {}


def model_field(models: pd.DataFrame, model: str, field: str):
    """The first alias of `field` that the row of `model` has a value for, else None."""
    rows = models[models["model"].astype(str) == str(model)] if len(models) else models
    if not len(rows):
        return None
    row = rows.iloc[0]
    for alias in MODEL_FIELDS.get(field, (field,)):
        if alias in row.index and not (np.isscalar(row[alias]) and pd.isna(row[alias])):
            return row[alias]
    return None
