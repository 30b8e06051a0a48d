"""The verification stage's runner: every level emits rows for the right and the wrong rules,
and each wrong rule is rejected where the level has the power to."""

import pytest

from decodelab import equivalence as eq
from decodelab import verify
from decodelab.config import Pair, Verification

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
    report = verify.run_real(SPEC, "cpu-cpu", PAIR, *tiny_pair, seed=0)
    checks = {(r["check"], r["sampler"]) for r in report["results"]}
    assert ("two-sample chi-square", "correct") in checks
    assert ("log-ratio t-test", "resample_from_p") in checks
    assert all(r["n"] == SPEC.real.tokens for r in report["results"])
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
    assert all(len(t) >= SPEC.real.tokens for t in samples.values())
    again = eq.two_sample_test(samples["autoregressive"], samples["correct"],
                               SPEC.real.top, SPEC.real.budget)
    assert again["chi2"] == pytest.approx(chi[0]["statistic"])
