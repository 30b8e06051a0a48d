"""Speculative decoding from scratch: the draft proposes K tokens with its own KV cache, the target
scores all K+1 positions in one forward pass, a rejection rule keeps the target's distribution,
and both caches roll back to the accepted prefix.

Draft and target may sit on different devices. Token ids cross between them; in sampled mode the
draft's K probability rows cross too, because the rejection rule compares p with q.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .config import GREEDY, Sampling
from .decode import cache_kwarg, new_cache
from .devices import now
from .errors import DecodelabError
from .models import require_finite
from .sampling import greedy_accept, sample, speculative_accept, warp


@dataclass
class Result:
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)  # per target call
    proposed: int = 0
    draft_forwards: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0

    @property
    def target_calls(self) -> int:
        return len(self.accepted)

    @property
    def acceptance_rate(self) -> float:
        return sum(self.accepted) / self.proposed if self.proposed else float("nan")

    @property
    def tokens_per_call(self) -> float:
        return len(self.tokens) / self.target_calls if self.target_calls else float("nan")


def check_vocab(target, draft) -> None:
    t, d = target.config.vocab_size, draft.config.vocab_size
    if t != d:
        raise DecodelabError(f"draft and target vocabularies differ ({d} vs {t} tokens); "
                             "speculative decoding needs a shared tokenizer")


def device_of(model) -> torch.device:
    return next(model.parameters()).device


def feed(model, cache: DynamicCache, ids: torch.Tensor) -> torch.Tensor:
    """Run `ids` ([T] on the model's device) through the model; logits of every position [T, V]."""
    out = model(input_ids=ids[None], use_cache=True, **{cache_kwarg(model): cache})
    return out.logits[0].float()


def rollback(cache: DynamicCache, keep: int) -> None:
    # crop(-n) drops n tokens in transformers 5; crop(0) would empty a 4.x cache, so never call it.
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)


def pending(seq: list[int], cache: DynamicCache, device) -> torch.Tensor:
    """The tokens of `seq` that `cache` has not seen yet."""
    return torch.tensor(seq[cache.get_seq_length():], device=device)


def propose(draft, cache: DynamicCache, ids: torch.Tensor, k: int, s: Sampling,
            generator: torch.Generator | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """K draft tokens, the distributions they were drawn from ([K], [K, V]), and the draft's
    logits for the first of them ([V]; None when K = 0)."""
    if k == 0:
        vocab = draft.get_output_embeddings().out_features
        return (torch.empty(0, dtype=torch.long, device=ids.device),
                torch.empty(0, vocab, device=ids.device), None)
    tokens, probs = [], []
    logits = first = feed(draft, cache, ids)[-1]
    for i in range(k):
        q = warp(logits, s.temperature, s.top_k, s.top_p)
        token = q.argmax(-1, keepdim=True) if s.greedy else sample(q, generator).reshape(1)
        tokens.append(token)
        probs.append(q)
        if i < k - 1:
            logits = feed(draft, cache, token)[-1]
    return torch.cat(tokens), torch.stack(probs), first


def verify(target, cache: DynamicCache, ids: torch.Tensor, draft_tokens: torch.Tensor,
           draft_probs: torch.Tensor, s: Sampling, generator: torch.Generator | None,
           accept=speculative_accept) -> tuple[int, int, torch.Tensor]:
    """(accepted draft tokens, the next token, the target's logits at the K+1 positions)."""
    k = len(draft_tokens)
    logits = feed(target, cache, torch.cat([ids, draft_tokens]))[-(k + 1):]
    if s.greedy:
        return (*greedy_accept(logits, draft_tokens), logits)
    p = warp(logits, s.temperature, s.top_k, s.top_p)
    return (*accept(p, draft_probs.to(p.device), draft_tokens, generator), logits)


def keep_ends(kept: list, logits: torch.Tensor | None) -> None:
    """Keep the first and the latest logits of a model (no device work: a reference)."""
    if logits is not None:
        kept[1:] = [logits]


def check_finite(by_role: dict, kept: dict) -> None:
    """NaN/inf in the kept logits of either model stops the run: a few reductions and host
    syncs per sequence, after its last timestamp."""
    for role, model in by_role.items():
        for logits in kept[role]:
            require_finite(logits, model, role, "in a speculative block")


@torch.inference_mode()
def generate(target, draft, prompt: list[int], budget: int, k: int, s: Sampling = GREEDY,
             draft_generator: torch.Generator | None = None,
             target_generator: torch.Generator | None = None,
             accept=speculative_accept) -> Result:
    """Exactly `budget` new tokens after `prompt` (no EOS stop), K draft tokens per target call.
    `accept` is the rejection rule; verification swaps in deliberately wrong ones."""
    check_vocab(target, draft)
    t_dev, d_dev = device_of(target), device_of(draft)
    t_cache, d_cache = new_cache(target), new_cache(draft)
    seq = list(prompt)
    out = Result(tokens=[])
    kept = {"target": [], "draft": []}  # first and latest logits, checked after timing
    now(d_dev)
    start = now(t_dev)
    while len(seq) - len(prompt) < budget:
        k_now = min(k, budget - (len(seq) - len(prompt)) - 1)  # never emit past the budget
        t0 = now(d_dev)
        draft_tokens, draft_probs, draft_logits = propose(
            draft, d_cache, pending(seq, d_cache, d_dev), k_now, s, draft_generator)
        t1 = now(d_dev)
        draft_tokens = draft_tokens.to(t_dev)
        n, nxt, target_logits = verify(target, t_cache, pending(seq, t_cache, t_dev),
                                       draft_tokens, draft_probs, s, target_generator, accept)
        t2 = now(t_dev)
        keep_ends(kept["target"], target_logits)
        keep_ends(kept["draft"], draft_logits)
        seq += draft_tokens[:n].tolist() + [nxt]
        rollback(t_cache, len(seq) - 1)
        rollback(d_cache, len(seq) - 1)
        out.accepted.append(n)
        out.proposed += k_now
        out.draft_forwards += k_now
        out.draft_s += t1 - t0
        out.verify_s += t2 - t1
    out.total_s = now(t_dev) - start
    check_finite({"target": target, "draft": draft}, kept)
    out.tokens = seq[len(prompt):]
    return out
