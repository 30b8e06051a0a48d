"""Self-speculation at long contexts: the target drafts through a sparse view of its own KV cache
(training-free, as TriForce and MagicDec do) and verifies with the full cache, through
`speculative`'s proposal, rejection rule and rollback.

The view is rebuilt from the full cache before every proposal (`sparse_kv`), so it is always an
exact subset of the target's KV and needs no rollback of its own; only the full cache rolls back.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from .config import GREEDY, Sampling
from .decode import cache_kwarg, new_cache
from .devices import now
from .errors import DecodelabError
from .sampling import speculative_accept
from .sparse_kv import Policy, QueryProbe, sparse_view
from .speculative import (
    Result,
    Spans,
    check_finite,
    device_of,
    keep_ends,
    pending,
    propose,
    rollback,
    verify,
)


class TruePositions:
    """A model that feeds tokens at their true positions from `start` on, whatever the physical
    length of the cache it is given (a sparse view holds fewer tokens than it stands for)."""

    def __init__(self, model, start: int):
        self.model, self.next = model, start

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, input_ids: torch.Tensor, cache, use_cache: bool = True):
        n = input_ids.shape[1]
        ids = torch.arange(self.next, self.next + n, device=input_ids.device)[None]
        self.next += n
        return self.model(input_ids=input_ids, position_ids=ids, use_cache=use_cache,
                          **{cache_kwarg(self.model): cache})

    __call__ = forward


@torch.inference_mode()
def generate(model, prompt: list[int], budget: int, k: int, policy: Policy,
             s: Sampling = GREEDY, draft_generator: torch.Generator | None = None,
             target_generator: torch.Generator | None = None,
             accept=speculative_accept) -> Result:
    """Exactly `budget` new tokens after `prompt`, K tokens drafted per target call by `model`
    on the positions `policy` keeps of its full cache; `accept` is the rejection rule."""
    if not prompt:
        raise DecodelabError("self-speculation needs a prompt of at least one token")
    with QueryProbe(model) if policy.name == "retrieval" else nullcontext() as probe:
        return speculate(model, prompt, budget, k, policy, probe, s, draft_generator,
                         target_generator, accept)


def speculate(model, prompt: list[int], budget: int, k: int, policy: Policy,
              probe: QueryProbe | None, s: Sampling, draft_generator: torch.Generator | None,
              target_generator: torch.Generator | None, accept) -> Result:
    device = device_of(model)
    cache = new_cache(model)
    seq = list(prompt)
    out = Result(tokens=[])
    spans = Spans()
    kept = {"target": [], "draft": []}  # first and latest logits, checked after timing
    latest = -1  # the row of the latest cached token in the last full-cache pass
    start = now(device)
    if len(prompt) > 1:  # the full cache holds every token but the latest, as after a rollback
        spans.feed("target", model, cache, torch.tensor(prompt[:-1], device=device))
    while len(seq) - len(prompt) < budget:
        k_now = min(k, budget - (len(seq) - len(prompt)) - 1)  # never emit past the budget
        with spans.span("draft", device):
            queries = probe.at(latest) if probe is not None else None
            view = sparse_view(cache, policy.select(cache, queries))
        draft_tokens, draft_probs, draft_logits = propose(
            TruePositions(model, cache.get_seq_length()), view, pending(seq, cache, device),
            k_now, s, draft_generator, spans)
        n, nxt, target_logits = verify(model, cache, pending(seq, cache, device), draft_tokens,
                                       draft_probs, s, target_generator, accept, spans)
        keep_ends(kept["target"], target_logits)
        keep_ends(kept["draft"], draft_logits)
        seq += draft_tokens[:n].tolist() + [nxt]
        rollback(cache, len(seq) - 1)
        latest = n
        out.accepted.append(n)
        out.proposed += k_now
        out.draft_forwards += k_now
    out.total_s = now(device) - start
    check_finite({"target": model, "draft": model}, kept)
    out.draft_s, out.verify_s = spans.seconds("draft"), spans.seconds("target")
    if len(prompt) > 1:
        out.prefill_s = spans.first("target")
    out.tokens = seq[len(prompt):]
    return out
