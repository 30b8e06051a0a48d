import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from decodelab.studies.verification import equivalence as eq

# Seeded statistical tests are deterministic; these are their tolerances.
P_VALUE_OK, P_VALUE_BROKEN = 1e-3, 1e-6
FAILS = 1e3 * eq.TOL  # a wrong rule must miss p by far more than rounding

# beta = 0.45, and a token (3) the draft can never propose.
P = torch.tensor([0.30, 0.05, 0.20, 0.02, 0.13, 0.10, 0.15, 0.05], dtype=torch.float64)
Q = torch.tensor([0.05, 0.30, 0.10, 0.00, 0.05, 0.25, 0.05, 0.20], dtype=torch.float64)

TARGET, DRAFT = eq.toy_model(3, seed=1), eq.toy_model(3, seed=2)


def sparse(model, vocab):
    """A draft with a zero at one token per prefix (q = 0 where p > 0)."""
    def row(prefix):
        r = model(prefix).clone()
        r[len(prefix) % vocab] = 0
        return r / r.sum()
    return row


# --- the rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", eq.SAMPLERS)
def test_every_rule_has_speculative_accepts_contract(name):
    g = torch.Generator().manual_seed(0)
    p, q = torch.stack([P, P, P]), torch.stack([Q, Q])
    for _ in range(50):
        n, token = eq.SAMPLERS[name](p, q, torch.tensor([0, 5]), g)
        assert 0 <= n <= 2 and 0 <= token < len(P)
    assert eq.accept_all(p, q, torch.tensor([1, 1]), g)[0] == 2
    assert eq.resample_from_p(p, p[:2], torch.tensor([3, 0]), g)[0] == 2  # p = q keeps all


# --- level 1: exact, one step ---------------------------------------------------------------


@pytest.mark.parametrize("vocab", [2, 3, 10, 100, 1000, 50257])
def test_exact_single_on_dirichlet_pairs(vocab):
    for concentration in (0.01, 0.1, 0.3, 1.0, 10.0):
        for seed in range(3):
            p, q = eq.dirichlet_pair(vocab, concentration, seed)
            assert eq.exact_single(p, q, "correct") <= eq.TOL
            if concentration >= 0.3:  # below, p is nearly one-hot, where resample_from_p is right
                for name in eq.WRONG:
                    assert eq.exact_single(p, q, name) > FAILS, (name, concentration, seed)


def test_exact_single_on_edge_cases():
    cases = eq.edge_cases()
    for name, (p, q) in cases.items():
        assert eq.exact_single(p, q, "correct") <= eq.TOL, name
    failed = {s: {c for c, (p, q) in cases.items() if eq.exact_single(p, q, s) > FAILS}
              for s in eq.WRONG}
    # accept_all emits q: wrong wherever q != p.
    assert failed["accept_all"] == set(cases) - {"p equals q", "p nearly q (residual ~ eps)",
                                                 "both one-hot, same"}
    # resample_from_p emits min(p, q) + (1 - beta) p: right only where q = beta p on supp(p).
    assert failed["resample_from_p"] == {"q zero where p > 0", "one-hot q", "vocabulary of two"}


def test_emitted_law_is_a_batched_law():
    p, q = torch.stack([P, Q]), torch.stack([Q, P])
    for name in eq.SAMPLERS:
        law = eq.emitted_law(name, p, q)
        assert law.shape == (2, 8) and torch.allclose(law.sum(-1), torch.ones(2, dtype=law.dtype))
    assert eq.exact_single(p, q) <= eq.TOL
    with pytest.raises(ValueError):
        eq.emitted_law("nonsense", P, Q)


# --- level 1: exact, whole blocks -----------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("clip", [True, False])
def test_exact_block_correct_passes_and_wrong_rules_fail(k, clip):
    for draft in (DRAFT, sparse(DRAFT, 3), TARGET):
        errors = eq.exact_block("correct", TARGET, draft, k, clip=clip)
        assert list(errors) == list(range(1, k + 2))
        assert max(errors.values()) <= eq.TOL
    for name in eq.WRONG:
        assert max(eq.exact_block(name, TARGET, DRAFT, k, clip=clip).values()) > 1e-3, name
        # a draft equal to the target is never wrong, whatever the rule
        assert max(eq.exact_block(name, TARGET, TARGET, k, clip=clip).values()) <= eq.TOL


def test_exact_block_beyond_one_block_on_a_larger_vocabulary():
    target, draft = eq.toy_model(4, seed=3, concentration=0.5), eq.toy_model(4, seed=4)
    assert max(eq.exact_block("correct", target, draft, 2, m_max=5).values()) <= eq.TOL


def test_block_law_is_a_law_over_one_to_k_plus_one_tokens():
    for name in eq.SAMPLERS:
        law = eq.block_law(name, TARGET, DRAFT, 3)
        assert sum(law.values()) == pytest.approx(1, abs=1e-12)
        lengths = {len(y) for y, w in law.items() if w > 0}
        assert lengths == ({4} if name == "accept_all" else {1, 2, 3, 4})


def test_the_first_token_of_an_unclipped_block_has_the_one_step_law():
    p, q = TARGET(()), DRAFT(())
    for name in eq.SAMPLERS:
        first = eq.stream_law(name, TARGET, DRAFT, 2, 1, clip=False)
        law = torch.tensor([first[(y,)] for y in range(3)], dtype=torch.float64)
        assert torch.allclose(law, eq.emitted_law(name, p, q), atol=1e-15, rtol=0)


# --- level 2: Monte Carlo -------------------------------------------------------------------


def test_monte_carlo_single_step():
    assert eq.monte_carlo_single("correct", P, Q, 10_000, seed=0)["p_value"] > P_VALUE_OK
    for name in eq.WRONG:
        assert eq.monte_carlo_single(name, P, Q, 10_000, seed=0)["p_value"] < P_VALUE_BROKEN


@pytest.mark.parametrize("k,m", [(2, 3), (3, 4)])
def test_monte_carlo_block(k, m):
    ok = eq.monte_carlo_block("correct", TARGET, DRAFT, k, m, 3000, seed=0)
    assert ok["p_value"] > P_VALUE_OK and ok["dof"] > 10
    for name in eq.WRONG:
        assert eq.monte_carlo_block(name, TARGET, DRAFT, k, m, 3000, seed=0)["p_value"] \
            < P_VALUE_BROKEN


def test_goodness_of_fit_pools_rare_bins_and_rejects_impossible_tokens():
    law = np.array([0.5, 0.3, 0.19, 0.005, 0.005, 0.0])
    assert eq.goodness_of_fit([50, 30, 19, 1, 0, 0], law)["dof"] == 2  # 1 + 0 + 0 pooled into 19
    out = eq.goodness_of_fit([50, 30, 19, 0, 0, 1], law)
    assert out["p_value"] == 0.0 and out["chi2"] == np.inf


# --- level 3: two-sample test on categorical samples ----------------------------------------


def zipf(vocab=1000, s=1.1):
    w = 1 / np.arange(1, vocab + 1) ** s
    return w / w.sum()


def test_two_sample_test_on_categorical_samples():
    rng = np.random.default_rng(0)
    law = zipf()
    a, b = rng.choice(1000, 20_000, p=law), rng.choice(1000, 20_000, p=law)
    same = eq.two_sample_test(a.tolist(), b.tolist())
    assert same["dof"] == 200 and same["p_value"] > 0.01
    assert np.array(same["table"]).shape == (2, 201) and np.sum(same["table"]) == 40_000
    # every token's probability scaled by exp(0.2 z), z ~ N(0, 1): total variation 0.06
    shifted = law * np.exp(0.2 * np.random.default_rng(99).standard_normal(1000))
    c = rng.choice(1000, 20_000, p=shifted / shifted.sum())
    assert eq.two_sample_test(a.tolist(), c.tolist())["p_value"] < 0.01


def test_two_sample_test_without_an_other_bin():
    a, b = [0, 1, 2] * 20, [2, 1, 0] * 20
    out = eq.two_sample_test(a, b, top=200)
    assert out["dof"] == 2 and out["p_value"] == pytest.approx(1)
    assert out["p_asymptotic"] == pytest.approx(1)


def sticky_sequences(law, n_seq, budget, stay, rng):
    """Sequences that mostly repeat their previous token (a peaked model copying itself): every
    token's marginal law is `law`, but tokens of one sequence are strongly dependent."""
    out = np.empty((n_seq, budget), dtype=int)
    out[:, 0] = rng.choice(len(law), n_seq, p=law)
    for t in range(1, budget):
        fresh = rng.choice(len(law), n_seq, p=law)
        out[:, t] = np.where(rng.random(n_seq) < stay, out[:, t - 1], fresh)
    return out.ravel().tolist()


def test_sequence_permutations_calibrate_the_chi_square_on_dependent_tokens():
    """Two samples of the same sticky process: the token-level chi-square law rejects far more
    often than alpha, the sequence-permutation p-value about alpha; a different law is still
    rejected (the negative control)."""
    law = zipf(50)
    other = zipf(50, s=1.6)
    token_level, permuted, control = [], [], []
    for seed in range(30):
        rng = np.random.default_rng(seed)
        a, b, c = (sticky_sequences(w, 144, 64, 0.9, rng) for w in (law, law, other))
        same = eq.two_sample_test(a, b, top=40, budget=64, permutations=499, seed=seed)
        token_level.append(same["p_asymptotic"] < 0.05)
        permuted.append(same["p_value"] < 0.05)
        control.append(eq.two_sample_test(a, c, top=40, budget=64, permutations=499,
                                          seed=seed)["p_value"] < 0.05)
    assert np.mean(token_level) > 0.5
    assert np.mean(permuted) <= 0.15
    assert np.mean(control) >= 0.9


def test_two_sample_test_needs_whole_sequences_of_equal_samples():
    with pytest.raises(ValueError, match="whole sequences"):
        eq.two_sample_test([1, 2, 3], [1, 2, 3], budget=2)


# --- power ----------------------------------------------------------------------------------


# 10 seeds: the correct rule may be rejected at 2 of them (at alpha 0.05, 1 expected), a wrong
# one missed at 1 (every wrong rule is rejected at all 20 seeds of this size: p < 2e-4)
POWER_SEEDS = range(10)


def test_power_single_step():
    level = eq.single_level(P, Q, 1000)
    assert eq.power(level, "correct", POWER_SEEDS, alpha=0.05) <= 0.2
    for name in eq.WRONG:
        assert eq.power(level, name, POWER_SEEDS, alpha=0.01) >= 0.9


@pytest.mark.slow  # 30 Monte Carlo runs of 800 blocks: the power needs them
def test_power_block():
    level = eq.block_level(TARGET, DRAFT, k=2, m=3, n=800)
    assert eq.power(level, "correct", POWER_SEEDS, alpha=0.05) <= 0.2
    for name in eq.WRONG:
        assert eq.power(level, name, POWER_SEEDS, alpha=0.01) >= 0.9


# --- the real-model entry points, on tiny random models -------------------------------------


def tiny(seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    # A wide init makes the distributions peaked, so target and draft differ clearly.
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=128,
                     initializer_range=0.3, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg).eval()


@pytest.fixture(scope="module")
def pair():
    return tiny(0), tiny(1)


PROMPTS = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]


def test_real_pairs_check_on_tiny_models(pair):
    out = eq.real_pairs_check(*pair, PROMPTS, positions=10)
    assert out["pairs"] == 10 and out["vocab"] == 64
    assert out["max_error"]["correct"] <= eq.TOL
    assert all(out["max_error"][name] > FAILS for name in eq.WRONG)


def test_sample_tokens_is_seeded_and_sized(pair):
    a = eq.sample_tokens(*pair, PROMPTS, 50, "correct", k=3, seed=0, budget=16)
    assert len(a) == 64 and all(0 <= t < 64 for t in a)
    assert a == eq.sample_tokens(*pair, PROMPTS, 50, "correct", k=3, seed=0, budget=16)
    assert a != eq.sample_tokens(*pair, PROMPTS, 50, "correct", k=3, seed=1, budget=16)
    ar = eq.sample_tokens(*pair, PROMPTS, 50, "autoregressive", k=3, seed=0, budget=16)
    assert len(ar) == 64 and ar != a
    with pytest.raises(ValueError):
        eq.sample_tokens(*pair, PROMPTS, 50, "nonsense", k=3, seed=0)


def test_level_three_rejects_accept_all_on_tiny_models(pair):
    level = eq.real_model_level(*pair, PROMPTS, n_tokens=480, k=4, budget=32, top=20)
    assert level("correct", 0)["p_value"] > 0.01
    assert level("accept_all", 0)["p_value"] < 0.01


def test_log_ratio_test_rejects_both_wrong_rules_on_tiny_models(pair):
    level = eq.real_model_level(*pair, PROMPTS, n_tokens=480, k=4, budget=32, test="log_ratio")
    for name in eq.SAMPLERS:  # one autoregressive sample for all three
        out = level(name, 0)
        assert out["sequences"] == 15
        assert (out["p_value"] > 0.01) if name == "correct" else (out["p_value"] < 0.01), name


def test_greedy_agreement(pair):
    target, draft = pair
    same = eq.greedy_agreement(target, target, PROMPTS, 12, k=3)
    assert same == {"fraction_equal": 1.0, "divergences": []}
    out = eq.greedy_agreement(target, draft, PROMPTS, 12, k=3)
    assert 0 <= out["fraction_equal"] <= 1
    for d in out["divergences"]:
        assert 0 <= d["position"] < 12 and d["margin"] >= 0
