import math

import pytest
import torch
from scipy import stats

from decodelab.analysis.theory import expected_speedup, expected_tokens_per_call
from decodelab.engines.sampling import (
    _invert_cdf,
    emitted_distribution,
    greedy_accept,
    sample,
    speculative_accept,
    speculative_verdict,
    verdict_uniforms,
    warp,
)

# A fixed pair with beta = sum(min(p, q)) = 0.45 and a token (3) the draft can never propose.
P = torch.tensor([0.30, 0.05, 0.20, 0.02, 0.13, 0.10, 0.15, 0.05], dtype=torch.float64)
Q = torch.tensor([0.05, 0.30, 0.10, 0.00, 0.05, 0.25, 0.05, 0.20], dtype=torch.float64)
BETA = 0.45
N_DRAWS = 20_000
# Statistical tests are seeded, so deterministic; these are their tolerances.
P_VALUE_OK, P_VALUE_BROKEN = 1e-3, 1e-6

DEVICES = ["cpu"]
if torch.cuda.is_available():
    DEVICES.append("cuda")
if torch.backends.mps.is_available():
    DEVICES.append("mps")


def gen(seed: int = 0, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def dirichlet(v: int, concentration: float, g: torch.Generator) -> torch.Tensor:
    gamma = torch._standard_gamma(torch.full((v,), concentration, dtype=torch.float64),
                                  generator=g)
    if gamma.sum() == 0:  # every draw underflowed: tiny concentration, small v
        gamma[0] = 1.0
    return gamma / gamma.sum()


def chisquare_p(tokens: list[int], p: torch.Tensor) -> float:
    """Goodness of fit of the tokens to p (normalised here); tokens outside p's support fail."""
    counts = torch.bincount(torch.tensor(tokens), minlength=len(p)).double()
    support = p > 0
    if counts[~support].any():
        return 0.0
    expected = p[support] / p[support].sum() * len(tokens)
    return float(stats.chisquare(counts[support].numpy(), expected.numpy()).pvalue)


# --- speculative_accept: edge cases ---------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_p_equal_q_accepts_every_draft_token(device):
    g = gen(1, device)
    for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16):
        probs = torch.softmax(torch.randn(5, 50, generator=gen(2)), -1).to(device, dtype)
        for _ in range(50):
            tokens = sample(probs[:4].float(), g)
            n, nxt = speculative_accept(probs, probs[:4], tokens, g)
            assert n == 4
            assert probs[4, nxt] > 0


def test_draft_token_with_zero_draft_probability_is_accepted_iff_target_allows_it():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    g = gen()
    for _ in range(100):
        assert speculative_accept(p, q, torch.tensor([1, 1]), g) == (2, 2)
    # p(x) = q(x) = 0: rejected; the residual max(0, p - q) is all on token 1.
    for _ in range(100):
        assert speculative_accept(p, q, torch.tensor([2, 1]), g) == (0, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_disjoint_supports_reject_at_once_and_resample_from_p(device):
    p = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.4, 0.3, 0.2, 0.1]).repeat(4, 1).to(device)
    q = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0]).repeat(3, 1).to(device)
    g = gen(3, device)
    seen = set()
    for _ in range(200):
        n, nxt = speculative_accept(p, q, sample(q, g), g)
        assert n == 0
        seen.add(nxt)
    assert seen == {4, 5, 6, 7}


def test_one_hot_p_and_q():
    eye = torch.eye(6)
    g = gen()
    assert speculative_accept(eye[[2, 3, 4]], eye[[2, 3]], torch.tensor([2, 3]), g) == (2, 4)
    assert speculative_accept(eye[[2, 3, 4]], eye[[2, 5]], torch.tensor([2, 5]), g) == (1, 3)
    assert speculative_accept(eye[[2, 3, 4]], eye[[1, 3]], torch.tensor([1, 3]), g) == (0, 2)


def test_k_zero_samples_from_p0():
    g = gen(4)
    no_tokens = torch.empty(0, dtype=torch.long)
    assert speculative_accept(torch.eye(5)[[3]], torch.empty(0, 5), no_tokens, g) == (0, 3)
    tokens = [speculative_accept(P[None], torch.empty(0, 8), no_tokens, g)[1] for _ in range(4000)]
    assert chisquare_p(tokens, P) > P_VALUE_OK


def forced_rejections(target, draft, draft_token, g, n_draws=3000) -> list[int]:
    tokens = []
    for _ in range(n_draws):
        n, nxt = speculative_accept(target, draft, torch.tensor([draft_token]), g)
        assert n == 0
        tokens.append(nxt)
    return tokens


def test_residual_zero_up_to_rounding_falls_back_to_p():
    """p = q + 1e-12 noise, which float32 rounds to p = q but one ulp up on token 1. A rejection
    is forced at draft token 0 (q(0) = 1e-9, p(0) = 0). The residual max(0, p - q) is then that
    one ulp, rounding noise: drawing from it would always give token 1; the next token must
    come from p instead."""
    g = gen(5)
    q = torch.softmax(torch.randn(8, generator=g, dtype=torch.float64), -1)
    q[0] = 1e-9
    p = q + 1e-12 * torch.rand(8, generator=g, dtype=torch.float64)
    p[0] = 0.0
    p = p / p.sum()
    q32, p32 = q.float(), p.float()
    p32[2:] = q32[2:]
    p32[1] = torch.nextafter(q32[1], torch.tensor(1.0))
    tokens = forced_rejections(torch.stack([p32, p32]), q32[None], 0, g)
    assert chisquare_p(tokens, p) > P_VALUE_OK
    # In float64 the ~1e-9 residual is real (above float64 rounding) and is what gets sampled.
    tokens = forced_rejections(torch.stack([p, p]), q[None], 0, g, n_draws=200)
    assert 0 not in tokens
    assert set(tokens) <= set((p - q).gt(0).nonzero().flatten().tolist())


def test_exactly_zero_residual_falls_back_to_p():
    # p below q everywhere (p unnormalised): rejections happen but max(0, p - q) is all zero.
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    p = torch.tensor([0.0, 0.25, 0.25, 0.125], dtype=torch.float64)
    tokens = forced_rejections(torch.stack([p, p]), q[None], 0, gen(6))
    assert chisquare_p(tokens, p) > P_VALUE_OK


def test_returns_python_ints():
    n, nxt = speculative_accept(torch.stack([P, P]), Q[None], torch.tensor([0]), gen())
    assert type(n) is int and type(nxt) is int
    n, nxt = greedy_accept(torch.stack([P, P]), torch.tensor([0]))
    assert type(n) is int and type(nxt) is int


@pytest.mark.parametrize(
    "target, draft, tokens",
    [
        (torch.rand(3, 5), torch.rand(2, 5), torch.tensor([[0, 1]])),  # tokens not [K]
        (torch.rand(2, 5), torch.rand(2, 5), torch.tensor([0, 1])),  # target not [K+1, V]
        (torch.rand(3), torch.rand(2, 5), torch.tensor([0, 1])),  # target 1-d
        (torch.rand(3, 5), torch.rand(1, 5), torch.tensor([0, 1])),  # draft not [K, V]
        (torch.rand(3, 5), torch.rand(2, 4), torch.tensor([0, 1])),  # vocab mismatch
        (torch.rand(3, 5), torch.rand(2, 5), torch.tensor([0.0, 1.0])),  # float tokens
        (torch.ones(3, 5, dtype=torch.long), torch.rand(2, 5), torch.tensor([0, 1])),  # int p
        (torch.rand(1, 0), torch.rand(0, 0), torch.tensor([], dtype=torch.long)),  # V = 0
    ],
)
def test_bad_shapes_raise_value_error(target, draft, tokens):
    with pytest.raises(ValueError):
        speculative_accept(target, draft, tokens)


def test_seeded_calls_are_reproducible():
    target = torch.softmax(torch.randn(5, 100, generator=gen(7)), -1)
    draft = torch.softmax(torch.randn(4, 100, generator=gen(8)), -1)
    tokens = sample(draft, gen(9))
    runs = [[speculative_accept(target, draft, tokens, g) for _ in range(20)]
            for g in (gen(10), gen(10))]
    assert runs[0] == runs[1]


def test_uniforms_drawn_beforehand_give_the_verdicts_own_draws():
    """A verdict on `verdict_uniforms` drawn beforehand (what a CUDA graph replays) equals one
    drawing from the same generator itself, call after call, so the pipelined loop keeps the
    synced loop's random stream. Negative control: the two draws swapped do not."""
    target = torch.softmax(torch.randn(5, 100, generator=gen(7)), -1)
    draft = torch.softmax(torch.softmax(torch.randn(4, 100, generator=gen(8)), -1) * 50, -1)
    tokens = sample(draft, gen(9))
    own, given, swapped = gen(10), gen(10), gen(10)
    verdicts = [[], [], []]
    for _ in range(40):
        verdicts[0].append(speculative_verdict(target, draft, tokens, own).tolist())
        u = verdict_uniforms(4, given, target.device)
        verdicts[1].append(speculative_verdict(target, draft, tokens, u=u).tolist())
        u_next = torch.rand(1, 1, generator=swapped, dtype=torch.float64)
        u_accept = torch.rand(4, generator=swapped, dtype=torch.float64)
        verdicts[2].append(speculative_verdict(target, draft, tokens, u=(u_accept, u_next))
                           .tolist())
    assert verdicts[1] == verdicts[0]
    assert len({n for n, _ in verdicts[0]}) > 1  # the accept tests decide, not only p and q
    assert verdicts[2] != verdicts[0]


def test_one_host_sync_per_call(monkeypatch):
    syncs = []
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            syncs.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    target = torch.softmax(torch.randn(5, 100, generator=gen(11)), -1)
    draft = torch.softmax(torch.randn(4, 100, generator=gen(12)), -1)
    speculative_accept(target, draft, torch.tensor([1, 2, 3, 4]), gen())
    assert syncs == ["tolist"]
    syncs.clear()
    greedy_accept(target, torch.tensor([1, 2, 3, 4]))
    assert syncs == ["tolist"]


# --- exactness of the closed form -----------------------------------------------------------


@pytest.mark.parametrize("concentration", [0.01, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("v", [2, 3, 17, 256, 5000])
def test_emitted_distribution_is_p_for_random_pairs(concentration, v):
    g = gen(v)
    for _ in range(5):
        p, q = dirichlet(v, concentration, g), dirichlet(v, concentration, g)
        assert torch.allclose(emitted_distribution(p, q), p, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    "p, q",
    [
        (P, Q),
        (P, P),  # no rejection: the residual is all zero
        (torch.eye(4, dtype=torch.float64)[0], torch.eye(4, dtype=torch.float64)[3]),  # disjoint
        (torch.eye(4, dtype=torch.float64)[2], torch.eye(4, dtype=torch.float64)[2]),  # one-hot
        (torch.tensor([0.5, 0.5], dtype=torch.float64), torch.tensor([1.0, 0.0],
                                                                     dtype=torch.float64)),
    ],
)
def test_emitted_distribution_is_p_on_edge_cases(p, q):
    assert torch.allclose(emitted_distribution(p, q), p, rtol=0, atol=1e-9)


def test_emitted_distribution_batches_and_rejects_shape_mismatch():
    g = gen(13)
    p = torch.stack([dirichlet(50, 0.5, g) for _ in range(6)]).reshape(2, 3, 50)
    q = torch.stack([dirichlet(50, 0.5, g) for _ in range(6)]).reshape(2, 3, 50)
    assert torch.allclose(emitted_distribution(p, q), p, rtol=0, atol=1e-9)
    with pytest.raises(ValueError):
        emitted_distribution(p, q[0])


def test_exactness_tolerance_catches_a_wrong_resample():
    # Negative control: resampling from p instead of the residual is far from p at 1e-9.
    wrong = torch.minimum(P, Q) + (1 - BETA) * P
    assert (wrong - P).abs().max() > 1e-3


# --- Monte Carlo: the emitted token is distributed as p ---------------------------------------


def correct_step(target, draft, x, g):
    n, nxt = speculative_accept(target, draft, x, g)
    return (int(x), n) if n == 1 else (nxt, n)


def accept_everything(target, draft, x, g):
    return int(x), 1


def resample_from_p(target, draft, x, g):
    n, _ = speculative_accept(target, draft, x, g)
    return (int(x), n) if n == 1 else (int(sample(target[0], g)), n)


def emitted_k1(step) -> tuple[list[int], list[int]]:
    """K = 1, the draft token drawn from Q each time: (emitted tokens, accepted counts)."""
    g = gen(2023)
    drafts = torch.multinomial(Q, N_DRAWS, replacement=True, generator=g)
    target, draft = torch.stack([P, P]), Q[None]
    out = [step(target, draft, drafts[i : i + 1], g) for i in range(N_DRAWS)]
    return [token for token, _ in out], [n for _, n in out]


@pytest.fixture(scope="module")
def correct_k1():
    return emitted_k1(correct_step)


def test_emitted_tokens_follow_p(correct_k1):
    tokens, _ = correct_k1
    assert chisquare_p(tokens, P) > P_VALUE_OK


def test_acceptance_rate_is_beta(correct_k1):
    _, accepted = correct_k1
    rate = sum(accepted) / N_DRAWS
    se = math.sqrt(BETA * (1 - BETA) / N_DRAWS)
    assert abs(rate - BETA) < 4 * se


@pytest.mark.parametrize("broken", [accept_everything, resample_from_p])
def test_negative_control_broken_samplers_fail_the_chisquare(broken):
    tokens, _ = emitted_k1(broken)
    assert chisquare_p(tokens, P) < P_VALUE_BROKEN


def test_k3_each_emitted_position_follows_its_p_and_runs_have_the_right_length():
    """K = 3, a different (p_i, q_i) per position: the token emitted at position j (when one
    is) follows p_j, and P(n >= j) = prod_{i<j} beta_i."""
    k, v, draws = 3, 6, 6000
    g = gen(31)
    p = torch.stack([dirichlet(v, 2.0, g) for _ in range(k + 1)])
    q = torch.stack([dirichlet(v, 2.0, g) for _ in range(k)])
    beta = torch.minimum(p[:k], q).sum(-1)
    drafts = torch.multinomial(q, draws, replacement=True, generator=g).T
    emitted: list[list[int]] = [[] for _ in range(k + 1)]
    runs = []
    for x in drafts:
        n, nxt = speculative_accept(p, q, x, g)
        for j, token in enumerate([*x[:n].tolist(), nxt]):
            emitted[j].append(token)
        runs.append(n)
    for j in range(k + 1):
        assert chisquare_p(emitted[j], p[j]) > P_VALUE_OK
    reach = torch.cat([torch.ones(1, dtype=torch.float64), beta.cumprod(0)])
    expected = torch.cat([reach[:k] * (1 - beta), reach[k:]])
    observed = torch.bincount(torch.tensor(runs), minlength=k + 1).double()
    expected = expected / expected.sum() * draws
    assert stats.chisquare(observed.numpy(), expected.numpy()).pvalue > P_VALUE_OK
    # Negative control: counting every acceptance, not the leading run, is a binomial.
    wrong = torch.tensor([math.comb(k, j) for j in range(k + 1)], dtype=torch.float64)
    mean_beta = float(beta.mean())
    wrong *= torch.tensor([mean_beta**j * (1 - mean_beta) ** (k - j) for j in range(k + 1)])
    wrong = wrong / wrong.sum() * draws
    assert stats.chisquare(observed.numpy(), wrong.numpy()).pvalue < P_VALUE_BROKEN


# --- greedy_accept ----------------------------------------------------------------------------


def logits_with_argmax(argmaxes: list[int], v: int = 7) -> torch.Tensor:
    logits = torch.randn(len(argmaxes), v, generator=gen(len(argmaxes)))
    logits[torch.arange(len(argmaxes)), torch.tensor(argmaxes)] = 10.0
    return logits


@pytest.mark.parametrize(
    "argmaxes, draft, expected",
    [
        ([1, 2, 3, 4], [1, 2, 3], (3, 4)),  # all match: bonus from position K
        ([1, 2, 3, 4], [0, 2, 3], (0, 1)),  # first mismatches
        ([1, 2, 3, 4], [1, 5, 3], (1, 2)),  # mismatch in the middle, a later match ignored
        ([1, 2, 3, 4], [1, 2, 6], (2, 3)),
        ([5], [], (0, 5)),  # K = 0
    ],
)
def test_greedy_accept(argmaxes, draft, expected):
    logits = logits_with_argmax(argmaxes)
    tokens = torch.tensor(draft, dtype=torch.long)
    assert greedy_accept(logits, tokens) == expected
    assert greedy_accept(torch.softmax(logits, -1), tokens) == expected


def test_greedy_accept_bad_shapes():
    with pytest.raises(ValueError):
        greedy_accept(torch.rand(3, 5), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError):
        greedy_accept(torch.rand(3, 5), torch.tensor([[0, 1]]))


# --- warp and sample --------------------------------------------------------------------------


def test_warp_temperature_zero_is_one_hot_argmax():
    logits = torch.randn(2, 3, 11, generator=gen(14))
    probs = warp(logits, temperature=0.0, top_k=3, top_p=0.5)
    assert probs.dtype == torch.float32
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 11).float())


def test_warp_temperature_scales_logits():
    logits = torch.randn(4, 20, generator=gen(15), dtype=torch.float16)
    assert torch.allclose(warp(logits, 0.7), torch.softmax(logits.float() / 0.7, -1))
    assert torch.allclose(warp(logits, 1.0).sum(-1), torch.ones(4))


def test_warp_top_k_keeps_k_tokens():
    logits = torch.randn(5, 30, generator=gen(16))
    for k in (1, 3, 29):
        probs = warp(logits, 0.8, top_k=k)
        assert ((probs > 0).sum(-1) == k).all()
        assert torch.equal(probs.argmax(-1), logits.argmax(-1))
        assert torch.allclose(probs.sum(-1), torch.ones(5))
    assert torch.allclose(warp(logits, 0.8, top_k=30), warp(logits, 0.8))


@pytest.mark.parametrize("top_p, kept", [(0.3, [0]), (0.5, [0]), (0.75, [0, 1]),
                                         (0.85, [0, 1, 2]), (0.99, [0, 1, 2, 3])])
def test_warp_top_p_keeps_the_nucleus(top_p, kept):
    probs = torch.tensor([0.15, 0.05, 0.5, 0.3])  # order by mass: 2, 3, 0, 1
    order = [2, 3, 0, 1]
    warped = warp(probs.log(), top_p=top_p)
    nucleus = sorted(order[i] for i in kept)
    assert (warped > 0).nonzero().flatten().tolist() == nucleus
    assert torch.allclose(warped[nucleus], probs[nucleus] / probs[nucleus].sum())
    assert math.isclose(float(warped.sum()), 1.0, rel_tol=1e-6)


def test_warp_top_k_then_top_p_on_a_batch():
    logits = torch.randn(3, 4, 50, generator=gen(17))
    probs = warp(logits, 1.3, top_k=10, top_p=0.6)
    assert probs.shape == logits.shape
    assert ((probs > 0).sum(-1) <= 10).all()
    assert ((probs > 0).sum(-1) >= 1).all()
    assert torch.allclose(probs.sum(-1), torch.ones(3, 4))


@pytest.mark.parametrize("kwargs", [{"temperature": -1.0}, {"top_k": -1}, {"top_p": 0.0},
                                    {"top_p": 1.5}])
def test_warp_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        warp(torch.randn(5), **kwargs)


def test_sample_shapes_and_determinism():
    probs = warp(torch.randn(2, 3, 9, generator=gen(18)))
    drawn = sample(probs, gen(19))
    assert drawn.shape == (2, 3) and drawn.dtype == torch.long
    assert torch.equal(drawn, sample(probs, gen(19)))
    assert sample(torch.eye(9)[4], gen()).item() == 4
    assert sample(torch.eye(9)[4], gen()).shape == ()


def test_inverse_cdf_never_lands_on_a_zero_weight():
    """Zero weights at the start, the middle and the end span empty intervals of the normalised
    running sum: every u in [0, 1) lands on a token of positive weight, the largest double below
    1 (where u * total could round up to total) on the last one, a span's left edge on its own."""
    w = torch.tensor([0.0, 0.3, 0.0, 0.2, 0.5, 0.0, 0.0], dtype=torch.float64) * 3.7
    cdf = w.cumsum(-1)
    edges = (cdf / cdf[-1]).unique()
    top = torch.tensor([1 - 2**-53], dtype=torch.float64)
    u = torch.cat([torch.linspace(0, 1, 10_001, dtype=torch.float64)[:-1], edges[edges < 1], top])
    drawn = _invert_cdf(cdf, u[:, None])
    assert drawn.shape == u.shape
    assert (w[drawn] > 0).all()
    assert drawn[-1] == 4 and _invert_cdf(cdf, torch.zeros(1, dtype=torch.float64)) == 1
    assert _invert_cdf(cdf, (cdf[1] / cdf[-1]).reshape(1)) == 3
    batch = torch.stack([w, w.flip(0)])  # rows of a batch each against their own sum
    assert _invert_cdf(batch.cumsum(-1), torch.stack([top, top])).tolist() == [4, 5]


# --- expected speedup -------------------------------------------------------------------------


def test_expected_speedup_known_values():
    assert math.isclose(expected_speedup(0.8, 4, 0.1), (1 - 0.8**5) / (0.2 * 1.4))
    assert math.isclose(expected_speedup(0.8, 4, 0.1), 2.4011428571428572)
    assert math.isclose(expected_speedup(0.5, 2, 0.0), 1.75)
    assert math.isclose(expected_speedup(0.0, 3, 0.2), 1 / 1.6)
    assert math.isclose(expected_tokens_per_call(0.5, 2), 1.75)
    assert expected_tokens_per_call(0.0, 7) == 1.0


def test_expected_speedup_alpha_one_limit():
    assert expected_speedup(1.0, 4, 0.1) == 5 / 1.4
    assert expected_tokens_per_call(1.0, 6) == 7.0
    for alpha in (1 - 1e-6, 1 - 1e-12):
        assert math.isclose(expected_speedup(alpha, 4, 0.1), 5 / 1.4, rel_tol=1e-5)
    # Near 1 the closed form is still the geometric sum, to full precision.
    alpha = 1 - 1e-9
    assert math.isclose(expected_tokens_per_call(alpha, 5), sum(alpha**i for i in range(6)),
                        rel_tol=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1.0])
def test_expected_speedup_k_zero_is_one(alpha):
    assert expected_speedup(alpha, 0, 0.3) == 1.0
    assert expected_tokens_per_call(alpha, 0) == 1.0


@pytest.mark.parametrize("alpha, k, c", [(-0.1, 2, 0.1), (1.1, 2, 0.1), (0.5, -1, 0.1),
                                         (0.5, 1.5, 0.1), (0.5, 2, -0.1)])
def test_expected_speedup_rejects_bad_arguments(alpha, k, c):
    with pytest.raises(ValueError):
        expected_speedup(alpha, k, c)


def test_sample_on_given_uniforms_inverts_the_cdf():
    """A uniform picks the token whose span of the running sum holds it; zero weights span
    nothing, and u near 1 stays inside the last span."""
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.5, 0.25]])
    picks = [sample(probs, u=torch.tensor([[u]], dtype=torch.float64)).item()
             for u in (0.0, 0.2, 0.25, 0.7, 0.75, 1 - 1e-16)]
    assert picks == [1, 1, 3, 3, 4, 4]
