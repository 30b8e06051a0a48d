"""Sparse draft caches: which of the full cache's positions a draft sees, under a budget B.

A `Policy` maps the full cache (tokens 0..N-1) to one sorted index set per layer and KV head,
[h_kv, n] with n <= B; `sparse_view` gathers those keys and values into a new cache. Hugging
Face stores keys after RoPE, so a kept key keeps the rotation of its true position; whoever
drafts on the view must feed its queries at true positions too (explicit `position_ids`: the
default would be the view's physical length). B >= N keeps every position.

Policies (TriForce's `RetrievalCache` and BudgetDraft's chunk selection for the chunked ones):
- `full`: every position (positive control).
- `sink_window`: the first `sink` tokens and the most recent B - sink (StreamingLLM's set).
- `retrieval`: 8-token chunks of the prefix scored per layer and KV head by q . mean(chunk
  keys), q the rotated queries of the latest cached token (TriForce's choice; `QueryProbe`
  records them in the full-cache forward that cached it); chunk 0 and the recent window are
  always kept, the best-scoring chunks fill the rest.
- `random_chunks`: the same layout with chunks drawn at random (negative control).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from decodelab.core.errors import DecodelabError
from decodelab.core.kv_layout import CHUNK, SINK, WINDOW, min_budget

POLICIES = ("full", "sink_window", "retrieval", "random_chunks")

Selection = list[torch.Tensor]  # per layer: [h_kv, n] true positions, sorted


@dataclass(frozen=True)
class Policy:
    name: str
    budget: int = 0  # ignored by `full`
    seed: int = 0  # random_chunks only

    def __post_init__(self):
        if self.name not in POLICIES:
            raise DecodelabError(f"unknown sparse-KV policy {self.name!r}; known: "
                                 f"{', '.join(POLICIES)}")
        if self.name != "full" and self.budget < min_budget(self.name):
            raise DecodelabError(f"sparse-KV policy {self.name!r} needs a budget of at least "
                                 f"{min_budget(self.name)} tokens, got {self.budget}")

    def select(self, cache: DynamicCache, queries: list[torch.Tensor] | None = None) -> Selection:
        """`queries` (retrieval only): per layer, [h_q, d] of the latest cached token."""
        n = cache.get_seq_length()
        if n == 0:
            return []
        keys = [layer.keys[0] for layer in cache.layers]  # batch 1: [h_kv, N, d] per layer
        if self.name == "full" or self.budget >= n:
            return [positions(torch.arange(n), k) for k in keys]
        if self.name == "sink_window":
            every = torch.arange(n)
            return [positions(every[sink_window(every, n, self.budget)], k) for k in keys]
        prefix, picks = chunk_layout(n, self.budget)
        if self.name == "retrieval":
            if queries is None:
                raise DecodelabError("retrieval scores chunks against queries; none were given")
            return [retrieved(k, q, prefix, picks) for k, q in zip(keys, queries, strict=True)]
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + n)
        return [with_window(chunk_positions(random_chunks(prefix // CHUNK, picks, g), k), k, prefix)
                for k in keys]


def sink_window(position: torch.Tensor, n, budget: int) -> torch.Tensor:
    """Which true positions (of a context of n tokens) sink + window keeps: the first SINK and
    the latest budget - SINK; every one when n fits the budget. `n` may be a tensor of rows."""
    return (position < SINK) | (position >= n - (budget - SINK))


def positions(kept: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """One index set for every KV head of a layer: [h_kv, n] on the keys' device."""
    return kept.to(keys.device)[None].expand(keys.shape[0], -1)


def chunk_layout(n, budget: int):
    """(prefix length in whole chunks, chunks to keep from it): the tail after the prefix is the
    recent window plus the partial chunk before it, which the budget always covers. `n` an int,
    or a tensor of per-row lengths (both come back as tensors then)."""
    tail = WINDOW + (n - WINDOW) % CHUNK
    return n - tail, (budget - tail) // CHUNK


def chunk_positions(chunks: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[h_kv, c] sorted chunk ids -> [h_kv, c * CHUNK] positions."""
    offsets = torch.arange(CHUNK, device=chunks.device)
    return (chunks[..., None] * CHUNK + offsets).flatten(-2).to(keys.device)


def with_window(chunked: torch.Tensor, keys: torch.Tensor, prefix: int) -> torch.Tensor:
    tail = torch.arange(prefix, keys.shape[1], device=keys.device)
    return torch.cat([chunked.expand(keys.shape[0], -1), positions(tail, keys)], dim=-1)


def retrieved(keys: torch.Tensor, queries: torch.Tensor, prefix: int, picks: int
              ) -> torch.Tensor:
    """Chunk 0 plus the best-scoring chunks of the prefix, per KV head (summed over the query
    heads that share it), then the tail."""
    h, _, d = keys.shape
    means = keys[:, :prefix].reshape(h, prefix // CHUNK, CHUNK, d).float().mean(2)
    grouped = queries.float().reshape(h, -1, d)  # [h_kv, query heads per KV head, d]
    scores = torch.einsum("hgd,hcd->hc", grouped, means)
    scores[:, 0] = torch.inf
    chunks = scores.topk(picks, dim=-1).indices.sort(dim=-1).values
    return with_window(chunk_positions(chunks, keys), keys, prefix)


def random_chunks(n_chunks: int, picks: int, g: torch.Generator) -> torch.Tensor:
    """Chunk 0 plus picks - 1 others drawn uniformly, sorted, as [1, picks]."""
    others = torch.randperm(n_chunks - 1, generator=g)[:picks - 1] + 1
    return torch.cat([torch.zeros(1, dtype=torch.long), others.sort().values])[None]


def gather(states: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """states [b, h_kv, N, d], kept [h_kv, n] (every row) or [b, h_kv, n] -> [b, h_kv, n, d]."""
    kept = kept.expand(states.shape[0], -1, -1)
    return states.gather(2, kept[..., None].expand(-1, -1, -1, states.shape[-1]))


def select_rows(policy: Policy, cache: DynamicCache,
                queries: list[list[torch.Tensor]] | None = None) -> Selection:
    """`policy.select` for each batch row of `cache` (`queries[i]`: row i's), stacked per layer
    as [b, h_kv, n]: a budget gives every row the same n."""
    rows = [policy.select(row_of(cache, i), None if queries is None else queries[i])
            for i in range(cache.layers[0].keys.shape[0])]
    return [torch.stack(layer) for layer in zip(*rows, strict=True)]


def row_of(cache: DynamicCache, i: int) -> DynamicCache:
    return DynamicCache(ddp_cache_data=[(layer.keys[i:i + 1], layer.values[i:i + 1])
                                        for layer in cache.layers])


def sparse_view(cache: DynamicCache, selection: Selection) -> DynamicCache:
    """A new cache holding only the selected positions of `cache` (copies, so drafting on it
    leaves `cache` untouched)."""
    if cache.get_seq_length() == 0:
        return DynamicCache()
    return DynamicCache(ddp_cache_data=[
        (gather(layer.keys, kept), gather(layer.values, kept))
        for layer, kept in zip(cache.layers, selection, strict=True)])


class QueryProbe:
    """The rotated queries of a Llama-style model's latest forward pass, per layer
    ([b, h_q, T, d]), recomputed from each attention module's inputs by a pre-hook (one extra
    query projection per layer and pass). A context manager: the hooks go on exit."""

    def __init__(self, model):
        self.queries: dict[int, torch.Tensor] = {}
        self.handles = [
            layer.self_attn.register_forward_pre_hook(partial(self.record, i), with_kwargs=True)
            for i, layer in enumerate(model.model.layers)]

    def record(self, layer: int, module, args, kwargs) -> None:
        hidden = kwargs["hidden_states"]
        cos, sin = kwargs["position_embeddings"]
        q = module.q_proj(hidden).view(*hidden.shape[:-1], -1, module.head_dim).transpose(1, 2)
        self.queries[layer] = apply_rotary_pos_emb(q, q, cos, sin)[0]

    def at(self, row: int, seq: int = 0) -> list[torch.Tensor]:
        """Per layer, the queries of one row of the latest pass, of batch item `seq`: [h_q, d]."""
        return [self.queries[i][seq, :, row] for i in sorted(self.queries)]

    def __enter__(self) -> QueryProbe:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
