"""Does the KV-cache speedup collapse inside a spike?

The ablation measures every configuration with the cache on and off in the same processes, so
each process gives a speedup (cache-off over cache-on total latency) at each budget. Along the
budget axis the speedup has its own local trend (the regime rule's `spike_trend` through the
neighbouring budgets, `regimes.repeat_ratios`). For each spike the rule flagged on the cache-on
series of the ablation:

    q_r = speedup_r / trend_r                 for each process r
    H0: mean log q >= 0   vs   H1: mean log q < 0     one-sided Student t-test

rejected at `alpha` -> "collapse" (the speedup there falls below what its neighbours predict).
A spike that slows cache-on and cache-off decoding alike leaves the speedup on its trend and is
not a collapse. Per experiment x backend the spikes are pooled with one unit per spike (its mean
log q); the budgets that were not flagged give the control: their median q, which should be
about 1. Without a flagged spike the test is reported as not applicable.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from decodelab.analysis.regimes import repeat_ratios

CURVE = ["backend", "model", "family", "dtype", "prompt_len"]
NOT_APPLICABLE = "not applicable: no spike flagged in the ablation (cache on)"
COLUMNS = ["scope", *CURVE, "budget", "spikes", "n", "ratio_total", "speedup", "speedup_trend",
           "speedup_ratio", "statistic", "p_value", "decision", "control_ratio"]


def speedups(per_process: pd.DataFrame) -> pd.DataFrame:
    """Per curve, budget and process of the ablation: cache-off over cache-on total latency."""
    missing = [c for c in [*CURVE, "experiment", "use_cache", "budget", "repeat", "total_s"]
               if c not in per_process.columns]
    if missing:
        raise ValueError(f"collapse: the runs lack columns {missing}")
    abl = per_process[per_process["experiment"] == "ablation"]
    wide = abl.pivot_table(index=[*CURVE, "budget", "repeat"], columns="use_cache",
                           values="total_s", aggfunc="median")
    if True not in wide.columns or False not in wide.columns:
        return pd.DataFrame(columns=[*CURVE, "budget", "repeat", "speedup"])
    out = (wide[False] / wide[True]).rename("speedup").dropna().reset_index()
    return out


def less_than_zero(logs: np.ndarray) -> tuple[float, float]:
    """(t, one-sided p for mean < 0); NaN below 2 values; the sign decides without spread."""
    logs = np.asarray(logs, float)
    logs = logs[np.isfinite(logs)]
    if len(logs) < 2:
        return math.nan, math.nan
    if np.all(logs == logs[0]):
        return (math.copysign(math.inf, logs[0]) if logs[0] else 0.0,
                0.0 if logs[0] < 0 else 1.0)
    res = stats.ttest_1samp(logs, 0.0, alternative="less")
    return float(res.statistic), float(res.pvalue)


def kv_collapse(per_process: pd.DataFrame, regimes: pd.DataFrame, window: int,
                threshold: float, alpha: float, metric: str = "total_s") -> pd.DataFrame:
    """One row per ablation spike (scope "spike") and per backend (scope "backend")."""
    sp = speedups(per_process)
    ratios = (repeat_ratios(sp, "speedup", CURVE, window, threshold) if len(sp)
              else pd.DataFrame(columns=[*CURVE, "budget", "repeat", "value", "trend", "ratio"]))
    table = regimes[(regimes["metric"] == metric) & (regimes["experiment"] == "ablation")
                    & regimes["use_cache"].astype(bool)]
    flagged = table[table["spike"].astype(bool)]
    keys = [*CURVE, "budget"]
    marked = ratios.merge(flagged[keys].assign(_spike=True), on=keys, how="left")
    marked["_spike"] = marked["_spike"].fillna(False).astype(bool)
    rows, units = [], []
    for _, spike in flagged.iterrows():
        cells = marked[np.logical_and.reduce([marked[k] == spike[k] for k in keys])]
        logs = np.log(cells["ratio"].to_numpy(float))
        t, p = less_than_zero(logs)
        rows.append({"scope": "spike", **{k: spike[k] for k in keys}, "spikes": 1,
                     "n": len(cells), "ratio_total": float(spike["ratio_median"]),
                     "speedup": float(cells["value"].median()),
                     "speedup_trend": float(cells["trend"].median()),
                     "speedup_ratio": float(cells["ratio"].median()), "statistic": t,
                     "p_value": p, "decision": collapse_decision(p, alpha),
                     "control_ratio": math.nan})
        units.append((spike["backend"], float(np.mean(logs)) if len(logs) else math.nan))
    for backend in sorted(set(table["backend"])):
        mine = [u for b, u in units if b == backend]
        control = marked[(marked["backend"] == backend) & ~marked["_spike"]]
        control_ratio = float(control.groupby(keys)["ratio"].median().median()) \
            if len(control) else math.nan
        base = {"scope": "backend", **{k: "" for k in CURVE}, "backend": backend, "budget": -1,
                "spikes": len(mine), "n": len(mine), "ratio_total": math.nan,
                "speedup": math.nan, "speedup_trend": math.nan, "control_ratio": control_ratio}
        if not mine:
            rows.append({**base, "speedup_ratio": math.nan, "statistic": math.nan,
                         "p_value": math.nan, "decision": NOT_APPLICABLE})
            continue
        spikes = [r for r in rows if r["scope"] == "spike" and r["backend"] == backend]
        if len(mine) == 1:
            t, p = spikes[0]["statistic"], spikes[0]["p_value"]
            n = spikes[0]["n"]
        else:
            (t, p), n = less_than_zero(np.array(mine)), len(mine)
        rows.append({**base, "n": n,
                     "speedup_ratio": float(np.median([r["speedup_ratio"] for r in spikes])),
                     "statistic": t, "p_value": p, "decision": collapse_decision(p, alpha)})
    return pd.DataFrame(rows, columns=COLUMNS)


def collapse_decision(p: float, alpha: float) -> str:
    if not np.isfinite(p):
        return "undecided (fewer than 2 processes)"
    return "collapse" if p < alpha else "no collapse"
