"""Does memory explain the latency excess? Rank correlation and explained share, per backend.

The excess of a configuration is its log ratio to the local trend of neighbouring budgets (the
regime rule's ratio, `regimes.repeat_ratios`, median over repeats): 0 on a smooth curve, log 21
at a 21x spike. Against it, per backend, each memory column the sweep records
(`devices.memory_snapshot`), median over the configuration's processes:

    allocator: mem_cuda_peak_bytes (CUDA peak), mem_mps_current_bytes (MPS current)
    driver:    mem_mps_driver_bytes (MPS driver-allocated)
    rss:       rss_bytes (process resident set)

Reported: Spearman's rho with its two-sided p-value, and the explained share R^2 of an ordinary
least-squares line excess ~ memory (GiB), i.e. the fraction of the excess's variance a linear
memory term accounts for. Memory grows with the budget (the KV cache), so a residual that drifts
with the budget would correlate with memory without memory causing anything; the partial
Spearman correlation given the budget (ranks of excess and memory each residualised on the
budget's ranks, t-test on n - 3 degrees of freedom) removes that path. The unit is the
configuration (not the process), so repeats of one configuration are not counted as independent
evidence. A column a backend does not record (all NaN, e.g. allocator memory on CPU) or that
does not vary is reported with a status saying so and no numbers; fewer than 3 configurations
likewise.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from decodelab.analysis.regimes import repeat_ratios

CURVE = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache"]
MEMORY = {
    "mem_cuda_peak_bytes": "allocator",
    "mem_mps_current_bytes": "allocator",
    "mem_mps_driver_bytes": "driver",
    "rss_bytes": "rss",
}
COLUMNS = ["backend", "column", "kind", "configs", "rho", "p_value", "r2", "slope_per_gib",
           "rho_given_budget", "p_given_budget", "status"]
MIN_CONFIGS = 3


def excess_by_config(per_process: pd.DataFrame, window: int, threshold: float,
                     metric: str = "total_s") -> pd.DataFrame:
    """Per configuration: median log ratio to the local trend and median memory columns."""
    missing = [c for c in [*CURVE, "budget", "repeat", metric] if c not in per_process.columns]
    if missing:
        raise ValueError(f"memory: the runs lack columns {missing}")
    ratios = repeat_ratios(per_process, metric, CURVE, window, threshold)
    ratios = ratios.assign(excess=np.log(ratios["ratio"].astype(float)))
    excess = ratios.groupby([*CURVE, "budget"], dropna=False)["excess"].median()
    present = [c for c in MEMORY if c in per_process.columns]
    memory = per_process.groupby([*CURVE, "budget"], dropna=False)[present].median()
    return excess.to_frame().join(memory).reset_index()


def partial_spearman(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> tuple[float, float]:
    """Spearman correlation of x and y given z, with its two-sided p-value (n - 3 dof)."""
    rx, ry, rz = (stats.rankdata(v) for v in (x, y, z))
    design = np.column_stack([np.ones(len(rz)), rz])
    resid = [r - design @ np.linalg.lstsq(design, r, rcond=None)[0] for r in (rx, ry)]
    if min(np.ptp(r) for r in resid) < 1e-12:
        return math.nan, math.nan
    rho = float(np.corrcoef(*resid)[0, 1])
    dof = len(x) - 3
    if dof < 1 or abs(rho) >= 1:
        return rho, (0.0 if abs(rho) >= 1 else math.nan)
    t = rho * math.sqrt(dof / (1 - rho**2))
    return rho, float(2 * stats.t.sf(abs(t), dof))


def correlate(memory: np.ndarray, excess: np.ndarray,
              budget: np.ndarray | None = None) -> dict[str, float | int | str]:
    """Spearman rho, p and OLS R^2 of excess on memory (and rho given the budget), or a status
    saying why not."""
    memory, excess = np.asarray(memory, float), np.asarray(excess, float)
    budget = np.zeros(len(memory)) if budget is None else np.asarray(budget, float)
    nan = {"rho": math.nan, "p_value": math.nan, "r2": math.nan, "slope_per_gib": math.nan,
           "rho_given_budget": math.nan, "p_given_budget": math.nan}
    if not np.isfinite(memory).any():
        return {"configs": 0, **nan, "status": "not applicable: not recorded on this backend"}
    keep = np.isfinite(memory) & np.isfinite(excess)
    x, y, z = memory[keep] / 2**30, excess[keep], budget[keep]
    n = int(keep.sum())
    if n < MIN_CONFIGS:
        return {"configs": n, **nan, "status": f"not applicable: fewer than {MIN_CONFIGS} "
                                               "configurations"}
    if np.ptp(x) == 0:
        return {"configs": n, **nan, "status": "not applicable: memory constant"}
    if np.ptp(y) == 0:
        return {"configs": n, **nan, "status": "not applicable: excess constant"}
    rho, p = stats.spearmanr(x, y)
    fit = stats.linregress(x, y)
    rho_z, p_z = partial_spearman(x, y, z) if np.ptp(z) > 0 else (math.nan, math.nan)
    return {"configs": n, "rho": float(rho), "p_value": float(p), "r2": float(fit.rvalue**2),
            "slope_per_gib": float(fit.slope), "rho_given_budget": rho_z,
            "p_given_budget": p_z, "status": "ok"}


def memory_correlation(per_process: pd.DataFrame, window: int, threshold: float,
                       metric: str = "total_s") -> pd.DataFrame:
    """One row per backend and memory column (see the module docstring)."""
    table = excess_by_config(per_process, window, threshold, metric)
    rows = []
    for backend, g in table.groupby("backend", sort=True):
        for column, kind in MEMORY.items():
            values = g[column] if column in g else pd.Series(np.nan, index=g.index)
            rows.append({"backend": backend, "column": column, "kind": kind,
                         **correlate(values.to_numpy(float), g["excess"].to_numpy(float),
                                     g["budget"].to_numpy(float))})
    return pd.DataFrame(rows, columns=COLUMNS)
