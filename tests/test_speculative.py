import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

from decodelab.analysis.theory import alpha_from_tokens_per_call
from decodelab.backends import models, sources
from decodelab.backends.devices import available_backends
from decodelab.config.settings import Sampling
from decodelab.core.errors import DecodelabError
from decodelab.engines import speculative
from decodelab.engines.decode import decode
from decodelab.engines.sampling import speculative_accept
from decodelab.engines.speculative import autoregressive, feed, generate, rollback

DEVICE_PAIRS = [(t, d) for t in ("cpu", "cuda", "mps") for d in ("cpu", "cuda", "mps")]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    sources.prepare({"source": "init", "preset": "gpt2-tiny", "seed": 1}, root / "target")
    sources.prepare({"source": "init", "preset": "opt-tiny", "seed": 2}, root / "draft")
    return root / "target", root / "draft"


def prompt(n=10, seed=0):
    return torch.randint(0, 8192, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    """A GPT-2 target and an OPT draft over a 4-token vocabulary, random and wide-spread enough
    (init std 0.5) that the target's greedy tokens vary and the draft agrees with some: both
    acceptance and rollback are exercised, in under a second for every K."""
    root = tmp_path_factory.mktemp("small-pair")
    torch.manual_seed(1)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=4, initializer_range=0.5,
                               bos_token_id=0, eos_token_id=0)).save_pretrained(root / "target")
    torch.manual_seed(2)
    OPTForCausalLM(OPTConfig(num_hidden_layers=1, hidden_size=32, ffn_dim=64, num_attention_heads=2,
                             word_embed_proj_dim=32, vocab_size=4, init_std=0.5, bos_token_id=0,
                             eos_token_id=0, pad_token_id=1)).save_pretrained(root / "draft")
    return root / "target", root / "draft"


@pytest.mark.parametrize("target_dev,draft_dev", DEVICE_PAIRS)
def test_greedy_speculative_equals_target_greedy(small_pair, target_dev, draft_dev):
    missing = {target_dev, draft_dev} - set(available_backends())
    if missing:
        pytest.skip(f"backend(s) {sorted(missing)} not available on this host")
    target = models.load(small_pair[0], target_dev)
    draft = models.load(small_pair[1], draft_dev)
    p = torch.randint(0, 4, (10,), generator=torch.Generator().manual_seed(0)).tolist()
    want = decode(target, torch.tensor([p], device=target_dev), 40).tokens
    assert len(set(want)) > 1  # not one token repeated: a draft cannot agree by default
    accepted, rejected = 0, 0
    for k in range(1, 9):
        got = generate(target, draft, p, 40, k)
        assert got.tokens == want, f"K={k}"
        assert len(got.tokens) == 40
        assert sum(got.accepted) + got.target_calls == 40
        accepted += sum(got.accepted)
        rejected += got.proposed - sum(got.accepted)
    assert accepted > 0 and rejected > 0  # both paths of the loop ran


def test_a_draft_equal_to_the_target_is_always_accepted(dirs):
    target = models.load(dirs[0], "cpu")
    for mode in (Sampling(), Sampling(temperature=1.0)):
        out = generate(target, target, prompt(), 33, 4, mode,
                       torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
        assert out.proposal_acceptance == 1.0 and out.alpha(4) == 1.0
        assert out.target_calls == 7  # 6 calls of 4+1 tokens, then one of 2+1 for the last 3


def test_sampled_run_is_seeded_and_emits_the_budget(dirs):
    target, draft = models.load(dirs[0], "cpu"), models.load(dirs[1], "cpu")

    def run(seed):
        return generate(target, draft, prompt(), 30, 3, Sampling(temperature=1.0),
                        torch.Generator().manual_seed(seed),
                        torch.Generator().manual_seed(seed + 1))

    a, b = run(5), run(5)
    assert a.tokens == b.tokens and len(a.tokens) == 30
    assert run(6).tokens != a.tokens
    assert 0 <= a.proposal_acceptance <= 1 and a.proposed > 0


def test_rollback_leaves_the_cache_a_fresh_prefix_would_build(dirs):
    model = models.load(dirs[0], "cpu")
    ids = torch.tensor(prompt(16))
    with torch.inference_mode():
        grown = DynamicCache(config=model.config)
        feed(model, grown, ids[:9])
        feed(model, grown, ids[9:])
        rollback(grown, 9)
        fresh = DynamicCache(config=model.config)
        feed(model, fresh, ids[:9])
        assert grown.get_seq_length() == 9
        for layer_a, layer_b in zip(grown.layers, fresh.layers, strict=True):
            assert torch.allclose(layer_a.keys, layer_b.keys, atol=1e-6)
            assert torch.allclose(layer_a.values, layer_b.values, atol=1e-6)
        # and decoding on from the rolled-back cache matches decoding from the fresh one
        a, b = feed(model, grown, ids[9:12]), feed(model, fresh, ids[9:12])
        assert torch.allclose(a, b, atol=1e-5)


def test_rollback_never_grows_or_empties(dirs):
    model = models.load(dirs[0], "cpu")
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        feed(model, cache, torch.tensor(prompt(5)))
        rollback(cache, 5)
        rollback(cache, 8)
        assert cache.get_seq_length() == 5


def test_vocabulary_mismatch_is_a_clear_error_before_any_work(dirs):
    target = models.load(dirs[0], "cpu")
    other = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100,
                                       bos_token_id=99, eos_token_id=99)).eval()
    with pytest.raises(DecodelabError, match="vocabularies differ"):
        generate(target, other, prompt(), 8, 2)


# -----------------------------------------------------------------------------
# a toy pair with a planted per-token acceptance

class ToyCache:
    """The cache interface the loop uses: the ids seen, cropped from the end."""

    def __init__(self):
        self.ids: list[int] = []

    def get_seq_length(self) -> int:
        return len(self.ids)

    def crop(self, length: int) -> None:
        del self.ids[length if length >= 0 else len(self.ids) + length:]


class ToyLM(torch.nn.Module):
    """A deterministic language: the next token is (7 x + 3) mod V. With `flip` > 0 each
    position's argmax moves to a wrong token with that probability, independently: a greedy
    draft the target accepts token by token with probability alpha = 1 - flip. `sleep`
    seconds per forward pass stand in for its cost."""

    def __init__(self, vocab=50, flip=0.0, seed=0, sleep=0.0):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # where the model lives
        self.flip, self.sleep = flip, sleep
        self.rng = torch.Generator().manual_seed(seed)
        self.name_or_path, self.dtype = "toy", torch.float32

    def new_cache(self) -> ToyCache:
        return ToyCache()

    def get_output_embeddings(self):
        return SimpleNamespace(out_features=self.config.vocab_size)

    def forward(self, input_ids, use_cache=True, past_key_values=None, logits_to_keep=0):
        ids = input_ids[0]
        past_key_values.ids += ids.tolist()
        vocab = self.config.vocab_size
        nxt = (7 * ids + 3) % vocab
        wrong = torch.rand(len(ids), generator=self.rng) < self.flip
        nxt = torch.where(wrong, (nxt + 1) % vocab, nxt)
        if self.sleep:
            time.sleep(self.sleep)
        logits = torch.nn.functional.one_hot(nxt, vocab).float() * 9
        return SimpleNamespace(logits=logits[-logits_to_keep:][None])


def alpha_interval(accepted: list[int], k: int, draws=4000, level=0.99, seed=0):
    """Alpha from tokens per call, with a percentile bootstrap over target calls (alpha rises
    with tokens per call, so the interval's ends are those of tokens per call, inverted)."""
    calls = np.asarray(accepted) + 1.0
    means = np.random.default_rng(seed).choice(calls, (draws, len(calls))).mean(axis=1)
    tail = (1 - level) / 2
    return tuple(alpha_from_tokens_per_call(t, k)
                 for t in (calls.mean(), *np.quantile(means, [tail, 1 - tail])))


@pytest.mark.parametrize("planted", [0.5, 0.8])
def test_alpha_recovers_the_planted_acceptance_and_per_proposal_falls_with_k(planted):
    """alpha from tokens per call finds the planted per-token acceptance at every K, within
    its interval; accepted / proposed falls with K below it (the quantity that must not enter
    Leviathan's formula); the interval rejects a wrong alpha (the negative control)."""
    target, budget = ToyLM(), 1201
    prompt = [1, 2, 3]
    want = autoregressive(target, prompt, budget).tokens
    per_proposal = {}
    for k in (1, 4, 8):
        draft = ToyLM(flip=1 - planted, seed=k)
        out = generate(target, draft, prompt, budget, k)
        assert out.tokens == want  # greedy: every accept and rollback kept the target's output
        full = out.accepted[:-1]  # the last call may propose fewer than K
        estimate, low, high = alpha_interval(full, k)
        assert low <= planted <= high, (k, estimate, low, high)
        assert not low <= planted - 0.1 <= high and not low <= planted + 0.1 <= high
        per_proposal[k] = sum(full) / (k * len(full))
        assert abs(out.alpha(k) - estimate) < 0.02
    assert abs(per_proposal[1] - planted) < 0.05
    assert per_proposal[8] < per_proposal[4] < per_proposal[1]
    assert per_proposal[8] < planted - 0.2


def test_greedy_accepts_and_rolls_back_with_a_draft_that_mostly_agrees(dirs):
    """A draft that is the target with slightly perturbed weights: some proposals accepted,
    some rejected, so both caches roll back partway; the output is still the target's."""
    target = models.load(dirs[0], "cpu")
    draft = models.load(dirs[0], "cpu")
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(0))
                       * 0.3 * param.std().nan_to_num(0))
    p = prompt()
    want = decode(target, torch.tensor([p]), 40).tokens
    for k in (2, 5):
        out = generate(target, draft, p, 40, k)
        assert out.tokens == want, f"K={k}"
        assert 0 < sum(out.accepted) < out.proposed, "the test needs partial acceptance"
        assert any(0 < n < k for n in out.accepted)


def test_after_the_prompt_every_id_is_built_on_the_device(dirs, monkeypatch):
    """One host copy per model and sequence, its prompt: each later iteration's ids come from
    the verdict's device tensors (the next token, and the last proposal after a full accept),
    and the tokens equal those of ids copied from the host every time."""
    target, draft = models.load(dirs[0], "cpu"), models.load(dirs[0], "cpu")
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(0))
                       * 0.3 * param.std().nan_to_num(0))
    copies = []
    to_device = speculative.to_device
    monkeypatch.setattr(speculative, "to_device", lambda t, d: copies.append(t) or to_device(t, d))
    p = prompt()

    def run(k, s):
        copies.clear()
        out = generate(target, draft, p, 40, k, s, torch.Generator().manual_seed(0),
                       torch.Generator().manual_seed(1))
        return out, list(copies)

    for s in (Sampling(), Sampling(temperature=1.0)):
        for k in (1, 3):
            out, copied = run(k, s)
            assert copied == [p, p], f"{s}, K={k}"
            assert k in out.accepted and min(out.accepted) < k  # full and partial accepts
            with monkeypatch.context() as m:
                m.setattr(speculative.Verdict, "tail", lambda *_: None)
                host, copied = run(k, s)
            assert len(copied) == 2 * out.target_calls and host.tokens == out.tokens


def test_the_fair_baseline_is_the_target_alone_in_the_same_loop(dirs):
    target = models.load(dirs[0], "cpu")
    p = prompt()
    out = autoregressive(target, p, 30)
    assert out.tokens == decode(target, torch.tensor([p]), 30).tokens
    assert out.target_calls == 30 and out.proposed == 0
    assert 0 < out.prefill_s < out.verify_s <= out.total_s
    s = Sampling(temperature=1.0)
    a, b = (autoregressive(target, p, 30, s, torch.Generator().manual_seed(3)) for _ in "ab")
    assert a.tokens == b.tokens


def test_forward_time_and_engine_overhead_are_apart():
    """Planted costs: draft_s and verify_s count the forward passes (10 ms per target pass,
    2 ms per draft pass); host work planted outside them (5 ms in the acceptance rule) lands in
    the overhead, not in the forward time."""
    target, s = ToyLM(sleep=0.010), Sampling(temperature=1.0)

    def run(accept):
        return generate(target, ToyLM(sleep=0.002, flip=0.3, seed=1), [1, 2, 3], 40, 3, s,
                        torch.Generator().manual_seed(0), torch.Generator().manual_seed(1),
                        accept)

    def slow_accept(*args):
        time.sleep(0.005)
        return speculative_accept(*args)

    plain, slow = run(speculative_accept), run(slow_accept)
    for out in (plain, slow):
        assert out.verify_s >= 0.010 * out.target_calls
        assert out.draft_s >= 0.002 * out.draft_forwards
        assert 0 < out.overhead_share < 1
        assert abs(out.draft_s + out.verify_s + out.overhead_s - out.total_s) < 1e-9
    assert plain.tokens == slow.tokens
    # lower bounds only: a shared machine can add time anywhere, never take the sleeps away
    assert slow.overhead_s >= 0.005 * slow.target_calls and slow.overhead_s > plain.overhead_s


def test_the_host_gap_is_the_hosts_turn_after_each_verdict(monkeypatch):
    """Host work planted after the sync (3 ms in the draft's rollback, before its next pass)
    lands in host_gap_s; work planted before it (5 ms in the acceptance rule) does not. The gap
    lies outside every pass, so it never exceeds the overhead."""
    target, draft, s = ToyLM(sleep=0.002), ToyLM(sleep=0.001, flip=0.3, seed=1), Sampling(1.0)
    rollback, new_cache, draft_caches = speculative.rollback, speculative.new_cache, []

    def run(accept=speculative_accept):
        return generate(target, draft, [1, 2, 3], 30, 3, s, torch.Generator().manual_seed(0),
                        torch.Generator().manual_seed(1), accept)

    def slow_accept(*args):
        time.sleep(0.005)
        return speculative_accept(*args)

    def recording(model):
        cache = new_cache(model)
        if model is draft:
            draft_caches.append(cache)
        return cache

    def slow_rollback(cache, keep):
        if cache is draft_caches[-1]:
            time.sleep(0.003)
        rollback(cache, keep)

    plain = run(slow_accept)
    monkeypatch.setattr(speculative, "new_cache", recording)
    monkeypatch.setattr(speculative, "rollback", slow_rollback)
    late = run()
    for out in (plain, late):
        assert 0 <= out.host_gap_s <= out.overhead_s
    assert late.host_gap_s >= 0.003 * (late.target_calls - 1)  # no verdict before the first
    # the acceptance rule's 5 ms per call runs before the sync, so not in the gap
    assert plain.host_gap_s < 0.0025 * plain.target_calls
