"""Regime detection: latency spikes at a decoding budget that its neighbouring budgets do not share.

The rule, as the paper states it (defaults in brackets):

    A budget is a spike when, in every repeat [consistency = 1.0], its latency is at least 1.5x
    [threshold] the robust local trend of its neighbouring budgets (a Theil-Sen line through up
    to 2 [window] budgets on each side, 3 on the open side at a curve end, taken as the higher of
    the fits with and without neighbours that themselves reach 1.5x) and, given 3 or more
    repeats, a one-sided t-test on the repeats' log ratios rejects "mean log ratio <= log 1.5"
    at alpha = 0.05.

The median ratio over repeats must also reach the threshold; "every repeat" already implies it.

Details a reader of the numbers needs:

- Each repeat's trend comes from that repeat's own curve, so repeats give independent ratios.
- Why the t-test: see `log_ratio_pvalue`; rank tests cannot reach 0.05 with 3-4 repeats.
- At a curve end the trend is an extrapolation from window + 1 points, which halves the noise of
  a two-point line. (A wider end neighbourhood extrapolates convex curves with more bias.)
- A spike among the few points an end is extrapolated from tilts the line and would make the
  end a phantom spike; the refit without such neighbours removes that (`spike_trend`).
- The trend is floored at the smallest neighbour value scaled proportionally to budget
  (`proportional_floor`), so extrapolating a convex curve cannot drive it to or below zero. The
  floor only raises the trend (it can hide a spike, never create one) and is inactive on linear
  curves with non-negative intercept and slope, i.e. on any plausible latency line.
- The trend is linear in budget, so it assumes the curve is close to linear across 2 * window
  neighbouring budgets. On a grid that doubles at every step a quadratic curve (cache-off
  decoding) breaks that at the last budget; keep the grid denser there.
- What it finds: isolated spikes up to `window` budgets wide (two adjacent spikes at the very
  end of a curve hide each other). A sustained step (a regime shift that persists) is not a
  spike: past its first budget the trend follows the new level. At the first budget the trend
  is a compromise between the levels, so the ratio there stays bounded whatever the height
  (2h / (h + 1) < 2 on an evenly spaced flat curve, up to about 3 on a geometric grid): a 2x
  step flags nothing, a much larger one may flag its first budget only. Regime shifts are a
  job for change-point detection.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from decodelab.analysis.stability import with_verdicts
from decodelab.config.settings import SpikeRule

MIN_BUDGETS = 3  # with fewer budgets a curve has no "neighbours' trend" worth the name

OUTPUT_COLUMNS = [
    "budget", "metric", "value_median", "trend_median", "ratio_median", "ratio_min",
    "frac_above", "p_value", "n_repeats", "spike",
]


def neighbours(allowed: np.ndarray, i: int, window: int) -> np.ndarray:
    """Neighbours of point i on a sorted axis: up to `window` allowed points on each side.

    At a curve end the open side supplies window + 1 points, so the extrapolated line rests on
    more than two points and a 1-point window still gets a slope.
    """
    pool = np.flatnonzero(allowed)
    pool = pool[pool != i]
    left, right = pool[pool < i], pool[pool > i]
    n_left, n_right = min(window, len(left)), min(window, len(right))
    short = min(window + 1, len(pool)) - (n_left + n_right)
    if short > 0:  # only one side can be short here: the other has its full `window`
        if n_left < window:
            n_right += short
        else:
            n_left += short
    return np.concatenate([left[len(left) - n_left :], right[:n_right]])


def proportional_floor(b_i: float, b_nb: np.ndarray, v_nb: np.ndarray) -> float:
    # Latency cannot change faster than proportionally to budget in either direction (a positive
    # line with f(0) >= 0 never does), so this lower bound never bites on such lines.
    scale = np.minimum(b_i, b_nb) / np.maximum(b_i, b_nb)
    return float(np.min(v_nb * scale))


def theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """scipy.stats.theilslopes(y, x, method="joint")'s slope and intercept, the same arithmetic,
    without the slope's confidence interval (which costs nine tenths of scipy's time)."""
    dx = x[:, np.newaxis] - x
    dy = y[:, np.newaxis] - y
    slope = np.median(dy[dx > 0] / dx[dx > 0])
    return slope, np.median(y - slope * x)


def local_trend(
    budgets: np.ndarray, values: np.ndarray, window: int, exclude: np.ndarray | None = None
) -> np.ndarray:
    """Robust trend at each budget, estimated from its neighbours only (never from itself).

    For index i: a Theil-Sen line (`theil_sen`, joint intercept) through up to
    `window` neighbours on each side along the sorted budget axis (window + 1 on the open side at
    a curve end), evaluated at budgets[i] and floored by `proportional_floor`; with a single
    neighbour, that neighbour's value; with none, NaN. Points marked in `exclude` serve as no one's
    neighbour (their own trend is still computed). Exact on linear curves with non-negative
    intercept and slope. Output is in input order.
    """
    budgets = np.asarray(budgets, dtype=float)
    values = np.asarray(values, dtype=float)
    if budgets.shape != values.shape or budgets.ndim != 1:
        raise ValueError("budgets and values must be 1-D arrays of the same length")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if len(np.unique(budgets)) != len(budgets):
        raise ValueError("budgets must be unique (median-reduce repeated measurements first)")
    exclude = np.zeros(len(budgets), bool) if exclude is None else np.asarray(exclude, bool)

    order = np.argsort(budgets)
    b, v, allowed = budgets[order], values[order], ~exclude[order]
    trend_sorted = np.full(len(b), np.nan)
    for i in range(len(b)):
        nb = neighbours(allowed, i, window)
        if len(nb) == 0:
            continue
        if len(nb) == 1:
            trend_sorted[i] = v[nb[0]]
            continue
        slope, intercept = theil_sen(b[nb], v[nb])
        trend_sorted[i] = max(intercept + slope * b[i], proportional_floor(b[i], b[nb], v[nb]))

    trend = np.empty(len(b))
    trend[order] = trend_sorted
    return trend


def spike_trend(
    budgets: np.ndarray, values: np.ndarray, window: int, threshold: float
) -> np.ndarray:
    """The higher of two trends: from all neighbours, and from neighbours below threshold.

    One spike among an end budget's few neighbours tilts the extrapolated line and makes the end
    look like a spike too; refitting without budgets that already reach the threshold removes
    that. Taking the higher trend keeps the refit from creating spikes: at the second budget of a
    sustained step the refit would lose the step's first budget and see a spike.
    """
    first = local_trend(budgets, values, window)
    refit = local_trend(budgets, values, window, exclude=values / first >= threshold)
    return np.fmax(first, refit)


def log_ratio_pvalue(ratios: np.ndarray, threshold: float) -> float:
    """One-sided one-sample Student t-test of H0: mean(log ratio) <= log(threshold).

    Timing noise is multiplicative (about lognormal), so log ratios are about normal and the
    t-test has its nominal size at any n >= 2. Rank tests cannot help with 3-4 repeats: the
    smallest one-sided sign/Wilcoxon p-value is 1/2**n = 0.125 at n = 3.
    """
    logs = np.log(ratios)
    if len(logs) < 2:
        return math.nan
    if np.all(logs == logs[0]):  # zero spread: the t statistic is +-inf or undefined
        return 0.0 if logs[0] > math.log(threshold) else 1.0
    res = stats.ttest_1samp(logs, math.log(threshold), alternative="greater")
    return float(res.pvalue)


def curve_ratios(
    reduced: pd.DataFrame, keys: list[str], window: int, threshold: float
) -> pd.DataFrame:
    """Add `trend` and `ratio` to each (group, repeat) curve; `keys` name the curves."""
    parts = []
    for _, curve in reduced.groupby(keys, dropna=False, sort=False):
        curve = curve.sort_values("budget")
        v = curve["_value"].to_numpy(float)
        if len(curve) >= MIN_BUDGETS:
            trend = spike_trend(curve["budget"].to_numpy(float), v, window, threshold)
        else:
            trend = np.full(len(curve), np.nan)
        parts.append(curve.assign(trend=trend, ratio=v / trend))
    return pd.concat(parts, ignore_index=True)


def summarize_budget(
    cell: pd.DataFrame, threshold: float, consistency: float, alpha: float
) -> dict[str, float | int | bool]:
    """Aggregate one group x budget over repeats and apply the spike rule."""
    ratios = cell["ratio"].to_numpy(float)
    ratios = ratios[np.isfinite(ratios)]
    n = len(ratios)
    if n == 0:
        ratio_median = ratio_min = frac_above = math.nan
    else:
        ratio_median, ratio_min = float(np.median(ratios)), float(ratios.min())
        frac_above = float(np.mean(ratios >= threshold))
    p_value = log_ratio_pvalue(ratios, threshold) if n >= 2 else math.nan
    spike = (
        n >= 1
        and ratio_median >= threshold
        and frac_above >= consistency - 1e-12  # frac_above is k / n: 3 / 5 must pass 0.6
        and (n < 3 or p_value < alpha)
    )
    return {
        "value_median": float(cell["_value"].median()),
        "trend_median": float(cell["trend"].median()),
        "ratio_median": ratio_median,
        "ratio_min": ratio_min,
        "frac_above": frac_above,
        "p_value": p_value,
        "n_repeats": n,
        "spike": bool(spike),
    }


def detect_spikes(
    df: pd.DataFrame,
    value: str,
    by: list[str],
    window: int = 2,
    threshold: float = 1.5,
    consistency: float = 1.0,
    alpha: float = 0.05,
) -> pd.DataFrame:
    """Flag budgets whose `value` stands well above the local trend of neighbouring budgets.

    `df` is tidy: columns `by` + `budget` + `repeat` + `value`; several rows per
    (group, budget, repeat) are median-reduced first, NaN values dropped. Per group and repeat,
    ratio = value / spike_trend(...) on that repeat's own curve (`local_trend`, refitted without
    budgets at or above threshold, the higher trend kept). Returns one row per group x budget:
    `by`, budget, metric (= `value`), value_median (over repeats), trend_median, ratio_median,
    ratio_min, frac_above (fraction of repeats with ratio >= threshold), p_value (see
    `log_ratio_pvalue`; NaN below 2 repeats), n_repeats (repeats with a finite ratio) and spike:

        ratio_median >= threshold and frac_above >= consistency
        and (p_value < alpha if n_repeats >= 3)

    A curve with fewer than 3 budgets gets NaN ratios and no spikes.
    """
    by = list(by)
    missing = [c for c in [*by, "budget", "repeat", value] if c not in df.columns]
    if missing:
        raise ValueError(f"detect_spikes: missing columns {missing}")
    if {"budget", "repeat"} & set(by):
        raise ValueError("`by` must not contain 'budget' or 'repeat'")
    if not 0 < consistency <= 1:
        raise ValueError(f"consistency must be in (0, 1], got {consistency}")
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")

    data = df[[*by, "budget", "repeat", value]].rename(columns={value: "_value"})
    data = data[data["_value"].notna()]
    if (data["_value"] <= 0).any():
        raise ValueError(f"detect_spikes: {value!r} must be positive (ratios are taken in logs)")
    if data.empty:
        return pd.DataFrame(columns=[*by, *OUTPUT_COLUMNS])

    cell_keys = [*by, "budget", "repeat"]
    reduced = data.groupby(cell_keys, dropna=False, sort=False)["_value"].median().reset_index()
    ratios = curve_ratios(reduced, [*by, "repeat"], window, threshold)

    rows = []
    for key, cell in ratios.groupby([*by, "budget"], dropna=False, sort=True):
        row = dict(zip([*by, "budget"], key, strict=True))
        row["metric"] = value
        row.update(summarize_budget(cell, threshold, consistency, alpha))
        rows.append(row)
    out = pd.DataFrame(rows, columns=[*by, *OUTPUT_COLUMNS])
    out["n_repeats"] = out["n_repeats"].astype(int)
    out["spike"] = out["spike"].astype(bool)
    return out


SPIKE_BY = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache"]
SPIKE_METRICS = ("total_s", "prefill_s", "decode_s")


def spike_table(proc: pd.DataFrame, rule: SpikeRule, verdict: pd.DataFrame) -> pd.DataFrame:
    """The regimes rule's table: the spike rule on each metric of the per-process runs, every
    finding with its configuration's stability `verdict` (`stability.verdicts`), so that one
    made in an unstable configuration is never a claim."""
    found = [detect_spikes(proc, value=m, by=SPIKE_BY, window=rule.window,
                           threshold=rule.threshold, consistency=rule.consistency,
                           alpha=rule.alpha)
             for m in SPIKE_METRICS]
    return with_verdicts(pd.concat(found, ignore_index=True), verdict, [*SPIKE_BY, "budget"])


def repeat_ratios(
    df: pd.DataFrame, value: str, by: list[str], window: int = 2, threshold: float = 1.5
) -> pd.DataFrame:
    """Per group, budget and repeat: `value`, its `trend` and `ratio`, as `detect_spikes` sees them.

    The same reduction (median over rows of one cell) and the same `spike_trend` as
    `detect_spikes`, before the repeats are aggregated: the unit for paired tests across repeats.
    Columns: `by`, budget, repeat, value (the reduced `value`), trend, ratio.
    """
    by = list(by)
    missing = [c for c in [*by, "budget", "repeat", value] if c not in df.columns]
    if missing:
        raise ValueError(f"repeat_ratios: missing columns {missing}")
    data = df[[*by, "budget", "repeat", value]].rename(columns={value: "_value"})
    data = data[data["_value"].notna()]
    if (data["_value"] <= 0).any():
        raise ValueError(f"repeat_ratios: {value!r} must be positive (ratios are taken in logs)")
    columns = [*by, "budget", "repeat", "value", "trend", "ratio"]
    if data.empty:
        return pd.DataFrame(columns=columns)
    reduced = data.groupby([*by, "budget", "repeat"], dropna=False, sort=False)["_value"]
    ratios = curve_ratios(reduced.median().reset_index(), [*by, "repeat"], window, threshold)
    return ratios.rename(columns={"_value": "value"})[columns]


SUMMARY_BY = ["experiment", "use_cache", "backend", "family", "dtype"]
SUMMARY_COLUMNS = [*SUMMARY_BY, "configs", "spikes", "max_ratio", "max_ratio_model",
                   "max_ratio_budget", "spike_budgets"]


def spike_summary(regimes: pd.DataFrame, metric: str = "total_s") -> pd.DataFrame:
    """Per experiment x cache x backend x family x dtype: configurations tested, spikes flagged,
    and the largest ratio to the local trend (with its model and budget), on `metric`.

    `regimes` is the table `detect_spikes` writes (the `regimes` rule's output). Curves with
    fewer than MIN_BUDGETS budgets have no ratio; a group whose ratios are all NaN reports
    max_ratio NaN and max_ratio_model "--".
    """
    missing = [c for c in [*SUMMARY_BY, "model", "budget", "metric", "ratio_median", "spike"]
               if c not in regimes.columns]
    if missing:
        raise ValueError(f"spike_summary: the regimes table lacks columns {missing}")
    rows = []
    table = regimes[regimes["metric"] == metric]
    for key, g in table.groupby(SUMMARY_BY, dropna=False, sort=True):
        flagged = g[g["spike"].astype(bool)]
        finite = g.dropna(subset=["ratio_median"])
        top = finite.loc[finite["ratio_median"].idxmax()] if len(finite) else None
        rows.append({
            **dict(zip(SUMMARY_BY, key, strict=True)),
            "configs": len(g), "spikes": len(flagged),
            "max_ratio": float(top["ratio_median"]) if top is not None else math.nan,
            "max_ratio_model": str(top["model"]) if top is not None else "--",
            "max_ratio_budget": int(top["budget"]) if top is not None else -1,
            "spike_budgets": " ".join(f"{m}@{int(b)}" for m, b in
                                      zip(flagged["model"], flagged["budget"], strict=True)),
        })
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
