"""The batched-speculation study's tables (raw rows: `decodelab.studies.batched.run`), a run (one
prompt
set of one process) the unit that the bootstrap resamples:

- throughput: per mode, batch size and context, tokens per second over the batch and, run by
  run on the same prompts, the ratio to batched autoregressive decoding, to synchronized
  self-speculation (every row the same K) and to the non-synchronized batch (for the refreshed
  mode: refresh against none);
- costs: where speculation stops paying as the batch grows. From the forward timings, measured
  and fitted (`scheduler.CostModel`, the model the scheduler used), the verification overhead
  t_verify(B, L, K+1) / t_draft(B, L), a K+1-token forward over a one-token one, and the ceiling
  (K+1) / overhead: the speedup of a draft that costs nothing and is always accepted. Below 1,
  no acceptance makes speculation pay: verification is no longer nearly free;
- simulator: the scheduler alone (`batchsim`) at every batch size and context, on the fitted
  costs with a draft that reads only its view: a one-token forward over kv_budget cached tokens
  (`sparse_draft`; this executor's masked draft reads the whole cache), adaptive K over the
  best fixed synchronized K >= 1 in hindsight, for requests whose acceptances differ, switch,
  or are all alike (the negative control: a gain near 1); beside it, the best fixed K over
  autoregressive decoding on the same costs (below 1: on these costs no schedule of
  speculation pays).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from decodelab.analysis import stats
from decodelab.config.settings import Confidence
from decodelab.engines.scheduler import CostModel, fitted_cost
from decodelab.studies.batched import sim as batchsim

KEYS = ["backend", "batch", "context", "k"]
# Each mode's paired ratio to these modes: (its column, the interval's columns).
REFERENCES = {"autoregressive": ("speedup", "ci_low", "ci_high"),
              "self_synchronized": ("over_synchronized", "sync_ci_low", "sync_ci_high"),
              "unsynchronized": ("over_unsynchronized", "unsync_ci_low", "unsync_ci_high")}
THROUGHPUT_COLUMNS = [*KEYS, "mode", "tokens_per_s",
                      *(c for cols in REFERENCES.values() for c in cols), "acceptance",
                      "refresh_layer", "n"]
COST_COLUMNS = [*KEYS, "forward_s", "verify_s", "verify_tokens", "measured_overhead",
                "t_draft", "t_verify", "overhead", "ceiling"]
SIMULATOR_COLUMNS = [*KEYS, "scenario", "gain", "ci_low", "ci_high", "best_fixed_k",
                     "adaptive_tokens_per_s", "fixed_tokens_per_s", "fixed_over_autoregressive",
                     "seeds"]
# Requests of the simulator: per-token acceptances of two regimes and the chance of a switch.
SCENARIOS = {
    "mixed": lambda i: batchsim.Request((0.95, 0.95) if i % 2 else (0.2, 0.2)),
    "switching": lambda i: batchsim.Request((0.95, 0.2), switch=0.1),
    "alike": lambda i: batchsim.Request((0.6, 0.6)),  # the negative control
}
SEEDS, ROUNDS = 5, 60  # simulated seeds; the horizon in synchronized rounds of K


def mean_ci(x: np.ndarray, ci: Confidence) -> tuple[float, float, float]:
    """One run gives no interval: NaN, not a zero-width one."""
    return stats.mean_ci(x, ci, least=2)


def throughput_table(runs: pd.DataFrame, ci: Confidence) -> pd.DataFrame:
    run_keys = [*KEYS, "process", "round"]
    by_run = runs.pivot_table(index=run_keys, columns="mode", values="tokens_per_s")
    rows = []
    for key, g in runs.groupby([*KEYS, "mode"]):
        row = dict(zip([*KEYS, "mode"], key, strict=True))
        paired = by_run.xs(key[:-1], level=KEYS, drop_level=False)
        mode = paired[row["mode"]].to_numpy(dtype=float)
        for reference, columns in REFERENCES.items():
            ratio = mean_ci(mode / paired[reference].to_numpy(dtype=float), ci) \
                if reference in paired else (np.nan,) * 3
            row.update(zip(columns, ratio, strict=True))
        refresh = g["refresh_layer"].max() if "refresh_layer" in g else np.nan
        rows.append({**row, "tokens_per_s": float(g["tokens_per_s"].median()),
                     "acceptance": float(g["acceptance"].mean()), "refresh_layer": refresh,
                     "n": len(g)})
    return pd.DataFrame(rows, columns=THROUGHPUT_COLUMNS)


def fits(costs: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, CostModel]]:
    """Per backend: the median forward over processes per batch, context and tokens per row,
    and the cost model fitted to them (the scheduler's)."""
    medians = costs.groupby(["backend", "batch", "context", "tokens"])["seconds"].median() \
        .reset_index()
    return {backend: (g, fitted_cost(g.to_dict("records")))
            for backend, g in medians.groupby("backend")}


def cost_table(fitted: dict, k: int) -> pd.DataFrame:
    rows = []
    for backend, (b_costs, fit) in fitted.items():
        for (batch, context), g in b_costs.groupby(["batch", "context"]):
            one = float(g.loc[g["tokens"] == 1, "seconds"].median())
            widest = g.loc[g["tokens"].idxmax()]
            t_draft, t_verify = fit.t_draft(batch, context), fit.t_verify(batch, context, k + 1)
            overhead = t_verify / t_draft
            rows.append({"backend": backend, "batch": batch, "context": context, "k": k,
                         "forward_s": one, "verify_s": float(widest["seconds"]),
                         "verify_tokens": int(widest["tokens"]),
                         "measured_overhead": float(widest["seconds"]) / one,
                         "t_draft": t_draft, "t_verify": t_verify, "overhead": overhead,
                         "ceiling": (k + 1) / overhead})
    return pd.DataFrame(rows, columns=COST_COLUMNS)


def sparse_draft(fit: CostModel, kv_budget: float) -> CostModel:
    """The fitted costs with a draft forward of one token per row over a view of `kv_budget`
    tokens, whatever the context: what a sparse-attention kernel would cost."""
    v0, v1, v2 = fit.verify
    return CostModel(draft=(v0, v1 + v2 * kv_budget, 0.0), verify=fit.verify)


def simulated(cost, batch: int, context: float, k: int, scenario: str, seed: int):
    """(best fixed K >= 1, its throughput, adaptive throughput, autoregressive throughput); NaN
    where the fit is not positive at this shape (simulated time would not advance)."""
    if min(cost.t_draft(batch, context), cost.t_verify(batch, context, 1)) <= 0:
        return (np.nan,) * 4
    requests = [SCENARIOS[scenario](i) for i in range(batch)]
    horizon = ROUNDS * (k * cost.t_draft(batch, context) + cost.t_verify(batch, context, k + 1))
    k_fixed, fixed = batchsim.best_fixed(requests, cost, context, horizon, seed, 2 * k, k_min=1)
    adaptive = batchsim.adaptive(requests, cost, context, horizon, seed, 2 * k)
    autoregressive = batchsim.synchronized(requests, 0, cost, context, horizon, seed)
    return k_fixed, fixed.throughput, adaptive.throughput, autoregressive.throughput


def simulator_table(fitted: dict, k: int, kv_budget: float, ci: Confidence) -> pd.DataFrame:
    rows = []
    for backend, (b_costs, fit) in fitted.items():
        fit = sparse_draft(fit, kv_budget)
        for (batch, context), _ in b_costs.groupby(["batch", "context"]):
            for scenario in SCENARIOS:
                sims = [simulated(fit, int(batch), float(context), k, scenario, seed)
                        for seed in range(SEEDS)]
                ks, fixed, adaptive, ar = (np.array(x, dtype=float)
                                           for x in zip(*sims, strict=True))
                gain = mean_ci(adaptive / fixed, ci)
                rows.append({"backend": backend, "batch": batch, "context": context, "k": k,
                             "scenario": scenario, "gain": gain[0], "ci_low": gain[1],
                             "ci_high": gain[2], "best_fixed_k": float(np.median(ks)),
                             "adaptive_tokens_per_s": float(adaptive.mean()),
                             "fixed_tokens_per_s": float(fixed.mean()),
                             "fixed_over_autoregressive": float(np.mean(fixed / ar)),
                             "seeds": SEEDS})
    return pd.DataFrame(rows, columns=SIMULATOR_COLUMNS)


def tables(runs: pd.DataFrame, costs: pd.DataFrame, ci: Confidence) -> dict[str, pd.DataFrame]:
    """The group's tables (`decodelab.core.tables`, group batched); no runs give them empty."""
    if not len(runs):
        return {"throughput": pd.DataFrame(columns=THROUGHPUT_COLUMNS),
                "costs": pd.DataFrame(columns=COST_COLUMNS),
                "simulator": pd.DataFrame(columns=SIMULATOR_COLUMNS)}
    k, kv_budget = int(runs["k"].iloc[0]), int(runs["kv_budget"].iloc[0])
    fitted = fits(costs)
    return {"throughput": throughput_table(runs, ci), "costs": cost_table(fitted, k),
            "simulator": simulator_table(fitted, k, kv_budget, ci)}
