"""Regime analysis in depth: spike summary, phase attribution, variance decomposition, memory
correlation and change points, each with the negative control it must pass."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from decodelab.analysis import changepoints as cp
from decodelab.analysis import stability, variance
from decodelab.analysis.regimes import detect_spikes, repeat_ratios, spike_summary, spike_table
from decodelab.analysis.stats import SWEEP, per_process
from decodelab.config.settings import SpikeRule, Stability
from decodelab.studies.sweep import memory, onsets, phases

BUDGETS = [8, 16, 24, 32, 48, 64, 96, 128, 160, 192]
BY = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache"]
MEM = ["mem_cuda_peak_bytes", "mem_mps_current_bytes", "mem_mps_driver_bytes", "rss_bytes"]


def raw_runs(seed: int = 0, repeats: int = 4, inner: int = 2, noise: float = 0.04,
             decode_spikes: dict[int, float] | None = None,
             prefill_spikes: dict[int, float] | None = None,
             step: tuple[int, float] | None = None, process_sd: float = 0.0,
             backend: str = "mps", models: tuple[str, ...] = ("gpt2-x",)) -> pd.DataFrame:
    """Raw rows as `collect` writes them: per model x repeat x budget x inner.

    decode_spikes / prefill_spikes multiply that phase at a budget index in every repeat; `step`
    (index, factor) multiplies decode per token from that index on; process_sd is the sd of a
    per-process log offset shared by all its configurations.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for model in models:
        for r in range(repeats):
            offset = rng.normal(0, process_sd)
            for i, budget in enumerate(BUDGETS):
                factor = (step[1] if step and i >= step[0] else 1.0)
                for k in range(inner):
                    e = np.exp(offset + rng.normal(0, noise, 2))
                    prefill = 0.02 * e[0] * (prefill_spikes or {}).get(i, 1.0)
                    per_token = 0.003 * factor * e[1] * (decode_spikes or {}).get(i, 1.0)
                    decode = per_token * (budget - 1)
                    rows.append({
                        "experiment": "sweep", "backend": backend, "model": model,
                        "family": model.split("-")[0], "dtype": "float32", "prompt_len": 32,
                        "use_cache": True, "budget": budget, "repeat": r, "inner": k,
                        "prefill_s": prefill, "decode_s": decode, "total_s": prefill + decode,
                        "decode_per_token_s": per_token,
                        "step_s": per_token * np.exp(rng.normal(0, noise, budget - 1)),
                        "mem_cuda_peak_bytes": np.nan,
                        "mem_mps_current_bytes": 2**30 * (1 + budget / 100),
                        "mem_mps_driver_bytes": 2**30 * (2 + budget / 100),
                        "rss_bytes": 2**30 * (0.5 + budget / 400)})
    return pd.DataFrame(rows)


def rule(runs: pd.DataFrame) -> pd.DataFrame:
    """The regimes rule's table, its verdicts at the default limits."""
    spec = SpikeRule(window=2, threshold=1.5, consistency=1.0, alpha=0.05)
    return spike_table(per_process(runs), spec, stability.verdicts(runs, SWEEP, Stability()))


# -----------------------------------------------------------------------------
# spike summary

def test_repeat_ratios_agree_with_detect_spikes():
    runs = per_process(raw_runs(decode_spikes={5: 8.0}))
    per_repeat = repeat_ratios(runs, "total_s", BY)
    table = detect_spikes(runs, "total_s", BY)
    medians = per_repeat.groupby("budget")["ratio"].median().to_numpy()
    np.testing.assert_allclose(medians, table.sort_values("budget")["ratio_median"])


def test_spike_summary_counts_and_largest_ratio():
    runs = pd.concat([raw_runs(decode_spikes={5: 8.0}, models=("gpt2-a",)),
                      raw_runs(seed=1, models=("opt-b",))], ignore_index=True)
    summary = spike_summary(rule(runs)).set_index("family")
    assert summary.loc["gpt2", "configs"] == len(BUDGETS)
    assert summary.loc["gpt2", "spikes"] == 1 and summary.loc["opt", "spikes"] == 0
    assert summary.loc["gpt2", "max_ratio_budget"] == BUDGETS[5]
    assert 4 < summary.loc["gpt2", "max_ratio"] < 12
    assert summary.loc["opt", "max_ratio"] < 1.5
    assert summary.loc["gpt2", "spike_budgets"] == f"gpt2-a@{BUDGETS[5]}"


def test_spike_summary_names_missing_columns():
    with pytest.raises(ValueError, match="lacks columns"):
        spike_summary(pd.DataFrame({"backend": ["cpu"]}))


# -----------------------------------------------------------------------------
# prefill vs decode

@pytest.mark.parametrize("seed", range(5))
def test_planted_decode_spike_is_attributed_to_decode(seed):
    runs = raw_runs(seed, decode_spikes={4: 6.0})
    out = phases.attribute_spikes(per_process(runs), rule(runs), 2, 1.5, 0.05)
    spikes = out[out["scope"] == "spike"]
    assert list(spikes["budget"]) == [BUDGETS[4]]
    row = spikes.iloc[0]
    assert row["decision"] == "decode" and row["p_decode"] < 0.05
    assert row["ratio_decode"] > 4 and row["ratio_prefill"] < 1.3
    assert row["decode_share"] > 0.9


@pytest.mark.parametrize("seed", range(5))
def test_negative_control_prefill_spike_is_not_called_decode(seed):
    # A prefill excess large enough to flag total latency at a small budget (where prefill
    # dominates): the test must point at prefill, never at decode.
    runs = raw_runs(seed, prefill_spikes={1: 12.0})
    out = phases.attribute_spikes(per_process(runs), rule(runs), 2, 1.5, 0.05)
    spikes = out[out["scope"] == "spike"]
    assert len(spikes) == 1
    assert spikes.iloc[0]["decision"] == "prefill"
    assert spikes.iloc[0]["decode_share"] < 0.2


def test_smooth_curves_give_not_applicable_not_a_p_value():
    runs = raw_runs(3)
    out = phases.attribute_spikes(per_process(runs), rule(runs), 2, 1.5, 0.05)
    assert list(out["scope"]) == ["backend"]
    assert out.iloc[0]["decision"] == phases.NOT_APPLICABLE
    assert out.iloc[0]["spikes"] == 0 and np.isnan(out.iloc[0]["p_decode"])


def test_pooled_row_uses_one_unit_per_spike():
    runs = raw_runs(2, decode_spikes={3: 6.0, 6: 6.0})
    out = phases.attribute_spikes(per_process(runs), rule(runs), 2, 1.5, 0.05)
    pooled = out[out["scope"] == "backend"].iloc[0]
    assert pooled["spikes"] == 2 and pooled["n"] == 2 and pooled["decision"] == "decode"


def test_paired_log_test_directions():
    t, up, down = phases.paired_log_test(np.array([5.0, 6.0, 7.0]), np.array([1.0, 1.1, 0.9]))
    assert t > 0 and up < 0.01 and down > 0.99
    assert np.isnan(phases.paired_log_test(np.array([5.0]), np.array([1.0]))[1])


# -----------------------------------------------------------------------------
# variance between and within processes

def anova_groups(seed: int, between_sd: float, k: int = 6, n: int = 4) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(rng.normal(0, between_sd), 0.05, n) for _ in range(k)]


def test_planted_process_offsets_give_a_high_between_share():
    shares = [variance.one_way_anova(anova_groups(s, 0.2))["share_between"] for s in range(30)]
    pvals = [variance.one_way_anova(anova_groups(s, 0.2))["p_value"] for s in range(30)]
    assert np.median(shares) > 0.8
    assert np.mean(np.array(pvals) < 0.05) > 0.9


def test_negative_control_iid_noise_gives_a_low_between_share():
    res = [variance.one_way_anova(anova_groups(s, 0.0)) for s in range(200)]
    assert np.median([r["share_between"] for r in res]) < 0.1
    rejections = np.mean([r["p_value"] < 0.05 for r in res])
    assert rejections < 0.1  # the F-test keeps about its level under H0


def test_anova_matches_the_textbook_balanced_case():
    groups = [np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([5.0, 6.0])]
    out = variance.one_way_anova(groups)
    # MSB = 2 * ((1.5-3.5)^2 + 0 + (5.5-3.5)^2) / 2 = 8, MSW = 0.5, n0 = 2
    assert out["var_within"] == pytest.approx(0.5)
    assert out["var_between"] == pytest.approx((8 - 0.5) / 2)
    assert out["f_stat"] == pytest.approx(16)


def test_single_inner_repeat_is_not_separable():
    out = variance.one_way_anova([np.array([1.0]), np.array([2.0]), np.array([3.0])])
    assert out["status"].startswith("not separable") and np.isnan(out["share_between"])
    assert variance.one_way_anova([np.array([1.0, 2.0])])["status"].startswith("not separable")


def test_decompose_on_runs_and_summary():
    offsets = variance.decompose(raw_runs(0, repeats=5, inner=3, process_sd=0.2))
    iid = variance.decompose(raw_runs(0, repeats=5, inner=3))
    hi = variance.summarize(offsets, 0.05).set_index("metric").loc["total_s"]
    lo = variance.summarize(iid, 0.05).set_index("metric").loc["total_s"]
    assert hi["separable"] == len(BUDGETS) and hi["share_pooled"] > 0.8
    assert lo["share_pooled"] < 0.3
    one = variance.decompose(raw_runs(0, inner=1))
    assert one["status"].str.startswith("not separable").all()
    assert variance.summarize(one, 0.05)["separable"].eq(0).all()


# -----------------------------------------------------------------------------
# memory

def memory_runs(seed: int, linked: bool) -> pd.DataFrame:
    """Spikes at random budgets; with `linked`, driver memory carries the same excess."""
    rng = np.random.default_rng(seed)
    runs = raw_runs(seed, repeats=3, inner=1, models=("gpt2-a", "opt-b", "bloom-c"))
    keys = runs[["model", "budget"]].drop_duplicates()
    excess = pd.Series(np.exp(rng.normal(0, 0.5, len(keys))),
                       index=pd.MultiIndex.from_frame(keys))
    factor = excess.loc[list(zip(runs["model"], runs["budget"], strict=True))].to_numpy()
    runs["decode_s"] *= factor
    runs["total_s"] = runs["prefill_s"] + runs["decode_s"]
    jitter = np.exp(rng.normal(0, 0.5, len(keys)))  # memory noise unrelated to latency
    other = pd.Series(jitter, index=excess.index)
    driver = excess if linked else other
    runs["mem_mps_driver_bytes"] = 2**30 * driver.loc[
        list(zip(runs["model"], runs["budget"], strict=True))].to_numpy()
    return runs


def test_planted_memory_linked_excess_is_correlated():
    out = memory.memory_correlation(per_process_mem(memory_runs(0, linked=True)), 2, 1.5)
    row = out.set_index("column").loc["mem_mps_driver_bytes"]
    assert row["status"] == "ok" and row["rho"] > 0.6 and row["p_value"] < 1e-4
    assert row["r2"] > 0.3


def test_negative_control_unlinked_excess_is_not_correlated():
    pvals = []
    for seed in range(20):
        out = memory.memory_correlation(per_process_mem(memory_runs(seed, linked=False)), 2, 1.5)
        row = out.set_index("column").loc["mem_mps_driver_bytes"]
        pvals.append(row["p_value"])
        assert row["r2"] < 0.3
    assert np.mean(np.array(pvals) < 0.05) <= 0.15


def test_missing_and_constant_memory_columns_say_so():
    runs = raw_runs(0)
    runs["rss_bytes"] = 1e9
    out = memory.memory_correlation(per_process_mem(runs), 2, 1.5).set_index("column")
    assert out.loc["mem_cuda_peak_bytes", "status"].startswith("not applicable: not recorded")
    assert out.loc["rss_bytes", "status"] == "not applicable: memory constant"
    assert out.loc["mem_mps_driver_bytes", "status"] == "ok"
    assert out.loc[out["status"] != "ok", ["rho", "p_value", "r2"]].isna().all().all()


def per_process_mem(runs: pd.DataFrame) -> pd.DataFrame:
    return runs.groupby([*BY, "budget", "repeat"], as_index=False)[
        ["total_s", "prefill_s", "decode_s", *MEM]].median()


# -----------------------------------------------------------------------------
# change points

SETTINGS = {"model": "linear", "penalty_factor": 6.0, "min_size": 3, "noise_floor": 0.01}


@pytest.mark.parametrize("seed", range(10))
def test_planted_step_is_found_where_it_starts(seed):
    runs = raw_runs(seed, step=(5, 2.0))
    points, curves = cp.find_changepoints(per_process(runs), rule(runs), **SETTINGS)
    assert curves.iloc[0]["changepoint_budgets"] == str(BUDGETS[5])


@pytest.mark.slow  # 40 seeds x 2 models: fewer would weaken the false-alarm bound
def test_negative_control_smooth_noise_has_no_change_point():
    found = []
    for seed in range(40):
        processes = per_process(raw_runs(seed, noise=0.06))  # the same curves for both models
        spikes = detect_spikes(processes, "total_s", BY)  # the rule's metric that is compared
        for model, min_size in (("linear", 3), ("constant", 2)):
            settings = {**SETTINGS, "model": model, "min_size": min_size}
            _, curves = cp.find_changepoints(processes, spikes, **settings)
            found += [(seed, model, b) for b in curves["changepoint_budgets"] if b]
    assert len(found) <= 2, found  # about a 2.5% false-alarm rate per curve at most


def test_cache_off_growth_is_not_a_change_point_for_the_linear_model():
    runs = raw_runs(4)
    runs["decode_per_token_s"] *= (32 + runs["budget"]) / 40  # re-running the whole sequence
    _, curves = cp.find_changepoints(per_process(runs), rule(runs), **SETTINGS)
    assert curves.iloc[0]["changepoints"] == 0


def test_agreement_counts_a_spike_at_a_change_point():
    points = pd.DataFrame({**{k: ["x"] * 4 for k in BY}, "budget": [8, 16, 32, 64],
                           "signal": 0.0, "segment": [0, 1, 1, 2],
                           "changepoint": [False, True, False, True],
                           "spike": [False, True, True, False]})
    points = cp.mark_agreement(points)
    assert list(points["coincides"]) == [False, True, True, False]
    row = cp.agreement(points).iloc[0]
    assert row["spikes"] == 2 and row["spikes_coinciding"] == 2
    assert row["changepoints_at_spikes"] == 1


@pytest.mark.parametrize("bad, match", [({"model": "l2"}, "model must be"),
                                        ({"penalty_factor": 0}, "penalty"),
                                        ({"min_size": 2}, "too small")])
def test_changepoint_settings_are_checked(bad, match):
    runs = raw_runs(0)
    with pytest.raises(ValueError, match=match):
        cp.find_changepoints(per_process(runs), rule(runs), **{**SETTINGS, **bad})


# -----------------------------------------------------------------------------
# step-ups inside one run


def steps_with_step_up(n: int, at: int | None, factor: float = 6.0, seed: int = 0) -> np.ndarray:
    s = 0.005 * np.exp(np.random.default_rng(seed).normal(0, 0.05, n))
    if at is not None:
        s[at:] *= factor
    return s


def test_onset_finds_a_sustained_step_up_and_nothing_in_a_flat_or_noisy_run():
    assert onsets.onset(steps_with_step_up(200, 63), 2.5, 8, 8) == 63
    assert onsets.onset(steps_with_step_up(200, 7), 2.5, 8, 8) == 7  # begins inside the baseline
    assert onsets.onset(steps_with_step_up(200, None), 2.5, 8, 8) == -1
    spiky = steps_with_step_up(200, None)
    spiky[[20, 40, 41, 42, 90]] *= 10  # isolated slow steps are not a regime
    assert onsets.onset(spiky, 2.5, 8, 8) == -1
    assert onsets.onset(steps_with_step_up(12, 9), 2.5, 8, 8) == -1  # too short to tell
    assert onsets.onset(steps_with_step_up(200, 100, factor=2.0), 2.5, 8, 8) == -1


def test_find_onsets_tests_cache_on_runs_long_enough_only():
    rows = [{"experiment": "sweep", "backend": "cuda", "model": "m", "family": "gpt2",
             "dtype": "float16", "prompt_len": 32, "budget": n, "repeat": 0, "inner": 0,
             "use_cache": cache, "step_s": steps_with_step_up(n - 1, at)}
            for n, cache, at in [(128, True, 31), (128, True, None), (128, False, 31),
                                 (8, True, None)]]
    out = onsets.find_onsets(pd.DataFrame(rows), 2.5, 8, 8)
    assert list(out["onset"]) == [31, -1]
    assert out["step_up"].iloc[0] == pytest.approx(6.0, rel=0.1)
    assert out["step_up"].isna().iloc[1]
    with pytest.raises(ValueError, match="factor"):
        onsets.find_onsets(pd.DataFrame(rows), 1.0, 8, 8)
    assert out["launch_up"].isna().all()  # rows from before the harness recorded launches


def test_find_onsets_says_whether_the_added_time_is_the_host_waiting_or_the_device():
    steps = steps_with_step_up(127, 31)
    flat = steps_with_step_up(127, None)
    base = {"experiment": "sweep", "backend": "cuda", "model": "m", "family": "gpt2",
            "dtype": "float16", "prompt_len": 32, "budget": 128, "repeat": 0, "inner": 0,
            "use_cache": True, "step_s": steps}
    rows = [{**base, "inner": 0, "step_launch_s": 0.9 * steps, "step_launch_cpu_s": 0.8 * flat},
            {**base, "inner": 1, "step_launch_s": 0.9 * flat, "step_launch_cpu_s": 0.8 * flat}]
    out = onsets.find_onsets(pd.DataFrame(rows), 2.5, 8, 8)
    host, device = out.iloc[0], out.iloc[1]
    assert host["launch_up"] == pytest.approx(6.0, rel=0.1)  # launching took the added time...
    assert host["launch_cpu_up"] == pytest.approx(1.0, rel=0.1)  # ...with this thread idle
    assert device["launch_up"] == pytest.approx(1.0, rel=0.1)  # the wait for the device grew


# -----------------------------------------------------------------------------
# the verb, the figures and the paper's macros, end to end on synthetic runs

DEPTH_SPEC = {"window": 2, "threshold": 1.5, "consistency": 1.0, "alpha": 0.05,
              "changepoints": {"model": "linear", "penalty": 6.0, "min_size": 3,
                               "noise_floor": 0.01},
              "onsets": {"factor": 2.5, "baseline": 8, "run": 8}}


def run_verb(tmp_path, runs: pd.DataFrame, spec: dict = DEPTH_SPEC) -> tuple[int, object]:
    from decodelab import cli

    stats_dir = tmp_path / "stats"
    stats_dir.mkdir(exist_ok=True)
    runs.to_parquet(tmp_path / "runs.parquet")
    rule(runs).to_csv(stats_dir / "regimes.csv", index=False)
    rc = cli.main(["regime-depth", "--runs", str(tmp_path / "runs.parquet"), "--regimes",
                   str(stats_dir / "regimes.csv"), "--spec", json.dumps(spec),
                   "--out", str(stats_dir)])
    return rc, stats_dir


def mixed_runs() -> pd.DataFrame:
    mps = raw_runs(0, decode_spikes={4: 6.0}, process_sd=0.1)
    cpu = raw_runs(1, backend="cpu")
    cpu[["mem_mps_current_bytes", "mem_mps_driver_bytes"]] = np.nan
    return pd.concat([mps, cpu], ignore_index=True)


def test_verb_writes_every_table_and_the_paper_reads_them(tmp_path):
    from decodelab.studies.sweep import figures as sweep_figures
    from decodelab.studies.sweep import paper_depth as regime_depth

    rc, stats_dir = run_verb(tmp_path, mixed_runs())
    assert rc == 0
    for name in ("summary", "phases", "variance", "variance_summary", "memory", "changepoints",
                 "changepoint_curves", "agreement", "kv_collapse", "onsets"):
        assert (stats_dir / f"regime_{name}.csv").exists(), name
    phases_table = pd.read_csv(stats_dir / "regime_phases.csv")
    pooled = phases_table[phases_table["scope"] == "backend"].set_index("backend")
    assert pooled.loc["mps", "decision"] == "decode"
    assert pooled.loc["cpu", "decision"] == phases.NOT_APPLICABLE
    section = regime_depth.parts(stats_dir, {"regimes": DEPTH_SPEC})
    macros, flags = section.macros, section.flags
    assert flags["RegimeDepthReady"] and flags["PhaseTestApplies"] and flags["MemoryApplies"]
    placeholders = regime_depth.parts(tmp_path / "nothing", {"regimes": DEPTH_SPEC})
    assert set(placeholders.macros) == set(macros)  # the placeholders cover every macro
    assert set(placeholders.flags) == set(flags)
    assert macros["PhaseNumSpikes"] == "1" and macros["PhaseNumDecode"] == "1"
    assert macros["PhaseNoSpikeBackends"] == "CPU"
    assert "CPU: " in macros["MemNotApplicable"] and "MPS driver" in macros["MemNotApplicable"]
    assert macros["ChgModel"] == "piecewise linear" and macros["ChgNumChangePoints"] == "0"
    table = section.files["tab_regime_depth.tex"]
    assert "nan" not in table.lower() and table.count(r"\\") >= 3
    drawn = sweep_figures.regime_depth_figures(stats_dir, tmp_path / "fig")
    assert sorted(p.name for p in drawn) == ["changepoints.pdf", "changepoints.png",
                                             "regime_depth.pdf", "regime_depth.png"]


def test_paper_macros_without_the_rule_are_placeholders(tmp_path):
    from decodelab.studies.sweep import paper_depth as regime_depth

    assert regime_depth.read_regime_depth(tmp_path) is None
    section = regime_depth.parts(tmp_path, {"regimes": DEPTH_SPEC})
    assert not any(section.flags.values()) and "RegimeDepthReady" in section.flags
    assert set(section.macros.values()) == {"--"} and "ChgModel" in section.macros
    assert "no regime analysis in depth" in section.files["tab_regime_depth.tex"]


def test_verb_rejects_bad_input_with_a_message(tmp_path, capsys):
    rc, _ = run_verb(tmp_path, raw_runs(0), {**DEPTH_SPEC, "changepoints": {
        **DEPTH_SPEC["changepoints"], "min_size": 2}})
    assert rc == 2 and "regimes.changepoints" in capsys.readouterr().err
    rc, _ = run_verb(tmp_path, raw_runs(0), {**DEPTH_SPEC, "onsets": {
        **DEPTH_SPEC["onsets"], "factor": 0.5}})
    assert rc == 2 and "regimes.onsets" in capsys.readouterr().err
    runs = raw_runs(0).drop(columns=["prefill_s"])
    runs.to_parquet(tmp_path / "bad.parquet")
    from decodelab import cli

    rc = cli.main(["regime-depth", "--runs", str(tmp_path / "bad.parquet"), "--regimes",
                   str(tmp_path / "stats" / "regimes.csv"), "--spec", json.dumps(DEPTH_SPEC),
                   "--out", str(tmp_path)])
    assert rc == 2 and "prefill_s" in capsys.readouterr().err
    rc = cli.main(["regime-depth", "--runs", str(tmp_path / "bad.parquet"), "--regimes",
                   str(tmp_path / "stats" / "regimes.csv"), "--spec", "{}", "--out",
                   str(tmp_path)])  # the spec is read first, and its first missing key named
    assert rc == 2 and "--spec (Regimes): missing key 'window'" in capsys.readouterr().err


def test_step_ups_reach_the_papers_macros(tmp_path):
    from decodelab.studies.sweep import paper_depth as regime_depth

    runs = raw_runs(0)
    longest = runs["budget"] == runs["budget"].max()
    runs["step_launch_cpu_s"] = runs["step_s"].map(lambda s: 0.8 * s)
    runs.loc[longest, "step_s"] = runs.loc[longest, "step_s"].map(
        lambda s: np.concatenate([s[:31], 5 * s[31:]]))
    runs["step_launch_s"] = runs["step_s"].map(lambda s: 0.9 * s)  # a thread kept waiting
    rc, stats_dir = run_verb(tmp_path, runs)
    assert rc == 0
    t = regime_depth.read_regime_depth(stats_dir)
    macros, flags = regime_depth.regime_depth_macros(t, {"regimes": DEPTH_SPEC})
    assert flags["AnyOnsets"] and macros["OnsetSteps"] == "31"
    assert macros["OnsetRuns"] == str(int(longest.sum()))
    assert "MPS" in macros["OnsetWhere"]
    assert flags["OnsetHasLaunch"]
    assert float(macros["OnsetLaunchUp"]) == pytest.approx(5.0, rel=0.1)
    assert float(macros["OnsetLaunchCpuUp"]) == pytest.approx(1.0, rel=0.1)


@pytest.mark.skipif(__import__("shutil").which("latexmk") is None, reason="latexmk not on PATH")
@pytest.mark.parametrize("spikes", [True, False])
def test_paper_compiles_with_the_regime_depth_section(tmp_path, spikes):
    import shutil

    from fixtures import build_paper, overfull, write_stats

    stats_dir = write_stats(tmp_path / "stats", backends=("cpu", "mps"))
    runs = mixed_runs() if spikes else raw_runs(1, backend="cpu")
    _, depth = run_verb(tmp_path / "depth", runs) if (tmp_path / "depth").mkdir() is None \
        else (None, None)
    for p in depth.glob("regime_*.csv"):
        shutil.copy(p, stats_dir / p.name)
    pdf, log = build_paper(stats_dir, tmp_path)
    built = (tmp_path / "build" / "generated" / "macros.tex").read_text()
    assert r"\RegimeDepthReadytrue" in built
    assert (r"\PhaseTestAppliestrue" in built) == spikes
    assert "figures/regime_depth.pdf" in log and "figures/changepoints.pdf" in log
    assert not overfull(log), f"overfull boxes (pt): {overfull(log)}"


# -----------------------------------------------------------------------------
# KV-cache speedup collapse

def ablation_runs(seed: int, on_spike: float = 1.0, off_spike: float = 1.0, index: int = 5,
                  repeats: int = 4) -> pd.DataFrame:
    """Cache on and off in the same processes; spikes multiply decode at budget `index`."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(repeats):
        for i, budget in enumerate(BUDGETS):
            for cache, spike in ((True, on_spike), (False, off_spike)):
                e = np.exp(rng.normal(0, 0.04, 2))
                per_token = 0.003 * (1 if cache else 1 + budget / 40) * e[1]
                per_token *= spike if i == index else 1.0
                prefill, decode = 0.02 * e[0], per_token * (budget - 1)
                rows.append({"experiment": "ablation", "backend": "mps", "model": "gpt2-a",
                             "family": "gpt2", "dtype": "float32", "prompt_len": 32,
                             "use_cache": cache, "budget": budget, "repeat": r, "inner": 0,
                             "prefill_s": prefill, "decode_s": decode,
                             "total_s": prefill + decode, "decode_per_token_s": per_token})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed", range(5))
def test_planted_cache_on_spike_collapses_the_speedup(seed):
    from decodelab.studies.sweep import collapse

    runs = ablation_runs(seed, on_spike=5.0)
    out = collapse.kv_collapse(per_process(runs), rule(runs), 2, 1.5, 0.05)
    spike = out[out["scope"] == "spike"]
    assert list(spike["budget"]) == [BUDGETS[5]]
    assert spike.iloc[0]["decision"] == "collapse" and spike.iloc[0]["speedup_ratio"] < 0.4
    backend = out[out["scope"] == "backend"].iloc[0]
    assert 0.9 < backend["control_ratio"] < 1.1


@pytest.mark.parametrize("seed", range(5))
def test_negative_control_spike_in_both_modes_is_no_collapse(seed):
    from decodelab.studies.sweep import collapse

    runs = ablation_runs(seed, on_spike=5.0, off_spike=5.0)
    out = collapse.kv_collapse(per_process(runs), rule(runs), 2, 1.5, 0.05)
    spike = out[out["scope"] == "spike"]
    assert len(spike) == 1 and spike.iloc[0]["decision"] == "no collapse"
    assert 0.85 < spike.iloc[0]["speedup_ratio"] < 1.15


def test_no_spike_means_not_applicable():
    from decodelab.studies.sweep import collapse

    runs = ablation_runs(0)
    out = collapse.kv_collapse(per_process(runs), rule(runs), 2, 1.5, 0.05)
    assert list(out["scope"]) == ["backend"]
    assert out.iloc[0]["decision"] == collapse.NOT_APPLICABLE and np.isnan(out.iloc[0]["p_value"])


def test_negative_control_budget_drift_is_not_memory_given_the_budget():
    # Excess that drifts with the budget and memory that grows with it: the plain rank
    # correlation is significant, the partial one given the budget must not be.
    rng = np.random.default_rng(0)
    budget = np.repeat(np.array(BUDGETS, float), 6)
    memory_bytes = 2**30 * (1 + budget / 50) * np.exp(rng.normal(0, 0.02, len(budget)))
    excess = 0.002 * budget + rng.normal(0, 0.05, len(budget))
    out = memory.correlate(memory_bytes, excess, budget)
    assert out["p_value"] < 1e-3
    assert out["p_given_budget"] > 0.01 and abs(out["rho_given_budget"]) < 0.3


def test_memory_linked_excess_survives_the_budget_control():
    rng = np.random.default_rng(1)
    budget = np.repeat(np.array(BUDGETS, float), 6)
    jitter = rng.normal(0, 0.3, len(budget))
    memory_bytes = 2**30 * (1 + budget / 50) * np.exp(jitter)
    excess = 0.5 * jitter + rng.normal(0, 0.05, len(budget))
    out = memory.correlate(memory_bytes, excess, budget)
    assert out["rho_given_budget"] > 0.6 and out["p_given_budget"] < 1e-6
