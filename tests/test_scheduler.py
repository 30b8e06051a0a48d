import numpy as np
import pytest
from costs import CONTEXT, COST

from decodelab.core.errors import DecodelabError
from decodelab.engines.scheduler import (
    CostModel,
    Posterior,
    drafts_more,
    expected_tokens,
    fit_costs,
    k_star,
    round_k,
    tokens_per_second,
)
from decodelab.studies.batched import sim as bs

HORIZON, K_MAX = 4.0, 10
SEEDS = (0, 1, 2)
# Uniform acceptance: adaptive / best fixed K lay in 0.98-1.003 over 8 seeds and two alphas. The
# adaptive rows learn K from a flat prior and their K* wanders between neighbours, while the
# fixed K is picked in hindsight on the same streams, so the ratio sits a little below 1.
TIE = 0.03


def random_cost(rng) -> CostModel:
    return CostModel(tuple(rng.uniform(0, 1, 3) * (1e-2, 1e-3, 1e-6)),
                     tuple(rng.uniform(0, 1, 3) * (1e-2, 1e-3, 1e-6)))


def test_k_star_is_the_brute_force_argmax():
    rng = np.random.default_rng(0)
    for case in range(2000):
        alpha = (0.0, 1.0, *rng.uniform(0, 1, 8))[case % 10]
        cost, batch, context = random_cost(rng), int(rng.integers(1, 65)), rng.uniform(1, 8192)
        k_max = int(rng.integers(0, 16))
        brute = int(np.argmax([tokens_per_second(alpha, k, cost, batch, context)
                               for k in range(k_max + 1)]))
        assert k_star(alpha, cost, batch, context, k_max) == brute, (alpha, cost, k_max)


def test_k_star_grows_with_acceptance_and_verification_cost():
    ks = [k_star(a, COST, 8, CONTEXT, K_MAX) for a in (0.2, 0.5, 0.8, 0.95)]
    assert ks == sorted(ks) and ks[0] == 0 and ks[-1] > 3
    # Verification nearly free against drafting (short context): speculate less.
    assert k_star(0.8, COST, 8, 16, K_MAX) < k_star(0.8, COST, 8, CONTEXT, K_MAX)


def test_expected_tokens_is_the_mean_of_the_simulated_rounds():
    for alpha, k in ((0.0, 3), (0.6, 4), (0.9, 8), (1.0, 5)):
        stream = bs.Stream(bs.Request((alpha, alpha)), np.random.default_rng(1))
        rounds = [stream.verify(k) + 1 for _ in range(20000)]
        assert np.mean(rounds) == pytest.approx(expected_tokens(alpha, k), rel=0.02, abs=1e-9)


def test_the_posterior_counts_accepts_and_one_reject_per_round():
    p = Posterior().update(4, 4).update(4, 1)
    assert (p.accepts, p.rejects) == (6, 2)  # a full round judged no reject
    assert p.mean == 0.75
    forgetting = Posterior(10, 10).update(2, 2, decay=0.5)
    assert (forgetting.accepts, forgetting.rejects) == (7, 5)
    with pytest.raises(DecodelabError, match="accepted 3 of 2"):
        Posterior().update(2, 3)


def test_a_request_never_stops_drafting_for_good():
    hopeless = Posterior(1, 50)
    assert k_star(hopeless.mean, COST, 8, CONTEXT, K_MAX) == 0
    assert round_k(hopeless, COST, 8, CONTEXT, K_MAX) == 1
    assert drafts_more(hopeless, 0, COST, 8, CONTEXT, K_MAX)
    assert not drafts_more(hopeless, 1, COST, 8, CONTEXT, K_MAX)
    keen = Posterior(50, 1)
    k = round_k(keen, COST, 8, CONTEXT, K_MAX)
    assert k > 3 and drafts_more(keen, k - 1, COST, 8, CONTEXT, K_MAX)


def test_a_planted_cost_model_is_recovered_from_timings():
    rng = np.random.default_rng(3)
    grid = [(b, ctx) for b in (1, 4, 16, 64) for ctx in (256, 4096)]
    draft = [(b, ctx, COST.t_draft(b, ctx)) for b, ctx in grid]
    verify = [(b, ctx, n, COST.t_verify(b, ctx, n)) for b, ctx in grid for n in (1, 5)]
    exact = fit_costs(draft, verify)
    assert np.allclose(exact.draft, COST.draft, atol=1e-12)
    assert np.allclose(exact.verify, COST.verify, atol=1e-12)
    noisy = fit_costs([(b, c, t * rng.normal(1, 0.01)) for b, c, t in draft],
                      [(b, c, n, t * rng.normal(1, 0.01)) for b, c, n, t in verify])
    for b, ctx in grid:
        assert noisy.t_verify(b, ctx, 3) == pytest.approx(COST.t_verify(b, ctx, 3), rel=0.05)


def test_too_few_or_degenerate_timings_are_refused():
    verify = [(b, 512, n, 0.01) for b in (1, 2) for n in (1, 3)]
    with pytest.raises(DecodelabError, match="draft cost model has 3 coefficients"):
        fit_costs([(1, 512, 0.01), (2, 512, 0.02)], verify)
    with pytest.raises(DecodelabError, match="rank 2"):  # one context length: no B x L term
        fit_costs([(b, 512, 0.01 * b) for b in (1, 2, 4)], verify)
    with pytest.raises(DecodelabError, match="rows of"):
        fit_costs([(1, 0.01)], verify)


def ratios(requests, decay=1.0):
    out = []
    for seed in SEEDS:
        _, fixed = bs.best_fixed(requests, COST, CONTEXT, HORIZON, seed, K_MAX)
        adaptive = bs.adaptive(requests, COST, CONTEXT, HORIZON, seed, K_MAX, decay)
        out.append(adaptive.throughput / fixed.throughput)
    return np.array(out)


def test_adaptive_k_beats_the_best_fixed_k_when_acceptance_varies_across_requests():
    requests = [bs.Request((0.97, 0.97))] * 4 + [bs.Request((0.2, 0.2))] * 4
    assert ratios(requests).min() > 1 + 1.5 * TIE


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_adaptive_k_ties_the_best_fixed_k_when_every_request_accepts_alike(alpha):
    # The negative control: with nothing to adapt to, no gain beyond the tolerance.
    assert abs(ratios([bs.Request((alpha, alpha))] * 8).mean() - 1) < TIE


def test_the_simulator_is_seeded_and_refuses_bad_requests():
    requests = [bs.Request((0.9, 0.2), switch=0.05)] * 4
    a, b = (bs.adaptive(requests, COST, CONTEXT, 1.0, 7, K_MAX, 0.8) for _ in "ab")
    assert (a.tokens, a.ks) == (b.tokens, b.ks) and len(set(a.ks)) > 1
    with pytest.raises(DecodelabError, match="lie in"):
        bs.synchronized([bs.Request((1.2, 0.5))], 2, COST, CONTEXT, 1.0, 0)
    with pytest.raises(DecodelabError, match="at least one request"):
        bs.adaptive([], COST, CONTEXT, 1.0, 0, K_MAX)
