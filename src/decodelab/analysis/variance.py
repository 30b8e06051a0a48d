"""Between processes or within one: how the latency variance of a configuration splits.

Each configuration (experiment, backend, model, dtype, prompt, cache, budget) is measured in
`repeats` separate processes, `inner` times inside each. On log latency, a one-way random-effects
ANOVA with the process as the group and the inner repeats as replicates:

    y_ri = mu + a_r + e_ri,   a_r ~ N(0, s2_between),   e_ri ~ N(0, s2_within)

    MSB = sum_r n_r (ybar_r - ybar)^2 / (k - 1),   MSW = sum_ri (y_ri - ybar_r)^2 / (N - k)
    n0  = (N - sum_r n_r^2 / N) / (k - 1)          (n0 = inner when balanced)
    s2_between = max(0, (MSB - MSW) / n0),  s2_within = MSW
    share_between = s2_between / (s2_between + s2_within)   (the intraclass correlation)
    F = MSB / MSW on (k - 1, N - k) degrees of freedom: H0 "no process effect"

A configuration with fewer than 2 processes, or with a single inner repeat in every process
(N = k: nothing to estimate the within-process variance from), gets status
"not separable: ..." and NaN shares; no share is invented for it. With zero spread inside
processes (MSW = 0) the between share is 1 if processes differ, else NaN.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

CONFIG = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache",
          "budget"]
COLUMNS = [*CONFIG, "metric", "processes", "runs", "var_between", "var_within", "share_between",
           "f_stat", "p_value", "status"]
SUMMARY_BY = ["experiment", "use_cache", "backend", "family", "dtype", "metric"]
SUMMARY_COLUMNS = [*SUMMARY_BY, "configs", "separable", "share_pooled", "share_median",
                   "share_q25", "share_q75", "significant", "alpha"]


def one_way_anova(groups: list[np.ndarray]) -> dict[str, float | int | str]:
    """Variance components of a one-way random-effects ANOVA (see the module docstring)."""
    groups = [np.asarray(g, float)[np.isfinite(g)] for g in groups]
    groups = [g for g in groups if len(g)]
    k, sizes = len(groups), np.array([len(g) for g in groups])
    n_total = int(sizes.sum())
    out = {"processes": k, "runs": n_total, "var_between": math.nan, "var_within": math.nan,
           "share_between": math.nan, "f_stat": math.nan, "p_value": math.nan}
    if k < 2:
        return {**out, "status": "not separable: fewer than 2 processes"}
    if n_total == k:
        return {**out, "status": "not separable: a single inner repeat per process"}
    grand = np.concatenate(groups).mean()
    means = np.array([g.mean() for g in groups])
    msb = float(np.sum(sizes * (means - grand) ** 2) / (k - 1))
    msw = float(sum(np.sum((g - g.mean()) ** 2) for g in groups) / (n_total - k))
    n0 = (n_total - np.sum(sizes**2) / n_total) / (k - 1)
    var_between = max(0.0, (msb - msw) / n0)
    out.update(var_between=var_between, var_within=msw)
    if msw == 0:
        out.update(share_between=1.0 if msb > 0 else math.nan,
                   f_stat=math.inf if msb > 0 else math.nan, p_value=0.0 if msb > 0 else math.nan)
        return {**out, "status": "ok (no spread inside processes)"}
    f_stat = msb / msw
    out.update(share_between=var_between / (var_between + msw), f_stat=f_stat,
               p_value=float(stats.f.sf(f_stat, k - 1, n_total - k)))
    return {**out, "status": "ok"}


def decompose(runs: pd.DataFrame, metrics: tuple[str, ...] = ("total_s", "prefill_s",
                                                                "decode_s")) -> pd.DataFrame:
    """One row per configuration and metric: variance components of log latency.

    `runs` are raw rows (one per configuration x process x inner repeat) with `repeat` (the
    process) and the latency columns.
    """
    missing = [c for c in [*CONFIG, "repeat", *metrics] if c not in runs.columns]
    if missing:
        raise ValueError(f"variance.decompose: the runs lack columns {missing}")
    rows = []
    for key, cell in runs.groupby(CONFIG, dropna=False, sort=True):
        for metric in metrics:
            values = cell[metric].to_numpy(float)
            if (values[np.isfinite(values)] <= 0).any():
                raise ValueError(f"variance.decompose: {metric!r} must be positive (logs)")
            groups = [np.log(g[metric].to_numpy(float)) for _, g in cell.groupby("repeat")]
            rows.append({**dict(zip(CONFIG, key, strict=True)), "metric": metric,
                         **one_way_anova(groups)})
    return pd.DataFrame(rows, columns=COLUMNS)


def summarize(table: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Per experiment x cache x backend x family x dtype x metric: the between-process share.

    share_pooled = mean s2_between / (mean s2_between + mean s2_within) over the separable
    configurations (the share of an average configuration's variance); median and quartiles of
    the per-configuration shares; `significant`: configurations whose F-test rejects at alpha.
    """
    rows = []
    for key, g in table.groupby(SUMMARY_BY, dropna=False, sort=True):
        ok = g[g["status"].str.startswith("ok")]
        shares = ok["share_between"].dropna().to_numpy(float)
        between, within = ok["var_between"].mean(), ok["var_within"].mean()
        pooled = between / (between + within) if len(ok) and between + within > 0 else math.nan
        rows.append({**dict(zip(SUMMARY_BY, key, strict=True)), "configs": len(g),
                     "separable": len(ok), "share_pooled": pooled,
                     "share_median": float(np.median(shares)) if len(shares) else math.nan,
                     "share_q25": float(np.quantile(shares, 0.25)) if len(shares) else math.nan,
                     "share_q75": float(np.quantile(shares, 0.75)) if len(shares) else math.nan,
                     "significant": int((ok["p_value"] < alpha).sum()), "alpha": alpha})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
