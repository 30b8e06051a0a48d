"""Change points along the budget axis (ruptures' PELT), beside the regime rule's local ratios.

The ratio rule finds isolated spikes; a regime shift that persists (latency per token steps up
and stays) is invisible to it past its first budget. Change-point detection finds those. Per
curve (experiment, backend, model, dtype, prompt, cache) the signal is the decode latency per
token at each budget, averaged over processes, fitted piecewise by weighted least squares
(ruptures' CostLinear with the weights folded into signal and covariates):

    model "constant": piecewise constant in budget     (covariate 1)
    model "linear":   piecewise linear in budget       (covariates 1, budget)

Per token, cache-on decoding is about flat in budget and cache-off decoding (the whole sequence
re-run each step) about linear, so "linear" fits both without detrending; "constant" suits
flat curves only.

Timing noise is multiplicative, so the standard error of budget i's mean is s * mean_i, where s
is the relative noise of a mean: the pooled sd of the processes' log values around each budget's
mean, over sqrt(processes), floored at noise_floor (so three nearly identical processes do not
make every wiggle a change point). It is estimated from the replication, not from the curve.
Weighting each budget by 1 / (s * mean_i) puts the cost in chi-square units, so

    PELT (jump 1, min_size), penalty = penalty_factor * log(n_budgets)

is a BIC-like penalty per change point. A change point is the budget where a new segment starts.

Agreement with the rule: a flagged spike at budget b "coincides" with change detection when a
change point sits at b (where it starts) or at the next budget (where it ends).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import ruptures as rpt

CURVE = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache"]
MODELS = ("constant", "linear")
MIN_SIZE = {"constant": 2, "linear": 3}  # points for a segment to have a residual
POINT_COLUMNS = [*CURVE, "budget", "signal", "segment", "changepoint", "spike", "coincides"]
CURVE_COLUMNS = [*CURVE, "budgets", "sigma", "penalty", "changepoints", "changepoint_budgets",
                 "status"]
AGREEMENT_BY = ["experiment", "use_cache", "backend"]
AGREEMENT_COLUMNS = [*AGREEMENT_BY, "curves", "changepoints", "curves_with_changepoint",
                     "spikes", "spikes_coinciding", "changepoints_at_spikes"]


def check_settings(model: str, penalty_factor: float, min_size: int, noise_floor: float) -> None:
    if model not in MODELS:
        raise ValueError(f"changepoint model must be one of {MODELS}, got {model!r}")
    if not penalty_factor > 0:
        raise ValueError(f"changepoint penalty must be > 0, got {penalty_factor}")
    if min_size < MIN_SIZE[model]:
        raise ValueError(f"changepoint min_size {min_size} is too small for model {model!r} "
                         f"(a segment needs {MIN_SIZE[model]} points to have a residual)")
    if not noise_floor >= 0:
        raise ValueError(f"changepoint noise floor must be >= 0, got {noise_floor}")


def relative_noise(logs_by_budget: list[np.ndarray], floor: float) -> float:
    """Relative standard error of a budget's mean: pooled sd of log values / sqrt(processes)."""
    resid = [g - g.mean() for g in logs_by_budget if len(g) >= 2]
    dof = sum(len(g) - 1 for g in resid)
    if dof == 0:
        return floor
    pooled = sum(float(np.sum(r**2)) for r in resid) / dof
    processes = np.mean([len(g) for g in logs_by_budget])
    return max(math.sqrt(pooled / processes), floor)


def detect(budgets: np.ndarray, signal: np.ndarray, rel_noise: float, model: str,
           penalty_factor: float, min_size: int) -> list[int]:
    """Indices (into the sorted budgets) at which a new segment starts."""
    n = len(signal)
    if n < 2 * min_size:
        return []
    weight = 1.0 / (rel_noise * np.asarray(signal, float))
    covariates = [np.ones(n)]
    if model == "linear":
        covariates.append(np.asarray(budgets, float) / max(budgets))
    data = np.column_stack([signal * weight, *(c * weight for c in covariates)])
    algo = rpt.Pelt(model="linear", min_size=min_size, jump=1).fit(data)
    ends = algo.predict(pen=penalty_factor * math.log(n))
    return [int(e) for e in ends[:-1]]


def curve_changepoints(curve: pd.DataFrame, metric: str, model: str, penalty_factor: float,
                       min_size: int, noise_floor: float) -> tuple[pd.DataFrame, dict]:
    """One curve's per-process rows -> per-budget points and a one-row summary."""
    values = {b: g[metric].to_numpy(float) for b, g in curve.groupby("budget")}
    budgets = np.array(sorted(values), float)
    signal = np.array([values[b].mean() for b in budgets])
    rel_noise = relative_noise([np.log(values[b]) for b in budgets], noise_floor)
    status = "ok"
    if len(budgets) < 2 * min_size:
        status = f"not applicable: fewer than {2 * min_size} budgets"
    starts = detect(budgets, signal, rel_noise, model, penalty_factor, min_size)
    segment = np.searchsorted(starts, np.arange(len(budgets)), side="right")
    points = pd.DataFrame({"budget": budgets.astype(int), "signal": signal, "segment": segment,
                           "changepoint": np.isin(np.arange(len(budgets)), starts)})
    summary = {"budgets": len(budgets), "sigma": rel_noise,
               "penalty": penalty_factor * math.log(max(len(budgets), 2)),
               "changepoints": len(starts),
               "changepoint_budgets": " ".join(str(int(budgets[i])) for i in starts),
               "status": status}
    return points, summary


def mark_agreement(points: pd.DataFrame) -> pd.DataFrame:
    """`coincides`: a spike with a change point at its budget or at the next one."""
    points = points.sort_values("budget").copy()
    cp = points["changepoint"].to_numpy(bool)
    after = np.r_[cp[1:], False]
    points["coincides"] = points["spike"].to_numpy(bool) & (cp | after)
    return points


def find_changepoints(per_process: pd.DataFrame, regimes: pd.DataFrame, model: str,
                      penalty_factor: float, min_size: int, noise_floor: float,
                      metric: str = "decode_per_token_s",
                      spike_metric: str = "total_s") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(points, curves): per curve and budget, the signal, segment, change point, the rule's
    spike (on `spike_metric`) and agreement; per curve, sigma, penalty and change points."""
    check_settings(model, penalty_factor, min_size, noise_floor)
    missing = [c for c in [*CURVE, "budget", "repeat", metric] if c not in per_process.columns]
    if missing:
        raise ValueError(f"changepoints: the runs lack columns {missing}")
    if (per_process[metric].dropna() <= 0).any():
        raise ValueError(f"changepoints: {metric!r} must be positive (taken in logs)")
    rule = regimes[regimes["metric"] == spike_metric][[*CURVE, "budget", "spike"]]
    point_parts, curve_rows = [], []
    for key, curve in per_process.dropna(subset=[metric]).groupby(CURVE, sort=True):
        points, summary = curve_changepoints(curve, metric, model, penalty_factor, min_size,
                                             noise_floor)
        points = points.assign(**dict(zip(CURVE, key, strict=True)))
        flagged = rule[np.logical_and.reduce([rule[k] == v for k, v in
                                              zip(CURVE, key, strict=True)])]
        points["spike"] = points["budget"].isin(flagged.loc[flagged["spike"].astype(bool),
                                                            "budget"])
        point_parts.append(mark_agreement(points))
        curve_rows.append({**dict(zip(CURVE, key, strict=True)), **summary})
    points = (pd.concat(point_parts, ignore_index=True)[POINT_COLUMNS] if point_parts
              else pd.DataFrame(columns=POINT_COLUMNS))
    return points, pd.DataFrame(curve_rows, columns=CURVE_COLUMNS)


def agreement(points: pd.DataFrame) -> pd.DataFrame:
    """Per experiment x cache x backend: change points, spikes, and how often they coincide."""
    rows = []
    for key, g in points.groupby(AGREEMENT_BY, sort=True):
        curves = g.groupby(CURVE)["changepoint"].any()
        cp = g["changepoint"].to_numpy(bool)
        spike = g["spike"].to_numpy(bool)
        rows.append({**dict(zip(AGREEMENT_BY, key, strict=True)), "curves": len(curves),
                     "changepoints": int(cp.sum()), "curves_with_changepoint": int(curves.sum()),
                     "spikes": int(spike.sum()), "spikes_coinciding": int(g["coincides"].sum()),
                     "changepoints_at_spikes": int((cp & spike).sum())})
    return pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)
