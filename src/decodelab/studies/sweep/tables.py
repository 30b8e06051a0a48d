"""The latency study's tables: medians of each configuration with bootstrap intervals, and the
KV cache's speedup (cache off over cache on) per configuration."""

from __future__ import annotations

import numpy as np
import pandas as pd

from decodelab.analysis.stability import paired, with_verdicts
from decodelab.analysis.stats import GRID, METRICS, bootstrap_ci, median_ratio, per_process
from decodelab.config.settings import Confidence


def latency_table(runs: pd.DataFrame, ci: Confidence, verdict: pd.DataFrame) -> pd.DataFrame:
    """Median and interval per configuration and metric, with the configuration's stability
    `verdict` (`stability.verdicts(runs, SWEEP, ...)`)."""
    rows = []
    for key, group in per_process(runs).groupby(GRID):
        for metric in METRICS:
            x = group[metric].to_numpy()
            low, high = bootstrap_ci(np.median, (x,), ci)
            rows.append({**dict(zip(GRID, key, strict=True)), "metric": metric,
                         "median": float(np.median(x)), "ci_low": low, "ci_high": high,
                         "n": len(x)})
    return with_verdicts(pd.DataFrame(rows), verdict, GRID)


def kv_speedup_table(runs: pd.DataFrame, ci: Confidence, verdict: pd.DataFrame) -> pd.DataFrame:
    """Cache-off over cache-on latency per configuration, both measured in the same processes;
    stable when both sides are (`verdict` as for latency_table)."""
    ablation = per_process(runs[runs["experiment"] == "ablation"])
    keys = ["backend", "model", "family", "dtype", "prompt_len", "budget"]
    rows = []
    for key, group in ablation.groupby(keys):
        for metric in ("total_s", "decode_s"):
            off = group.loc[~group["use_cache"], metric].to_numpy()
            on = group.loc[group["use_cache"], metric].to_numpy()
            if len(off) == 0 or len(on) == 0:
                continue
            low, high = bootstrap_ci(median_ratio, (off, on), ci)
            rows.append({**dict(zip(keys, key, strict=True)), "metric": metric,
                         "speedup": median_ratio(off, on), "ci_low": low, "ci_high": high,
                         "n": min(len(off), len(on))})
    table = pd.DataFrame(rows, columns=[*keys, "metric", "speedup", "ci_low", "ci_high", "n"])
    on = [*keys, "experiment"]
    return paired(table.assign(experiment="ablation"), verdict, {
        "cache off": (on, {"use_cache": False}), "cache on": (on, {"use_cache": True})}
    ).drop(columns="experiment")
