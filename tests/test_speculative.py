import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

from decodelab import models, sources
from decodelab.config import Sampling
from decodelab.decode import decode
from decodelab.devices import available_backends
from decodelab.errors import DecodelabError
from decodelab.speculative import feed, generate, rollback

DEVICE_PAIRS = [(t, d) for t in ("cpu", "cuda", "mps") for d in ("cpu", "cuda", "mps")]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    sources.prepare({"source": "init", "preset": "gpt2-tiny", "seed": 1}, root / "target")
    sources.prepare({"source": "init", "preset": "opt-tiny", "seed": 2}, root / "draft")
    return root / "target", root / "draft"


def prompt(n=10, seed=0):
    return torch.randint(0, 8192, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("target_dev,draft_dev", DEVICE_PAIRS)
def test_greedy_speculative_equals_target_greedy(dirs, target_dev, draft_dev):
    missing = {target_dev, draft_dev} - set(available_backends())
    if missing:
        pytest.skip(f"backend(s) {sorted(missing)} not available on this host")
    target = models.load(dirs[0], target_dev)
    draft = models.load(dirs[1], draft_dev)
    p = prompt()
    want = decode(target, torch.tensor([p], device=target_dev), 40).tokens
    for k in range(1, 9):
        got = generate(target, draft, p, 40, k)
        assert got.tokens == want, f"K={k}"
        assert len(got.tokens) == 40
        assert sum(got.accepted) + got.target_calls == 40


def test_a_draft_equal_to_the_target_is_always_accepted(dirs):
    target = models.load(dirs[0], "cpu")
    for mode in (Sampling(), Sampling(temperature=1.0)):
        out = generate(target, target, prompt(), 33, 4, mode,
                       torch.Generator().manual_seed(0), torch.Generator().manual_seed(1))
        assert out.acceptance_rate == 1.0
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
    assert 0 <= a.acceptance_rate <= 1 and a.proposed > 0


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
