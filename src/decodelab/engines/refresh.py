"""The refresh layer of the non-synchronized batch (ASPIRE's intra-draft refresh): in every
forward, one designated layer attends to each drafting row's whole cache, and the chunks that
its draft query attends to most become the sparse context of the layers after it in the same
forward; the layers before it keep the row's own view. Without refresh a drafting row keeps
that one view in every layer (`batched.draft_context`).

Layers see different masks, so the model runs under an attention function of its own
(`ATTENTION`, registered with transformers) that swaps each layer's mask before calling the
model's own implementation; verifying rows see their committed slots in every layer.

A chunk's score is the attention mass the refresh layer's query puts on it, summed over heads,
so heads vote with probabilities rather than raw logits. The kept set has `sparse_kv`'s chunked
layout (chunk 0, the best chunks, the recent tail) under the same budget as the view it replaces.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from decodelab.core.errors import DecodelabError
from decodelab.core.kv_layout import CHUNK, min_budget
from decodelab.engines.sparse_kv import chunk_layout

ATTENTION = "decodelab_refresh"
MIN_BUDGET = min_budget("retrieval")  # the chunked layout
ACTIVE: list[RefreshLayer] = []  # the refresher of the forward in progress, innermost last


def chunk_mass(query: torch.Tensor, keys: torch.Tensor, allowed: torch.Tensor, scaling: float
               ) -> torch.Tensor:
    """[B, S]: the attention each row's first query ([B, h, w, d]) puts on each of its allowed
    slots (keys [B, h_kv, S, d], allowed [B, S]), summed over heads."""
    q = query[:, :, 0].float()
    k = keys.float().repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
    scores = torch.einsum("bhd,bhsd->bhs", q, k) * scaling
    weights = scores.masked_fill(~allowed[:, None], -torch.inf).softmax(-1)
    return weights.nan_to_num(0).sum(1)


def ranks(committed: torch.Tensor) -> torch.Tensor:
    """[B, S]: each committed slot's true position in its row (its rank), -1 elsewhere."""
    return torch.where(committed, committed.long().cumsum(1) - 1, -1)


def chunk_view(mass: torch.Tensor, committed: torch.Tensor, budget: int) -> torch.Tensor:
    """[B, S]: the committed slots each row keeps, from the mass on them: chunk 0, the prefix
    chunks of most mass, the recent tail (`sparse_kv.chunk_layout`, per row at once, no host
    sync); every committed slot of a row whose tokens fit the budget."""
    rank, n = ranks(committed), committed.sum(1, keepdim=True)
    prefix, picks = chunk_layout(n, budget)
    chunk = rank.clamp_min(0) // CHUNK
    in_prefix = committed & (rank < prefix)
    scores = mass.new_zeros(len(mass), committed.shape[1] // CHUNK + 1).scatter_add_(
        1, chunk, torch.where(in_prefix, mass, 0.0))
    ids = torch.arange(scores.shape[1], device=mass.device)[None]
    scores = scores.masked_fill(ids >= prefix // CHUNK, -torch.inf)
    scores[:, 0] = torch.inf
    place = scores.argsort(dim=1, descending=True, stable=True).argsort(dim=1)
    kept = committed & ((rank >= prefix) | (place < picks).gather(1, chunk))
    return torch.where(n <= budget, committed, kept)


class RefreshLayer:
    """A context manager around a model's forwards: while it is entered, each forward prepared
    with `prepare` gives layer `layer` the full mask and re-selects, per drafting row, the
    context of the layers after it; the layers before it keep the row's own view."""

    def __init__(self, model, layer: int, budget: int):
        layers = model.config.num_hidden_layers
        if not 0 <= layer < layers:
            raise DecodelabError(f"config 'batched.refresh_layer': layer {layer} of a model with "
                                 f"{layers} layers (0..{layers - 1})")
        if budget < MIN_BUDGET:
            raise DecodelabError(f"the refresh layer keeps whole chunks: a view of at least "
                                 f"{MIN_BUDGET} tokens, got {budget}")
        self.model, self.layer, self.budget = model, layer, budget
        self.masks: dict[str, torch.Tensor] = {}

    def prepare(self, before: torch.Tensor, full: torch.Tensor, drafting: torch.Tensor,
                committed: torch.Tensor, mask_of: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Contexts [B, S] of the next forward: `before`, the forward's own, for the layers
        before the refresh layer, `full` for it; `drafting` [B] the rows whose view is
        re-selected among their `committed` [B, S] slots; `mask_of` turns a context into that
        forward's mask."""
        self.before, self.full, self.drafting = before, full, drafting
        self.committed, self.mask_of = committed, mask_of
        self.masks = {"full": mask_of(full)}

    def mask(self, layer: int, given: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s mask; `given`, the forward's own (of `before`), for the layers
        before the refresh layer."""
        if layer < self.layer:
            return given
        return self.masks["full" if layer == self.layer else "after"]

    def reselect(self, query: torch.Tensor, keys: torch.Tensor, scaling: float) -> None:
        """From the refresh layer's queries and keys: every drafting row's new context."""
        slots = self.full.shape[1]
        mass = chunk_mass(query, keys[:, :, :slots], self.full, scaling)
        drafts = self.full & ~self.committed  # a drafting row's own draft tokens
        chosen = chunk_view(mass, self.committed, self.budget) | drafts
        self.masks["after"] = self.mask_of(torch.where(self.drafting[:, None], chosen,
                                                       self.before))

    def attention(self, module, query, key, value, attention_mask, **kwargs):
        mask = self.mask(module.layer_idx, attention_mask)
        out = self.original(module)(module, query, key, value, mask, **kwargs)
        if module.layer_idx == self.layer:
            self.reselect(query, key, kwargs.get("scaling") or query.shape[-1] ** -0.5)
        return out

    def original(self, module) -> Callable:
        eager = sys.modules[type(module).__module__].eager_attention_forward
        return ALL_ATTENTION_FUNCTIONS.get_interface(self.implementation, eager)

    def __enter__(self) -> RefreshLayer:
        self.implementation = self.model.config._attn_implementation
        self.model.config._attn_implementation = ATTENTION
        ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        ACTIVE.remove(self)
        self.model.config._attn_implementation = self.implementation


def refreshing_attention(module, query, key, value, attention_mask, **kwargs):
    return ACTIVE[-1].attention(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(ATTENTION, refreshing_attention)
