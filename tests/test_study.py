"""The speculative study's job: a shuffled grid with baselines and the HF peer, and its stats."""

import random

import pandas as pd
import pytest

from decodelab.analysis import stability, stats
from decodelab.backends import models
from decodelab.config.settings import Confidence, SpeculativeJob, Stability
from decodelab.studies.speculative import run as study
from decodelab.studies.speculative import tables as speculative_tables

SPEC = {"ks": [1, 3], "modes": ["greedy", "sampled"], "temperature": 1.0, "top_k": 0,
        "top_p": 1.0, "prompts": 2, "prompt_len": 8, "budget": 12, "hf_assisted": True,
        "seed": 3}
PAIR = {"target_device": "cpu", "draft_device": "cpu", "dtype": "float32"}
CI = Confidence(0.9, 200, 0)


@pytest.fixture(scope="module")
def runs(tiny_pair):
    parts = [study.run(*tiny_pair, "cpu-cpu", PAIR, SpeculativeJob.from_spec(SPEC), repeat=r,
                       progress=False)
             for r in range(2)]
    return pd.concat(parts, ignore_index=True)


def test_every_row_records_the_models_weight_bytes_and_measured_bandwidth(runs):
    """What the bandwidth floor of each role needs, measured once per process and device."""
    for role in ("target", "draft"):
        assert (runs[f"{role}_weight_bytes"] > 0).all() and (runs[f"{role}_bandwidth"] > 0).all()
        assert runs.groupby("repeat")[f"{role}_bandwidth"].nunique().eq(1).all()
    assert (runs["target_bandwidth"] == runs["draft_bandwidth"]).all()  # one CPU, measured once
    table = speculative_tables.floor_table(runs)
    assert sorted(table["role"]) == ["draft", "target"] and (table["over_floor"] > 0).all()


def test_the_grid_has_every_method_once_per_prompt(runs):
    one = runs[runs["repeat"] == 0]
    counts = one.groupby("method").size().to_dict()
    assert counts == {"speculative": 2 * 2 * 2, "autoregressive": 2 * 2,
                      "autoregressive_stepped": 2 * 2, "draft_autoregressive": 2 * 2,
                      "hf_assisted": 2 * 2}
    assert sorted(one["order"]) == list(range(len(one)))
    assert (one["tokens"].map(len) == SPEC["budget"]).all()


def test_greedy_speculative_and_hf_agree_with_the_target(runs):
    hf = speculative_tables.hf_table(speculative_tables.spec_per_process(runs), runs, CI)
    assert (hf["agree_speculative"] == 1.0).all()
    assert (hf["agree_hf_assisted"] == 1.0).all()
    assert (hf["ours_over_hf"] > 0).all()


def test_study_tables_are_consistent(runs):
    proc = speculative_tables.spec_per_process(runs)
    acceptance = speculative_tables.acceptance_table(proc, CI)
    speedup = speculative_tables.speedup_table(proc, CI,
                                  stability.verdicts(runs, stats.SPECULATIVE, Stability()))
    theory = speculative_tables.theory_table(proc, speedup, acceptance)
    assert set(acceptance["k"]) == {1, 3} and set(acceptance["mode"]) == {"greedy", "sampled"}
    assert acceptance["alpha"].between(0, 1).all()
    assert acceptance["proposal_acceptance"].between(0, 1).all()
    assert (acceptance["tokens_per_call"] >= 1).all()
    assert (acceptance["tokens_per_call"] <= acceptance["k"] + 1).all()
    assert (speedup["speedup"] > 0).all() and (speedup["n"] == 2).all()
    assert (speedup["baseline"] == "fair").all() and (speedup["speedup_stepped"] > 0).all()
    assert speedup["overhead_share"].between(0, 1).all()
    assert theory["alpha"].between(0, 1).all() and (theory["cost_ratio"] > 0).all()


@pytest.mark.parametrize("first_span", [1, 4])
def test_the_theory_prices_verification_at_what_the_runs_measured(first_span):
    """A toy process: the baseline's passes take 2 ms, a K=4 verification 3 ms (1.5 steps), the
    draft's steps 0.4 ms (c = 0.2) in its own loop but 0.5 ms (1.25 steps) in the speculative
    one; 3 tokens per call. Leviathan prices the verification at one step and the draft's at
    its own loop's; `predicted_verify` the verification at the measured 1.5, `predicted_passes`
    both passes as measured, and the measured speedup of a run that costs exactly that is
    matched by it alone. The draft's first span holds its prompt pass (4 ms) and, where a graph
    engine replays a proposal at once, that proposal's other passes."""
    budget, calls = 30, 10  # 3 tokens per call at K = 4
    spec_s = calls * (4 * 0.5e-3 + 3e-3)
    rows = [  # total, prefill and forward time per method; steps of the engine's own loop
        {"method": "autoregressive", "k": 0, "total_s": budget * 2e-3, "prefill_s": 2e-3,
         "verify_s": budget * 2e-3, "target_calls": budget, "step_s": 2e-3},
        {"method": "draft_autoregressive", "k": 0, "total_s": budget * 0.4e-3,
         "prefill_s": 0.4e-3, "verify_s": budget * 0.4e-3, "target_calls": budget,
         "step_s": 0.4e-3},
        {"method": "speculative", "k": 4, "total_s": spec_s, "prefill_s": 3e-3,
         "verify_s": calls * 3e-3, "target_calls": calls, "tokens": [0] * budget,
         "accepted": [2] * calls, "proposals": [4] * calls, "proposed": 4 * calls,
         "draft_s": 4e-3 + (4 * calls - 1) * 0.5e-3,
         "draft_prefill_s": 4e-3 + (first_span - 1) * 0.5e-3,
         "draft_prefill_passes": first_span, "draft_forwards": 4 * calls}]
    runs = pd.DataFrame([{"pair": "p", "repeat": r, "mode": "greedy", "prompt": 0, **row}
                         for r in range(2) for row in rows])
    runs["tokens"] = [t if isinstance(t, list) else [0] * budget for t in runs["tokens"]]
    proc = speculative_tables.spec_per_process(runs)
    acceptance = speculative_tables.acceptance_table(proc, CI)
    speedup = speculative_tables.speedup_table(proc, CI, stability.verdicts(runs, stats.SPECULATIVE,
                                                               Stability()))
    theory = speculative_tables.theory_table(proc, speedup, acceptance).iloc[0]
    assert theory["cost_ratio"] == pytest.approx(0.2)
    assert theory["verify_cost"] == pytest.approx(1.5)
    assert theory["draft_cost"] == pytest.approx(1.25)
    tokens = 3.0  # (1 - alpha^5) / (1 - alpha) at the alpha these calls imply
    assert theory["predicted"] == pytest.approx(tokens / (4 * 0.2 + 1), rel=1e-6)
    assert theory["predicted_verify"] == pytest.approx(tokens / (4 * 0.2 + 1.5), rel=1e-6)
    assert theory["predicted_passes"] == pytest.approx(tokens / (4 * 0.25 + 1.5), rel=1e-6)
    assert theory["measured"] == pytest.approx(budget * 2e-3 / spec_s)
    assert theory["measured"] / theory["predicted_passes"] == pytest.approx(1.0, rel=1e-6)
    assert theory["measured"] / theory["predicted_verify"] < 0.95
    assert theory["measured"] / theory["predicted"] < 0.8


def test_alpha_inversion_recovers_the_planted_value():
    from decodelab.analysis.theory import alpha_from_tokens_per_call, expected_tokens_per_call

    for alpha in (0.0, 0.3, 0.7, 0.95):
        for k in (1, 4, 8):
            got = alpha_from_tokens_per_call(expected_tokens_per_call(alpha, k), k)
            assert abs(got - alpha) < 1e-6


def test_parallelism_rows_time_one_and_k_plus_one_tokens(tiny_pair):
    model = models.load(tiny_pair[0], "cpu")
    rows = study.parallelism(model, ks=[1, 4], context=16, inner=3, seed=0)
    assert sorted(rows["tokens"].unique()) == [1, 2, 5]
    assert (rows.groupby("tokens").size() == 3).all() and (rows["seconds"] > 0).all()
    rows = rows.assign(backend="cpu", model="t", repeat=0)
    table = speculative_tables.parallelism_table(rows, CI)
    assert sorted(table["k"]) == [1, 4] and (table["ratio"] > 0).all()


def test_both_baselines_decode_what_the_target_decodes_and_record_the_engine(runs):
    """The fair loop and the stepped harness emit the same greedy tokens; every speculative and
    fair-loop row says where its time went, and the parts add up."""
    greedy = runs[runs["mode"] == "greedy"].set_index(["repeat", "prompt", "method"])["tokens"]
    for (repeat, prompt), _ in runs.groupby(["repeat", "prompt"]):
        assert list(greedy[(repeat, prompt, "autoregressive")]) == \
            list(greedy[(repeat, prompt, "autoregressive_stepped")])
    engine = runs[runs["method"].isin(["speculative", "autoregressive", "draft_autoregressive"])]
    assert engine["overhead_share"].between(0, 1).all()
    parts = engine["draft_s"].fillna(0) + engine["verify_s"] + engine["overhead_s"]
    assert (parts - engine["total_s"]).abs().max() < 1e-9
    assert (engine["prefill_s"] > 0).all() and (engine["prefill_s"] < engine["total_s"]).all()


def test_runs_without_the_fair_baseline_say_their_speedup_is_over_the_stepped_one(runs):
    """Raw runs from before the fair loop (their `autoregressive` was the stepped harness, and
    no `autoregressive_stepped` rows): the speedup table labels them, rather than passing them
    off as fair."""
    old = runs[runs["method"] != "autoregressive_stepped"].drop(columns=["proposals"])
    speedup = speculative_tables.speedup_table(speculative_tables.spec_per_process(old), CI,
                                  stability.verdicts(old, stats.SPECULATIVE, Stability()))
    assert (speedup["baseline"] == "stepped").all() and "speedup_stepped" not in speedup
    acceptance = speculative_tables.acceptance_table(speculative_tables.spec_per_process(old), CI)
    assert acceptance["alpha"].between(0, 1).all()


def test_every_parallelism_pass_of_a_size_starts_from_a_new_context_length():
    """As `generate` meets them: no two passes of as many tokens start at one length (a fixed
    length would hide cuDNN attention's plan per new length), packed after the context."""
    ns = [n for n in [1, 2, 1, 5, 5, 2, 1] for _ in range(study.PASSES)]
    begin = study.starts(ns, 100, random.Random(0))
    for n in set(ns):
        mine = [b for b, m in zip(begin, ns, strict=True) if m == n]
        assert len(set(mine)) == len(mine)
        assert sorted(mine) == list(range(100, 100 + len(mine)))


def test_pooled_alpha_reads_a_reference_with_rows_from_before_per_call_proposals():
    """A reference may hold raw rows written before `proposals` was recorded beside newer ones:
    the old pair's alpha comes from tokens per call, the new pair's from its full-K calls."""
    import pandas as pd

    from decodelab.analysis.theory import expected_tokens_per_call

    old = pd.DataFrame({"pair": "old", "method": "speculative", "mode": "greedy", "k": 4,
                        "tokens": [[0] * 30], "target_calls": [10]})
    new = pd.DataFrame({"pair": "new", "method": "speculative", "mode": "greedy", "k": 4,
                        "tokens": [[0] * 9], "target_calls": [3], "accepted": [[4, 2, 1]],
                        "proposals": [[4, 4, 2]]})
    alpha = speculative_tables.pooled_alpha(pd.concat([old, new], ignore_index=True),
                               ["pair", "mode", "k"]).set_index("pair")["alpha"]
    assert expected_tokens_per_call(alpha["old"], 4) == pytest.approx(3.0)
    assert expected_tokens_per_call(alpha["new"], 4) == pytest.approx(4.0)  # 1 + (4 + 2) / 2


def toy_prompts(base: list[float], speedups: list[float], processes: int = 4) -> pd.DataFrame:
    """Processes that time each prompt alike: a prompt's baseline takes base[p] seconds and its
    speculative run base[p] / speedups[p]."""
    rows = [{"pair": "p", "repeat": r, "mode": "greedy", "prompt": p, "method": method, "k": k,
             "total_s": b / s if method == "speculative" else b}
            for r in range(processes) for p, (b, s) in enumerate(zip(base, speedups, strict=True))
            for method, k in (("autoregressive", 0), ("speculative", 4))]
    return pd.DataFrame(rows)


def test_the_interval_over_prompts_shows_what_every_process_shares():
    """The draft guesses four prompts at different rates (1.2x to 2.4x), alike in every
    process: the interval over processes is a point, the one over prompts spans the rates.
    Negative control: prompts of different lengths at one rate give a point, since a prompt's
    two times are resampled together (apart, the lengths alone would spread it)."""
    runs = toy_prompts([1.0] * 4, [1.2, 1.6, 2.0, 2.4])
    speedup = speculative_tables.speedup_table(speculative_tables.spec_per_process(runs), CI,
                                  stability.verdicts(runs, stats.SPECULATIVE, Stability()))
    assert speedup.loc[0, "ci_low"] == speedup.loc[0, "ci_high"]
    spread = speculative_tables.prompt_table(runs, CI).iloc[0]
    assert spread["prompts"] == 4
    assert spread["prompt_ci_low"] < 1.45 and spread["prompt_ci_high"] > 2.15
    same = speculative_tables.prompt_table(toy_prompts([1.0, 2.0, 3.0, 4.0], [2.0] * 4), CI).iloc[0]
    assert same["prompt_ci_low"] == pytest.approx(2.0) == same["prompt_ci_high"]


@pytest.mark.parametrize("engine", ["graph", "pipelined"])
def test_the_static_caches_hold_what_the_engine_needs(tiny_pair, uncaptured_engines, engine):
    """A pipelined pair's static caches hold the prompt, the budget and its loop's overshooting
    last proposal at the largest K (the H200 run at 0341fb0 was refused: "162 tokens do not fit
    its static cache of 160"); a graph pair's the prompt and the budget alone, since each pass
    attends over every slot. Greedy rows are the target's own tokens."""
    spec = SpeculativeJob.from_spec(SPEC | {"hf_assisted": False, "modes": ["greedy"]})
    df = study.run(*tiny_pair, "cpu-graph", PAIR | {"engine": engine}, spec, repeat=0,
                   progress=False)
    longest = SPEC["prompt_len"] + SPEC["budget"]
    longest += max(SPEC["ks"]) + 1 if engine == "pipelined" else 0
    assert [e.max_len for e in uncaptured_engines] == [longest] * 2
    tokens = df.set_index(["prompt", "method", "k"])["tokens"]
    for prompt in df["prompt"].unique():
        for k in SPEC["ks"]:
            assert list(tokens[(prompt, "speculative", k)]) == \
                list(tokens[(prompt, "autoregressive", 0)])
