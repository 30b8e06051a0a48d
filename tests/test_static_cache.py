"""The graph engine's static cache (`decodelab.engines.cuda.static_cache`): the logits of
transformers' own
`StaticCache` through prompts, steps, verifications and rollbacks, with one position for every
layer and one write per layer."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM, GPT2Config, StaticCache

from decodelab.core.errors import DecodelabError
from decodelab.engines.cuda import static_cache
from decodelab.engines.decode import cache_kwarg

LAYERS = 3


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=LAYERS, n_embd=64, n_head=4, vocab_size=64, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    return AutoModelForCausalLM.from_config(config).eval()


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def run(model, cache, ids: list[int], crop: int = 0) -> torch.Tensor:
    static_cache.move_back(cache, crop)  # as the graph engine rolls back (not all of
    # transformers 5 has `StaticLayer.crop`)
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=True,
                     **{cache_kwarg(model): cache}).logits


# a prompt, two steps, a verification of 4, a rollback of 2 and the step after it
PASSES = [([5, 9, 2, 7, 1], 0), ([3], 0), ([8], 0), ([4, 4, 6, 1], 0), ([2], 2)]


def test_a_paired_cache_gives_transformers_logits(model):
    ours, theirs = static_cache.new(model.config, 32), StaticCache(model.config, 32)
    for ids, crop in PASSES:
        torch.testing.assert_close(run(model, ours, ids, crop), run(model, theirs, ids, crop),
                                   rtol=0, atol=0)
    assert ours.get_seq_length().item() == theirs.get_seq_length().item() == 10
    torch.testing.assert_close(ours.layers[-1].keys[:, :, :10], theirs.layers[-1].keys[:, :, :10])


def test_its_layers_share_one_position_and_write_once(model):
    cache = static_cache.new(model.config, 32)
    run(model, cache, [5, 9, 2])
    assert len(static_cache.positions(cache)) == 1
    assert static_cache.positions(cache)[0].item() == 3  # advanced once, not once per layer
    with Ops() as ops:
        run(model, cache, [1])
    assert ops.names.count("index_copy_.default") == LAYERS  # keys and values together
    assert ops.names.count("add_.Tensor") == 1  # the one position, by the last layer
    cache.crop(-2)  # transformers' interface, moving the shared position once
    assert static_cache.positions(cache)[0].item() == 2
    with pytest.raises(ValueError, match="negative"):
        cache.crop(2)


def test_transformers_cache_writes_and_advances_per_layer(model):
    """The control: what the paired cache saves is there in transformers' own."""
    cache = StaticCache(model.config, 32)
    run(model, cache, [5, 9, 2])
    assert len(static_cache.positions(cache)) == LAYERS
    with Ops() as ops:
        run(model, cache, [1])
    assert ops.names.count("index_copy_.default") == 2 * LAYERS
    assert ops.names.count("add_.Tensor") == LAYERS


def test_a_layer_that_advances_early_breaks_the_logits(model):
    """Negative control: the first layer advancing the shared position shifts every later
    layer's writes, and the comparison above catches it."""
    ours, theirs = static_cache.new(model.config, 32), StaticCache(model.config, 32)
    ours.layers[0].advances = True
    ours.layers[-1].advances = False
    outs = [(run(model, ours, ids, crop), run(model, theirs, ids, crop)) for ids, crop in PASSES]
    assert any(not torch.equal(a, b) for a, b in outs)


def test_a_sliding_window_model_keeps_transformers_cache():
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2)
    config.layer_types = ["sliding_attention", "full_attention"]
    config.sliding_window = 8
    cache = static_cache.new(config, 32)
    assert not any(isinstance(layer, static_cache.PairedLayer) for layer in cache.layers)


def test_keys_and_values_of_different_head_sizes_are_refused_by_name():
    cache = static_cache.new(GPT2Config(n_layer=1, n_embd=32, n_head=2), 8)
    with pytest.raises(DecodelabError, match="head sizes 16 and 8"):
        cache.update(torch.zeros(1, 2, 1, 16), torch.zeros(1, 2, 1, 8), 0)
