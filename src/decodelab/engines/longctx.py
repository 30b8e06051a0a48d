"""Speculation at long contexts with a sparse draft cache, through `speculative`'s proposal,
rejection rule and rollback; the verifier always uses its full cache.

Two drafters (`sparse_kv` picks the positions a draft sees):
- self-speculation (`drafter=None`): the target drafts through a sparse view of its own full
  cache (training-free, as TriForce and MagicDec do);
- a separate small drafter (as BudgetDraft does): it keeps its OWN full cache, extended with
  the tokens accepted since the last proposal in one full-attention pass before each proposal,
  and drafts through a sparse view of it.

Either way the view is rebuilt from a full cache before every proposal and drafting writes only
into the view (a copy), so the full caches are exact (every accepted token's KV as full
attention computes it) and only the target's rolls back: the drafter's never holds a draft.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from transformers import DynamicCache

from decodelab.backends.devices import now
from decodelab.config.settings import GREEDY, Sampling
from decodelab.core.errors import DecodelabError
from decodelab.engines.decode import cache_kwarg, new_cache
from decodelab.engines.sampling import speculative_accept
from decodelab.engines.sparse_kv import Policy, QueryProbe, sparse_view
from decodelab.engines.speculative import (
    Result,
    Spans,
    check_finite,
    check_vocab,
    device_of,
    feed,
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

    def forward(self, input_ids: torch.Tensor, cache, use_cache: bool = True,
                logits_to_keep: int = 0):
        n = input_ids.shape[1]
        ids = torch.arange(self.next, self.next + n, device=input_ids.device)[None]
        self.next += n
        return self.model(input_ids=input_ids, position_ids=ids, use_cache=use_cache,
                          logits_to_keep=logits_to_keep, **{cache_kwarg(self.model): cache})

    __call__ = forward


class SelfDraft:
    """The target drafts on a view of its own full cache; the queries that score chunks are
    those of the latest cached token in the last full-cache pass (the verification's)."""

    passes = 0  # full-cache passes of its own: none

    def __init__(self, model, cache, probe: QueryProbe | None):
        self.model, self.cache, self.probe, self.latest = model, cache, probe, -1

    def view(self, seq: list[int], policy: Policy, spans: Spans, device) -> DynamicCache:
        with spans.span("draft", device):
            queries = self.probe.at(self.latest) if self.probe is not None else None
            return sparse_view(self.cache, policy.select(self.cache, queries))

    def accepted(self, n: int) -> None:
        self.latest = n  # the verification pass's row of the latest token now cached


class SeparateDraft:
    """A drafter with its own full cache: before each proposal it catches up on every token
    but the latest (one full-attention pass, whose last row gives the retrieval queries), then
    drafts on a view of that cache."""

    def __init__(self, model, probe: QueryProbe | None):
        self.model, self.cache, self.probe = model, new_cache(model), probe
        self.passes = 0  # catch-up passes, the prompt's included

    def view(self, seq: list[int], policy: Policy, spans: Spans, device) -> DynamicCache:
        behind = seq[self.cache.get_seq_length():-1]
        if behind:  # empty only before a one-token prompt
            spans.feed("draft", self.model, self.cache, torch.tensor(behind, device=device))
            self.passes += 1
        with spans.span("draft", device):
            queries = self.probe.at(-1) if self.probe is not None and behind else None
            return sparse_view(self.cache, policy.select(self.cache, queries))

    def accepted(self, n: int) -> None:
        pass


@torch.inference_mode()
def generate(model, prompt: list[int], budget: int, k: int, policy: Policy,
             s: Sampling = GREEDY, draft_generator: torch.Generator | None = None,
             target_generator: torch.Generator | None = None,
             accept=speculative_accept, drafter=None) -> Result:
    """Exactly `budget` new tokens after `prompt`, K tokens drafted per target call on the
    positions `policy` keeps of a full cache: the target's own (`drafter=None`) or `drafter`'s.
    `accept` is the rejection rule. With a drafter, `draft_forwards` counts its catch-up passes
    too and `draft_s` includes its prompt pass (as `speculative.generate` does)."""
    if not prompt:
        raise DecodelabError("sparse-KV speculation needs a prompt of at least one token")
    drafting = model if drafter is None else drafter
    if drafter is not None:
        check_vocab(model, drafter)
        if device_of(drafter) != device_of(model):
            raise DecodelabError("the sparse drafter and the target must sit on one device")
    with QueryProbe(drafting) if policy.name == "retrieval" else nullcontext() as probe:
        return speculate(model, drafter, prompt, budget, k, policy, probe, s, draft_generator,
                         target_generator, accept)


def speculate(model, drafter, prompt: list[int], budget: int, k: int, policy: Policy,
              probe: QueryProbe | None, s: Sampling, draft_generator: torch.Generator | None,
              target_generator: torch.Generator | None, accept) -> Result:
    device = device_of(model)
    cache = new_cache(model)
    draft = SelfDraft(model, cache, probe) if drafter is None else SeparateDraft(drafter, probe)
    seq = list(prompt)
    out = Result(tokens=[])
    spans = Spans()
    kept = {"target": [], "draft": []}  # first and latest logits, checked after timing
    start = now(device)
    if len(prompt) > 1:  # the full cache holds every token but the latest, as after a rollback
        spans.feed("target", model, cache, torch.tensor(prompt[:-1], device=device))
    verdict = None
    while len(seq) - len(prompt) < budget:
        k_now = min(k, budget - (len(seq) - len(prompt)) - 1)  # never emit past the budget
        view = draft.view(seq, policy, spans, device)
        t_ids = pending(seq, cache, device, verdict)  # ends with the latest token, seq[-1]
        draft_tokens, draft_probs, draft_logits = propose(
            TruePositions(draft.model, len(seq) - 1), view, t_ids[-1:], k_now, s,
            draft_generator, spans)
        verdict, target_logits = verify(model, cache, t_ids, draft_tokens, draft_probs, s,
                                        target_generator, accept, spans)
        keep_ends(kept["target"], target_logits)
        keep_ends(kept["draft"], draft_logits)
        n = verdict.n
        seq += verdict.accepted + [verdict.next]
        rollback(cache, len(seq) - 1)
        draft.accepted(n)
        out.accepted.append(n)
        out.proposals.append(k_now)
        out.proposed += k_now
        out.draft_forwards += k_now
    out.total_s = now(device) - start
    check_finite({"target": model, "draft": draft.model}, kept)
    out.draft_forwards += draft.passes
    out.draft_s, out.verify_s = spans.seconds("draft"), spans.seconds("target")
    if len(prompt) > 1:
        out.prefill_s = spans.first("target")
    out.tokens = seq[len(prompt):]
    return out


@torch.inference_mode()
def first_draft_log_probs(model, policy: Policy, ids: list[int], start: int) -> torch.Tensor:
    """log q(ids[t] | ids[:t]) for t = start..len(ids)-1 (start >= 2), q the law of the first
    draft step of a proposal made at t: `model` on `policy`'s view of its full cache of
    ids[:t-1], fed ids[t-1] at its true position, the view chosen (retrieval) by the queries of
    ids[t-2] in the full-cache pass, as `generate` drafts (temperature 1). A fixed function of
    the sequence, so a statistic for the verification study's log-ratio test
    (`decodelab.studies.verification.run`)."""
    device = device_of(model)
    with QueryProbe(model) if policy.name == "retrieval" else nullcontext() as probe:
        cache = new_cache(model)
        feed(model, cache, torch.tensor(ids[:-1], device=device))
    out = []
    for t in range(start, len(ids)):
        n = t - 1  # tokens cached before the one fed
        prefix = DynamicCache(ddp_cache_data=[(layer.keys[:, :, :n], layer.values[:, :, :n])
                                              for layer in cache.layers])
        queries = probe.at(n - 1) if probe is not None else None
        view = sparse_view(prefix, policy.select(prefix, queries))
        logits = TruePositions(model, n)(torch.tensor([[ids[n]]], device=device), view).logits
        out.append(torch.log_softmax(logits[0, -1].float(), -1)[ids[t]].cpu())
    return torch.stack(out)
