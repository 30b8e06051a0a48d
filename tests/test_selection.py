"""The best configuration chosen on one half of the processes and estimated on the other: under
the null (every configuration 1x) it is almost never distinguishable from 1x while the naive
maximum of medians is above 1 in most builds; one real 1.5x configuration is found and its
interval covers 1.5. Eight to twelve processes: with fewer than four per half no interval can
reach 95% (selection.MIN_PER_HALF)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from decodelab import selection
from decodelab.config import Confidence

CI = Confidence(confidence=0.95, bootstrap_resamples=400, seed=7)  # fewer resamples: 200 seeds
PAIRS, KS = ("cpu-cpu", "cpu-cuda", "cuda-cuda", "cpu-mps"), (1, 2, 3, 4, 6)  # 20 configurations
SEEDS = 160
SIGMA = 0.15  # lognormal noise of one process's median time


def spec_proc(seed: int, processes: int, real: dict | None = None) -> pd.DataFrame:
    """Per-process times (`stats.spec_per_process`'s shape) of the sampled mode: every
    configuration's true speedup is 1, except those in `real` ((pair, k) -> speedup)."""
    rng = np.random.default_rng(seed)
    real = real or {}
    rows = []
    for r in range(processes):
        for pair in PAIRS:
            rows.append({"pair": pair, "repeat": r, "method": "autoregressive", "mode": "sampled",
                         "k": 0, "total_s": float(np.exp(rng.normal(0, SIGMA)))})
            rows += [{"pair": pair, "repeat": r, "method": "speculative", "mode": "sampled",
                      "k": k, "total_s": float(np.exp(rng.normal(0, SIGMA))
                                               / real.get((pair, k), 1.0))} for k in KS]
    return pd.DataFrame(rows)


def sweep_runs(seed: int, processes: int) -> pd.DataFrame:
    """Raw sweep rows, all KV speedups 2x and every budget on a straight line (ratio 1)."""
    rng = np.random.default_rng(seed)
    rows = []
    for r, (experiment, cache), budget in ((r, g, b) for r in range(processes)
                                           for g in (("sweep", True), ("ablation", True),
                                                     ("ablation", False))
                                           for b in (8, 16, 32, 48, 64)):
        total = 0.01 * budget * (1 if cache else 2) * float(np.exp(rng.normal(0, SIGMA)))
        rows.append({"experiment": experiment, "backend": "cpu", "model": "gpt2-tiny",
                     "family": "gpt2", "dtype": "float32", "prompt_len": 32, "use_cache": cache,
                     "budget": budget, "repeat": r, "total_s": total, "prefill_s": 0.1 * total,
                     "decode_s": 0.9 * total, "decode_per_token_s": 0.9 * total / budget})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def null_rows() -> list[dict]:
    return [selection.speculative_best(spec_proc(s, 8 + s % 5), CI) for s in range(SEEDS)]


def test_the_halves_are_odd_and_even_processes():
    assert selection.halves([0, 1, 2, 3, 4]) == ([1, 3], [0, 2, 4])
    assert selection.too_few([1, 3, 5, 7], [0, 2, 4, 6]) == ""
    assert "7 processes" in selection.too_few([1, 3, 5], [0, 2, 4, 6])


def test_under_the_null_the_best_is_not_distinguishable_but_the_naive_maximum_exceeds_1(
        null_rows):
    quiet = np.mean([not r["distinguishable"] for r in null_rows])
    naive_above = np.mean([r["naive"] > 1 for r in null_rows])
    print(f"null: not distinguishable {quiet:.3f}, naive > 1 {naive_above:.3f}")
    assert quiet >= 0.95
    assert naive_above >= 0.9  # the winner's curse: the max of 20 null medians is above 1


def test_the_selection_is_made_on_other_processes_than_the_estimate(null_rows):
    row = null_rows[0]
    assert row["selected_on"] == "processes 1, 3, 5, 7"
    assert row["estimated_on"] == "processes 0, 2, 4, 6" and row["n"] == 4


def test_one_real_configuration_is_found_and_its_interval_covers_the_truth():
    rows = [selection.speculative_best(spec_proc(s, 8 + s % 5, {("cpu-cuda", 3): 1.5}), CI)
            for s in range(SEEDS)]
    found = np.mean([r["label"] == "cpu-cuda, sampled, K = 3" for r in rows])
    covered = np.mean([r["ci_low"] <= 1.5 <= r["ci_high"] for r in rows])
    apart = np.mean([r["distinguishable"] for r in rows])
    print(f"1.5x: found {found:.3f}, covered {covered:.3f}, distinguishable {apart:.3f}")
    assert found >= 0.9 and covered >= 0.9 and apart >= 0.7
    estimates = np.array([r["estimate"] for r in rows if r["label"].startswith("cpu-cuda")])
    assert abs(np.median(np.log(estimates / 1.5))) < 0.05  # unbiased: not inflated by the choice


def test_too_few_processes_are_said_and_never_distinguishable():
    row = selection.speculative_best(spec_proc(0, 7, {("cpu-cuda", 3): 3.0}), CI)
    assert not row["distinguishable"] and np.isnan(row["estimate"])
    assert row["reason"] == ("7 processes per configuration, fewer than the 8 needed to choose "
                             "on one half and estimate on the other")
    assert row["naive"] > 2  # the real 3x is there, but too few processes to claim it


def test_the_table_has_a_row_per_claim_from_raw_sweeps():
    runs = sweep_runs(1, 8)
    table = selection.selection_table(runs, spec_proc(1, 8), {"window": 2, "threshold": 1.5}, CI)
    assert list(table.columns) == selection.COLUMNS
    assert list(table["claim"]) == ["speculative_best", "kv_best", "spike_largest"]
    kv = table.set_index("claim").loc["kv_best"]
    assert kv["distinguishable"] and kv["ci_low"] < 2 < kv["ci_high"]
    spike = table.set_index("claim").loc["spike_largest"]  # straight lines: no excursion
    assert spike["label"].startswith("cpu, gpt2-tiny") and not spike["distinguishable"]
    assert spike["naive"] > spike["estimate"]


def test_a_stage_that_measured_nothing_has_no_row():
    runs = sweep_runs(1, 8)
    table = selection.selection_table(runs[runs["experiment"] == "sweep"], pd.DataFrame(),
                                      {"window": 2, "threshold": 1.5}, CI)
    assert list(table["claim"]) == ["spike_largest"]


# -----------------------------------------------------------------------------
# few processes: the split inside every process, over its cells

def spec_cells(seed: int, processes: int, prompts: int, real: dict | None = None
               ) -> pd.DataFrame:
    """`selection.spec_cells`'s shape: a time per process, configuration and prompt, with a
    factor per process (its machine state) and one per prompt (its length) that every
    configuration shares, and each measurement's own noise."""
    rng = np.random.default_rng(seed)
    real = real or {}
    process = np.exp(rng.normal(0, 0.1, processes))
    prompt = np.exp(rng.normal(0, 0.2, prompts))
    rows = []
    for r, c, pair in ((r, c, p) for r in range(processes) for c in range(prompts)
                       for p in PAIRS):
        for method, k in [("autoregressive", 0), *(("speculative", k) for k in KS)]:
            total = process[r] * prompt[c] * np.exp(rng.normal(0, SIGMA))
            rows.append({"pair": pair, "repeat": r, "cell": c, "method": method,
                         "mode": "sampled", "k": k,
                         "total_s": float(total / real.get((pair, k), 1.0))})
    return pd.DataFrame(rows)


def test_with_three_processes_the_prompts_split_and_the_null_stays_indistinguishable():
    rows = [selection.speculative_best(spec_cells(s, 3, 4), CI) for s in range(SEEDS)]
    assert rows[0]["selected_on"] == "prompts 1, 3 of each of 3 processes"
    assert rows[0]["estimated_on"] == "prompts 0, 2 of each of 3 processes"
    assert rows[0]["n"] == 6
    quiet = np.mean([not r["distinguishable"] for r in rows])
    naive_above = np.mean([r["naive"] > 1 for r in rows])
    print(f"null, 3 processes x 4 prompts: not distinguishable {quiet:.3f}, naive > 1 "
          f"{naive_above:.3f}")
    assert quiet >= 0.95 and naive_above >= 0.9


def test_with_three_processes_one_real_configuration_is_found_and_covered():
    rows = [selection.speculative_best(spec_cells(s, 3, 4, {("cpu-cuda", 3): 1.5}), CI)
            for s in range(SEEDS)]
    found = np.mean([r["label"] == "cpu-cuda, sampled, K = 3" for r in rows])
    covered = np.mean([r["ci_low"] <= 1.5 <= r["ci_high"] for r in rows])
    apart = np.mean([r["distinguishable"] for r in rows])
    print(f"1.5x, 3 processes x 4 prompts: found {found:.3f}, covered {covered:.3f}, "
          f"distinguishable {apart:.3f}")
    # Less power than 8-12 processes give (0.46 here): 6 estimating units, the prompts'
    # own spread in both arms.
    assert found >= 0.9 and covered >= 0.9 and apart >= 0.4
    estimates = np.array([r["estimate"] for r in rows if r["label"].startswith("cpu-cuda")])
    assert abs(np.median(np.log(estimates / 1.5))) < 0.05


def test_with_three_processes_the_sweeps_split_their_inner_repeats():
    runs = pd.concat([sweep_runs(seed, 3).assign(repeat=r, inner=i)
                      for r, i, seed in ((r, i, 10 * r + i) for r in range(3) for i in range(3))],
                     ignore_index=True)
    table = selection.selection_table(runs, pd.DataFrame(), {"window": 2, "threshold": 1.5}, CI)
    kv = table.set_index("claim").loc["kv_best"]
    assert kv["estimated_on"] == "inner repeats 0, 2 of each of 3 processes" and kv["n"] == 6
    assert kv["distinguishable"] and kv["ci_low"] < 2 < kv["ci_high"]
    spike = table.set_index("claim").loc["spike_largest"]
    assert spike["selected_on"] == "inner repeats 1 of each of 3 processes"
    assert not spike["distinguishable"]  # straight lines: no excursion
    one_prompt = selection.speculative_best(spec_cells(0, 3, 1), CI)  # nothing to split
    assert "3 processes per configuration, fewer than the 8" in one_prompt["reason"]
