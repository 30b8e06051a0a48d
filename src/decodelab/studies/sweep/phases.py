"""Prefill or decode: in which phase the excess latency of a flagged spike sits.

For every spike the regime rule flagged (on total latency), each repeat (process) gives two
ratios to the local trend, computed exactly as the rule computes them (`regimes.repeat_ratios`):
one for prefill_s and one for decode_s. The test, per spike:

    d_r = log(decode ratio_r) - log(prefill ratio_r)      for each repeat r
    H0: mean d <= 0   vs   H1: mean d > 0                  one-sided paired Student t-test

rejected at `alpha` -> "decode"; the mirror test rejected -> "prefill"; neither -> "undecided".
As in `regimes.log_ratio_pvalue`, a t-test on log ratios, because timing noise is about
lognormal and rank tests cannot reach 0.05 with 3-4 repeats. Per experiment x cache x backend the
spikes are pooled with one unit per spike (its mean d over repeats), so repeats of one spike do
not count as independent; with a single spike the pooled row is that spike's own test. Where no
spike was flagged the pooled row says "not applicable" and carries no p-value.

The share of the excess in decode is (decode_s - trend)+ / ((decode_s - trend)+ + (prefill_s -
trend)+), in seconds, per repeat, median over repeats: 1 means all the excess is in decode.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from decodelab.analysis.regimes import repeat_ratios

CURVE = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache"]
POOL = ["experiment", "use_cache", "backend"]
NOT_APPLICABLE = "not applicable: no spike flagged"
COLUMNS = ["scope", *CURVE, "budget", "spikes", "n", "ratio_total", "ratio_prefill",
           "ratio_decode", "decode_share", "statistic", "p_decode", "p_prefill", "decision"]


def paired_log_test(decode_ratio: np.ndarray, prefill_ratio: np.ndarray) -> tuple[float, ...]:
    """(t, p for decode > prefill, p for prefill > decode) on paired log ratios; NaN below n=2."""
    d = np.log(np.asarray(decode_ratio, float)) - np.log(np.asarray(prefill_ratio, float))
    d = d[np.isfinite(d)]
    return one_sample_greater(d)


def one_sample_greater(d: np.ndarray) -> tuple[float, float, float]:
    if len(d) < 2:
        return math.nan, math.nan, math.nan
    if np.all(d == d[0]):  # no spread: the sign decides
        return (math.copysign(math.inf, d[0]) if d[0] else 0.0,
                0.0 if d[0] > 0 else 1.0, 0.0 if d[0] < 0 else 1.0)
    res = stats.ttest_1samp(d, 0.0)
    t = float(res.statistic)
    upper = float(stats.t.sf(t, len(d) - 1))
    return t, upper, float(stats.t.cdf(t, len(d) - 1))


def decide(p_decode: float, p_prefill: float, alpha: float) -> str:
    if not (np.isfinite(p_decode) and np.isfinite(p_prefill)):
        return "undecided (fewer than 2 repeats)"
    if p_decode < alpha:
        return "decode"
    if p_prefill < alpha:
        return "prefill"
    return "undecided"


def excess_share(decode_excess: np.ndarray, prefill_excess: np.ndarray) -> np.ndarray:
    """Share of the positive excess (seconds over the trend) that sits in decode; NaN if none."""
    dec = np.clip(np.asarray(decode_excess, float), 0, None)
    pre = np.clip(np.asarray(prefill_excess, float), 0, None)
    total = dec + pre
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, dec / total, np.nan)


def phase_table(per_process: pd.DataFrame, window: int, threshold: float) -> pd.DataFrame:
    """Per curve, budget and repeat: prefill and decode ratios and excess seconds."""
    parts = {}
    for metric in ("prefill_s", "decode_s"):
        r = repeat_ratios(per_process, metric, CURVE, window, threshold)
        parts[metric] = r.assign(excess=r["value"] - r["trend"])[
            [*CURVE, "budget", "repeat", "ratio", "excess"]]
    return parts["prefill_s"].merge(parts["decode_s"], on=[*CURVE, "budget", "repeat"],
                                    suffixes=("_prefill", "_decode"))


def spike_row(spike: pd.Series, cells: pd.DataFrame, alpha: float) -> dict:
    t, p_dec, p_pre = paired_log_test(cells["ratio_decode"], cells["ratio_prefill"])
    share = excess_share(cells["excess_decode"], cells["excess_prefill"])
    return {
        "scope": "spike", **{k: spike[k] for k in CURVE}, "budget": int(spike["budget"]),
        "spikes": 1, "n": len(cells), "ratio_total": float(spike["ratio_median"]),
        "ratio_prefill": float(cells["ratio_prefill"].median()),
        "ratio_decode": float(cells["ratio_decode"].median()),
        "decode_share": float(np.nanmedian(share)) if np.isfinite(share).any() else math.nan,
        "statistic": t, "p_decode": p_dec, "p_prefill": p_pre,
        "decision": decide(p_dec, p_pre, alpha),
        "_d": float(np.mean(np.log(cells["ratio_decode"]) - np.log(cells["ratio_prefill"]))),
    }


def pooled_row(key: tuple, spikes: pd.DataFrame, alpha: float) -> dict:
    base = {"scope": "backend", **{k: "" for k in CURVE}, **dict(zip(POOL, key, strict=True)),
            "budget": -1, "spikes": len(spikes), "n": len(spikes)}
    if not len(spikes):
        return {**base, "ratio_total": math.nan, "ratio_prefill": math.nan,
                "ratio_decode": math.nan, "decode_share": math.nan, "statistic": math.nan,
                "p_decode": math.nan, "p_prefill": math.nan, "decision": NOT_APPLICABLE}
    if len(spikes) == 1:
        only = spikes.iloc[0]
        t, p_dec, p_pre, n = only["statistic"], only["p_decode"], only["p_prefill"], only["n"]
    else:
        (t, p_dec, p_pre), n = one_sample_greater(spikes["_d"].to_numpy(float)), len(spikes)
    return {**base, "n": int(n),
            **{c: float(spikes[c].median()) for c in
               ("ratio_total", "ratio_prefill", "ratio_decode", "decode_share")},
            "statistic": t, "p_decode": p_dec, "p_prefill": p_pre,
            "decision": decide(p_dec, p_pre, alpha)}


def attribute_spikes(per_process: pd.DataFrame, regimes: pd.DataFrame, window: int,
                     threshold: float, alpha: float, metric: str = "total_s") -> pd.DataFrame:
    """One row per flagged spike (scope "spike") and per experiment x cache x backend (scope
    "backend", pooled; "not applicable" where nothing was flagged). See the module docstring.

    `per_process`: one row per configuration and repeat (`stats.per_process`), with prefill_s
    and decode_s; `regimes`: the regime rule's table.
    """
    missing = [c for c in [*CURVE, "budget", "repeat", "prefill_s", "decode_s"]
               if c not in per_process.columns]
    if missing:
        raise ValueError(f"attribute_spikes: the runs lack columns {missing}")
    table = regimes[regimes["metric"] == metric]
    flagged = table[table["spike"].astype(bool)]
    cells = phase_table(per_process, window, threshold) if len(flagged) else None
    spike_rows = []
    for _, spike in flagged.iterrows():
        hit = np.logical_and.reduce([cells[k] == spike[k] for k in [*CURVE, "budget"]])
        spike_rows.append(spike_row(spike, cells[hit], alpha))
    spikes = pd.DataFrame(spike_rows, columns=[*COLUMNS, "_d"])
    rows = []
    for key, _ in table.groupby(POOL, sort=True):
        mine = spikes[np.logical_and.reduce([spikes[k] == v for k, v in
                                             zip(POOL, key, strict=True)])] if len(spikes) \
            else spikes
        rows.append(pooled_row(key, mine, alpha))
    out = pd.concat([spikes.drop(columns="_d"), pd.DataFrame(rows, columns=COLUMNS)],
                    ignore_index=True)
    return out[COLUMNS]
