"""The verification stage's runner: every level emits rows for the right and the wrong rules,
and each wrong rule is rejected where the level has the power to."""

import json
from dataclasses import asdict, replace
from functools import partial

import numpy as np
import pytest
from llama import tiny_llama, tokens

from decodelab import cli
from decodelab.backends import sources
from decodelab.config.settings import Pair, Verification
from decodelab.core.errors import DecodelabError
from decodelab.core.io import read_report
from decodelab.engines.longctx import first_draft_log_probs
from decodelab.engines.sparse_kv import Policy
from decodelab.studies.verification import cli as verification_cli
from decodelab.studies.verification import equivalence as eq
from decodelab.studies.verification import run as verify

SPEC = Verification.from_spec({"k": 2, "alpha": 0.01, "seeds": 3, "seed": 5,
        "exact": {"random_pairs": 12, "vocab_sizes": [2, 50], "concentrations": [0.5, 5.0],
                  "real_positions": 40, "block_vocab": 2, "block_ks": [1, 2]},
        "monte_carlo": {"draws": 800, "vocab": 5, "block_draws": 600},
        "real": {"tokens": 256, "budget": 16, "top": 20, "prompts": 4, "power_tokens": 128,
                 "greedy_prompts": 3}})
PAIR = Pair("target", "draft", target_device="cpu", draft_device="cpu")


def test_exact_level_passes_the_rule_and_fails_both_controls(tiny_pair):
    report = verify.run_exact(SPEC, *tiny_pair, seed=0)
    rows = report["results"]
    assert {r["check"] for r in rows} >= {"one step, Dirichlet pairs", "one step, edge cases",
                                          "one step, real pairs", "block K=1", "block K=2"}
    assert all(r["rejected"] == r["expected_rejected"] for r in rows)


def test_monte_carlo_level_and_its_power(tiny_pair):
    report = verify.run_monte_carlo(SPEC)
    assert all(r["rejected"] == r["expected_rejected"] for r in report["results"])
    rates = {(p["check"], p["sampler"]): p["rate"] for p in report["power"]}
    assert all(rate == 1.0 for (_, s), rate in rates.items() if s != "correct")
    assert len(report["pvalues"]) == 2 * 3 * SPEC.seeds


def test_real_level_reports_both_tests_greedy_and_power(tiny_pair):
    # What the report holds, not a verdict: half SPEC's sizes (128 tokens, 64 for power) do.
    spec = replace(SPEC, real=replace(SPEC.real, tokens=128, power_tokens=64))
    report = verify.run_real(spec, "cpu-cpu", PAIR, *tiny_pair, seed=0)
    checks = {(r["check"], r["sampler"]) for r in report["results"]}
    assert ("two-sample chi-square", "correct") in checks
    assert ("log-ratio t-test", "resample_from_p") in checks
    assert all(r["n"] == spec.real.tokens for r in report["results"])
    chi = [r for r in report["results"] if r["check"] == "two-sample chi-square"]
    assert all(r["dof"] >= 1 for r in chi)
    assert report["greedy"][0]["prompts"] == 3
    assert 0 <= report["greedy"][0]["fraction_equal"] <= 1
    assert {t["sampler"] for t in report["tokens"]} == {"correct", "accept_all",
                                                        "resample_from_p"}
    assert len(report["power"]) == 2 * 3
    assert all(0 <= r["p_asymptotic"] <= 1 and r["permutations"] > 0 for r in chi)
    # the samples the tests saw are in the report, and rebuild the chi-square table
    samples = report["samples"]
    assert set(samples) == {"autoregressive", "correct", "accept_all", "resample_from_p"}
    assert all(len(t) >= spec.real.tokens for t in samples.values())
    again = eq.two_sample_test(samples["autoregressive"], samples["correct"],
                               spec.real.top, spec.real.budget)
    assert again["chi2"] == pytest.approx(chi[0]["statistic"])


@pytest.mark.parametrize("engine", ["graph", "pipelined"])
def test_real_level_runs_in_the_pairs_engine(tiny_pair, request, engine):
    """Level 3 checks the engine the pair times: a graph pair's models reach it through
    `graphs.engine` (off a GPU: refused by key, or uncaptured here). A pipelined pair's static
    caches have room for its loop's overshooting last proposal, K + 1 past the budget (the H200
    run at 0341fb0 was refused without it); a graph pair's hold the sequence alone, and its
    samples equal the eager engine's draw for draw (the pipelined loop's last token may come
    from other uniforms)."""
    spec = replace(SPEC, real=replace(SPEC.real, tokens=64, power_tokens=32, greedy_prompts=2))
    graph_pair = replace(PAIR, engine=engine)
    with pytest.raises(DecodelabError, match="'speculative.pairs.cpu-graph.engine'.*CUDA"):
        verify.run_real(spec, "cpu-graph", graph_pair, *tiny_pair, seed=0)
    built = request.getfixturevalue("uncaptured_engines")
    static = verify.run_real(spec, "cpu-graph", graph_pair, *tiny_pair, seed=0)
    longest = 32 + spec.real.budget + (spec.k + 1 if engine == "pipelined" else 0)
    assert [e.max_len for e in built] == [longest] * 2
    assert all((e.speculative_loop is not None) == (engine == "pipelined") for e in built)
    if engine == "graph":
        eager = verify.run_real(spec, "cpu-cpu", PAIR, *tiny_pair, seed=0)
        assert static["samples"] == eager["samples"]


def test_spawned_workers_load_the_pair_and_draw_what_one_process_draws(tiny_pair):
    """Where a fork cannot carry the models (CUDA), level 3's samples come from spawned
    processes that load the pair again: the same tokens and log ratios as drawn in this one."""
    load = partial(verify.load_pair, *tiny_pair, asdict(PAIR), "speculative.pairs.p.engine", 48)
    target, draft = load()
    prompts = [tokens(6, seed=s, vocab=target.config.vocab_size) for s in range(2)]
    keys = [(m, 1) for m in eq.METHODS]
    here = [eq.Samples(target, draft, prompts, 24, 2, 8)(key) for key in keys]
    spawned = eq.in_spawned(partial(eq.loaded_samples, load, prompts, 24, 2, 8), keys, 2)
    assert [t for t, _ in spawned] == [t for t, _ in here]
    assert len(set(here[0][0])) > 3  # sampled text, not one repeated token
    for (_, a), (_, b) in zip(spawned, here, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_samples_drawn_in_two_processes_equal_those_drawn_in_one(one_thread):
    # Every (method, seed) sample has its own seeds, so the processes change nothing but time.
    target, draft = tiny_llama(seed=1, vocab=8), tiny_llama(seed=2, vocab=8)
    prompts = [tokens(6, seed=s, vocab=8) for s in range(2)]
    keys = [(m, s) for s in (1, 2) for m in eq.METHODS]
    runs = []
    for workers in (1, 2):
        levels = eq.real_model_levels(target, draft, prompts, 32, 2, budget=8, top=5)
        levels["prefetch"](keys, workers)
        runs.append({key: (levels["tokens"](*key), levels["log_ratio"](key[0], key[1])["t"]
                           if key[0] != "autoregressive" else None) for key in keys})
    assert runs[0] == runs[1]
    assert len({runs[0][key][0] for key in keys}) == len(keys)  # the samples differ


# -----------------------------------------------------------------------------
# the long-context pair: the levels through a sparse draft cache (config 'long.verification')


def peaked_llama(seed):
    model = tiny_llama(seed=seed, vocab=8)
    model.lm_head.weight.data *= 10  # peaked enough that the sparse draft's law is far from p
    return model


# 12k Llama forwards (about 12 s of CPU): fewer tokens would lose the log-ratio test's power
# against the wrong rules (p < 1e-4 at 512). In `make test`, not `make test-fast`.
@pytest.mark.slow
def test_the_long_pair_keeps_the_target_law_and_rejects_both_wrong_rules(one_thread):
    # The target drafts for itself through a sink + window view of 5 of its 24+ cached tokens.
    model = peaked_llama(6)
    prompts = [tokens(24, seed=s, vocab=8) for s in range(4)]
    policy = Policy("sink_window", 5)
    speculate = verify.sparse_speculate(policy, self_draft=True)
    # resample_from_p is the harder wrong rule here: its log-ratio p-value reaches 0.01 at about
    # one seed in three at 512 tokens, and at 256 it depends on the sampler's random stream.
    spec = replace(SPEC, real=replace(SPEC.real, tokens=512, power_tokens=512))
    p, q = eq.engine_pairs(model, model, prompts, 60, spec.k, 0, spec.real.budget, speculate)
    check = eq.pair_check(p, q)
    assert len(p) == 60 and check["beta_mean"] < 0.95  # q is the sparse view's, not p
    rows, power, _ = verify.long_levels_one_two(spec, "long:self", p, q, check)
    three = verify.level_three(spec, "long:self", model, model, prompts, prompts, speculate,
                               partial(first_draft_log_probs, model, policy))
    rows += three["results"]
    assert {r["level"] for r in rows} == {1, 2, 3} and {r["pair"] for r in rows} == {"long:self"}
    # Every verdict as expected, but the chi-square of token frequencies on the wrong rules: at
    # 512 tokens it tells neither apart here (p 0.3-0.4); the log-ratio test does (p < 1e-4).
    decisive = [r for r in rows if r["sampler"] == "correct" or "chi-square" not in r["check"]]
    assert len(decisive) == len(rows) - 2
    assert all(r["rejected"] == r["expected_rejected"] for r in decisive), [
        (r["check"], r["sampler"], r["p_value"]) for r in decisive]
    ratio = {r["sampler"]: r["rate"] for r in three["power"] if r["check"] == "log-ratio t-test"}
    assert ratio["correct"] == 0 and ratio["accept_all"] > 0 and ratio["resample_from_p"] > 0
    assert three["greedy"][0]["fraction_equal"] == 1.0  # greedy speculation is the target's


def test_the_verb_runs_every_level_on_a_long_pair(tmp_path, one_thread):
    sources.prepare({"source": "init", "preset": "llama-tiny", "seed": 1}, tmp_path / "m")
    check = {"length": 48, "policy": "retrieval", "kv_budget": 24, "drafter": "self", "k": 2,
             "documents": 2, "tokens": 32, "power_tokens": 16, "seeds": 2}
    job = {"check": check, "device": "cpu", "dtype": "float32", "seed": 0}
    out = tmp_path / "long_cpu.json"
    code = cli.main(["verify-long", "--spec", json.dumps(SPEC.job_spec()), "--long-spec",
                     json.dumps(job), "--target-dir", str(tmp_path / "m"), "--threads", "1",
                     "--out", str(out)])
    assert code == 0
    report = read_report(out, verification_cli.verify_rule(str(out)))
    assert verification_cli.verify_rule(str(out)) == "verify_long"
    assert report["settings"] == {**check, "device": "cpu"}
    levels = {(r["level"], r["check"]) for r in report["results"]}
    assert levels == {(1, "one step, long-context pairs"),
                      (2, "Monte Carlo, one step, long-context pair"),
                      (3, "two-sample chi-square"), (3, "log-ratio t-test")}
    one = [r for r in report["results"] if r["level"] == 1]
    assert all(r["rejected"] == r["expected_rejected"] for r in one)
    assert {r["pair"] for r in report["power"]} == {"long:self"}
    assert len(report["pvalues"]) == 3 * 3 * check["seeds"]  # three checks, every rule
    assert all(len(t) >= check["tokens"] for t in report["samples"].values())
