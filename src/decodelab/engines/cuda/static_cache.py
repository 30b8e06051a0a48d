"""The graph engine's static cache: transformers' `StaticCache` with one write position for every
layer and each layer's keys and values in one buffer.

transformers' `StaticLayer` keeps a position per layer, and each layer's `update` writes its keys,
writes its values and advances its position: in a compiled step, three small kernels per layer
(Inductor fuses none of them, as each mutates another buffer), each a launch and a tail that a
CUDA graph still pays. Here the layers read one position tensor, which the last layer advances,
and a layer's keys and values are the two halves of one buffer, written by one `index_copy_` of
the pair. A pass reads the position before any layer runs (transformers builds its mask from the
first layer's length), so every layer writes at the same slots. With `attention.causal_ends`,
gpt2-xl's step launches 436 kernels instead of 531.
"""

from __future__ import annotations

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from decodelab.core.errors import DecodelabError


class PairedLayer(StaticLayer):
    """A `StaticLayer` whose keys and values are `pair[0]` and `pair[1]`, at the position of
    `first` (the cache's first layer; None: this is it), advanced only by the layer that
    `advances` (the last)."""

    def __init__(self, max_cache_len: int, first: PairedLayer | None, advances: bool):
        super().__init__(max_cache_len)
        self.first, self.advances = first, advances

    def lazy_initialization(self, key_states, value_states):
        if key_states.shape[-1] != value_states.shape[-1] or key_states.dtype != value_states.dtype:
            raise DecodelabError(
                f"the graph engine's cache holds keys and values in one buffer; this model's "
                f"differ (head sizes {key_states.shape[-1]} and {value_states.shape[-1]}, "
                f"{key_states.dtype} and {value_states.dtype}): run it with engine 'eager'")
        self.device = key_states.device
        self.batch_size, self.num_heads, _, self.k_head_dim = key_states.shape
        self.v_head_dim = self.k_head_dim
        self.pair = torch.zeros((2, self.batch_size, self.num_heads, self.max_cache_len,
                                 self.k_head_dim), dtype=key_states.dtype, device=self.device)
        self.keys, self.values = self.pair[0], self.pair[1]
        if self.first is None:
            self.cumulative_length = self.cumulative_length.to(self.device)
        else:
            self.cumulative_length = self.first.cumulative_length
        if not torch.compiler.is_dynamo_compiling():  # as StaticLayer: the graphs need them fixed
            torch._dynamo.mark_static_address(self.pair)
            torch._dynamo.mark_static_address(self.cumulative_length)
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        slots = torch.arange(n, device=self.device) + self.cumulative_length
        self.pair.index_copy_(3, slots, torch.stack((key_states, value_states)))
        self.advance(n)
        # views taken here, not the attributes: dynamo would lift those as inputs aliasing `pair`
        return self.pair[0], self.pair[1]

    def advance(self, n: int) -> None:
        """The shared position n tokens on, by the layer that `advances`, after its write (by
        `update`, or by a kernel that writes `pair` itself)."""
        if self.advances:
            self.cumulative_length.add_(n)

    def crop(self, tokens_to_remove: int) -> None:
        """`tokens_to_remove` (negative, as transformers' `StaticLayer.crop`, which some
        transformers 5 releases lack) off the shared position, once."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens, not {tokens_to_remove}")
        if self.advances and self.is_initialized:
            self.cumulative_length.sub_(-tokens_to_remove)


def new(config, max_len: int, paired: bool = True) -> StaticCache:
    """A static cache of `max_len` tokens for a model of `config` whose layers all attend over
    the whole cache; transformers' own without `paired` or where a layer has a sliding window."""
    cache = StaticCache(config=config, max_cache_len=max_len)
    if not paired or not all(type(layer) is StaticLayer for layer in cache.layers):
        return cache
    first = PairedLayer(max_len, None, len(cache.layers) == 1)
    cache.layers = [first] + [PairedLayer(max_len, first, i == len(cache.layers) - 1)
                              for i in range(1, len(cache.layers))]
    return cache


def positions(cache: StaticCache) -> list[torch.Tensor]:
    """The cache's write positions on the device, each once (a paired cache has one)."""
    found = {id(layer.cumulative_length): layer.cumulative_length for layer in cache.layers}
    return list(found.values())


def move_back(cache: StaticCache, n: int) -> None:
    """Every layer's write position n tokens back: one device op, no host sync."""
    if n > 0 and cache.is_initialized:
        torch._foreach_sub_(positions(cache), n)
