"""Tidy tables from raw runs: medians with bootstrap CIs, KV-cache speedups, environments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as st

GRID = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache", "budget"]
METRICS = ["total_s", "prefill_s", "decode_s", "decode_per_token_s"]
ENVIRONMENT = ["host", "backend", "device_name", "cpu_model", "cpu_count", "ram_bytes", "os",
               "python", "torch", "transformers", "git_commit"]


def read_runs(paths: list[str | Path], host: str) -> pd.DataFrame:
    runs = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
    runs.insert(0, "host", host)
    return runs


def per_process(runs: pd.DataFrame) -> pd.DataFrame:
    """One value per process and configuration: the unit the bootstrap resamples."""
    keys = GRID + ["repeat"]
    return runs.groupby(keys, as_index=False)[METRICS].median()


def bootstrap_ci(statistic, samples: tuple[np.ndarray, ...], confidence: float,
                 resamples: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap; a degenerate sample (n < 2 or no spread) gives a zero-width CI."""
    point = statistic(*samples)
    if min(len(s) for s in samples) < 2 or all(np.ptp(s) == 0 for s in samples):
        return point, point
    res = st.bootstrap(samples, statistic, n_resamples=resamples, confidence_level=confidence,
                       method="percentile", vectorized=False, paired=False,
                       rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def latency_table(runs: pd.DataFrame, confidence: float, resamples: int,
                  seed: int) -> pd.DataFrame:
    rows = []
    for key, group in per_process(runs).groupby(GRID):
        for metric in METRICS:
            x = group[metric].to_numpy()
            low, high = bootstrap_ci(np.median, (x,), confidence, resamples, seed)
            rows.append({**dict(zip(GRID, key, strict=True)), "metric": metric,
                         "median": float(np.median(x)), "ci_low": low, "ci_high": high,
                         "n": len(x)})
    return pd.DataFrame(rows)


def median_ratio(off: np.ndarray, on: np.ndarray) -> float:
    return float(np.median(off) / np.median(on))


def kv_speedup_table(runs: pd.DataFrame, confidence: float, resamples: int,
                     seed: int) -> pd.DataFrame:
    """Cache-off over cache-on latency per configuration, both measured in the same processes."""
    ablation = per_process(runs[runs["experiment"] == "ablation"])
    keys = ["backend", "model", "family", "dtype", "prompt_len", "budget"]
    rows = []
    for key, group in ablation.groupby(keys):
        for metric in ("total_s", "decode_s"):
            off = group.loc[~group["use_cache"], metric].to_numpy()
            on = group.loc[group["use_cache"], metric].to_numpy()
            if len(off) == 0 or len(on) == 0:
                continue
            low, high = bootstrap_ci(median_ratio, (off, on), confidence, resamples, seed)
            rows.append({**dict(zip(keys, key, strict=True)), "metric": metric,
                         "speedup": median_ratio(off, on), "ci_low": low, "ci_high": high,
                         "n": min(len(off), len(on))})
    return pd.DataFrame(rows, columns=[*keys, "metric", "speedup", "ci_low", "ci_high", "n"])


def environment_table(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[ENVIRONMENT].drop_duplicates().sort_values(["backend"]).reset_index(drop=True)
