"""What every study's tables rest on: raw runs read back with their process, bootstrap intervals,
median ratios, and the environment table. Each study computes its own tables from these
(`decodelab.studies.<name>.tables`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

from decodelab.analysis.stability import Study
from decodelab.config.settings import Confidence
from decodelab.core.io import read_raw

GRID = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache", "budget"]
# How each kind of raw file makes configurations for the stability verdicts.
SWEEP = Study("sweep", tuple(GRID), "total_s")
SPECULATIVE = Study("speculative", ("pair", "method", "mode", "k"), "total_s", cell=("prompt",),
                    model="pair")
PARALLELISM = Study("parallelism", ("backend", "model", "context", "tokens"), "seconds")
STUDIES = {study.name: study for study in (SWEEP, SPECULATIVE, PARALLELISM)}
METRICS = ["total_s", "prefill_s", "decode_s", "decode_per_token_s"]
ENVIRONMENT = ["host", "backend", "device_name", "cpu_model", "cpu_count", "ram_bytes", "os",
               "python", "torch", "transformers", "git_commit"]


def read_raw_runs(paths: list[str | Path], rule: str) -> pd.DataFrame:
    """The raw files of `rule`, each row with its file as `job` (the stability table's key)."""
    if not paths:
        return pd.DataFrame()
    return pd.concat([read_raw(p, rule).assign(job=str(p)) for p in paths], ignore_index=True)


def read_runs(paths: list[str | Path], host: str) -> pd.DataFrame:
    runs = read_raw_runs(paths, "sweep")
    runs.insert(0, "host", host)
    return runs


def per_process(runs: pd.DataFrame) -> pd.DataFrame:
    """One value per process and configuration: the unit the bootstrap resamples."""
    keys = GRID + ["repeat"]
    return runs.groupby(keys, as_index=False)[METRICS].median()


def bootstrap_ci(statistic, samples: tuple[np.ndarray, ...], ci: Confidence,
                 paired: bool = False) -> tuple[float, float]:
    """Percentile bootstrap; a degenerate sample (n < 2 or no spread) gives a zero-width CI.
    `paired`: the samples' i-th values belong together (one prompt) and are resampled so."""
    point = statistic(*samples)
    if min(len(s) for s in samples) < 2 or all(np.ptp(s) == 0 for s in samples):
        return point, point
    vectorized = VECTORIZED.get(statistic)
    res = st.bootstrap(samples, vectorized or statistic, n_resamples=ci.bootstrap_resamples,
                       confidence_level=ci.confidence, method="percentile",
                       vectorized=vectorized is not None, paired=paired,
                       rng=np.random.default_rng(ci.seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def mean_ci(x: np.ndarray, ci: Confidence, least: int = 1) -> tuple[float, float, float]:
    """The mean of the finite values and its percentile-bootstrap interval; fewer than `least`
    of them give no interval (NaN) rather than a zero-width one."""
    x = x[np.isfinite(x)]
    if not len(x):
        return np.nan, np.nan, np.nan
    if len(x) < least:
        return float(np.mean(x)), np.nan, np.nan
    return (float(np.mean(x)), *bootstrap_ci(np.mean, (x,), ci))


def median_ratio(off: np.ndarray, on: np.ndarray) -> float:
    return float(np.median(off) / np.median(on))


def median_ratio_along(off: np.ndarray, on: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(off, axis=axis) / np.median(on, axis=axis)


# Statistics the bootstrap computes over all its resamples at once: the same resamples and the
# same values as one call per resample (tests/test_stats.py checks), about 20x less CPU.
VECTORIZED = {np.median: np.median, median_ratio: median_ratio_along}


def environment_table(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[ENVIRONMENT].drop_duplicates().sort_values(["backend"]).reset_index(drop=True)


# --- speculative decoding -----------------------------------------------------------------------


