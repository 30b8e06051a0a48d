"""Speculative decoding from scratch: the draft proposes K tokens with its own KV cache, the target
scores all K+1 positions in one forward pass, a rejection rule keeps the target's distribution,
and both caches roll back to the accepted prefix.

Draft and target may sit on different devices. Token ids cross between them; in sampled mode the
draft's K probability rows cross too, because the rejection rule compares p with q.

One host sync per iteration: the accept count, the next token and the proposals reach the host in
one copy, to extend the sequence and roll the caches back. The next iteration's ids are built on
the device from the same verdict, so between that sync and the draft's next pass the host only
launches; ids from the host (the prompt, or another device's) come through pinned memory, which
does not wait for the device. (Two pipelined graph engines wait for no verdict at all: their
loop, `decodelab.engines.pipelined`, keeps the next iteration on the device.) Forward passes are
timed without more (`Spans`), so the time outside them, the engine's own overhead, is measured,
not guessed. `autoregressive` is the target alone in the same machinery: the speculative study's
fair baseline.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from decodelab.analysis.theory import alpha_of_calls
from decodelab.backends.devices import now
from decodelab.backends.models import require_finite
from decodelab.config.settings import GREEDY, Sampling
from decodelab.core.errors import DecodelabError
from decodelab.engines.decode import cache_kwarg, new_cache
from decodelab.engines.sampling import (
    greedy_verdict,
    sample,
    speculative_accept,
    speculative_verdict,
    warp,
    wide,
)


@dataclass
class Result:
    tokens: list[int]
    accepted: list[int] = field(default_factory=list)  # per target call
    proposals: list[int] = field(default_factory=list)  # per target call: K, fewer at the end
    proposed: int = 0
    draft_forwards: int = 0
    draft_s: float = 0.0  # inside the draft's forward passes
    verify_s: float = 0.0  # inside the target's forward passes
    total_s: float = 0.0
    prefill_s: float = 0.0  # inside the target's first forward pass (the prompt)
    draft_prefill_s: float = 0.0  # inside the draft's first span: its prompt pass, and ...
    draft_prefill_passes: int = 1  # ... the passes after it that a graph engine replays at once
    host_gap_s: float = 0.0  # host time from each verdict's arrival to the next pass's launch
    # (NaN in the pipelined loop, whose device runs the next iteration meanwhile)

    @property
    def target_calls(self) -> int:
        return len(self.accepted)

    @property
    def proposal_acceptance(self) -> float:
        """Accepted / proposed draft tokens: falls with K even at a constant per-token alpha,
        since the proposals after a rejection are never looked at."""
        return sum(self.accepted) / self.proposed if self.proposed else float("nan")

    @property
    def tokens_per_call(self) -> float:
        return len(self.tokens) / self.target_calls if self.target_calls else float("nan")

    def alpha(self, k: int) -> float:
        """Per-token acceptance (Leviathan et al.) inferred from tokens per call of the calls
        that proposed all k tokens (those near the budget's end propose fewer)."""
        return alpha_of_calls(self.accepted, self.proposals, k)

    @property
    def overhead_s(self) -> float:
        """Wall time outside every forward pass: sampling, acceptance, rollback, transfers,
        Python."""
        return self.total_s - self.draft_s - self.verify_s

    @property
    def overhead_share(self) -> float:
        return self.overhead_s / self.total_s if self.total_s > 0 else float("nan")

    @property
    def host_gap_share(self) -> float:
        """The part of the overhead when the host alone works: after a verdict's sync it extends
        the sequence, rolls back and launches the next pass, while a GPU waits for it."""
        return self.host_gap_s / self.total_s if self.total_s > 0 else float("nan")


def check_vocab(target, draft) -> None:
    t, d = target.config.vocab_size, draft.config.vocab_size
    if t != d:
        raise DecodelabError(f"draft and target vocabularies differ ({d} vs {t} tokens); "
                             "speculative decoding needs a shared tokenizer")


def device_of(model) -> torch.device:
    return next(model.parameters()).device


def torch_device(model) -> torch.device | None:
    """Where a PyTorch model, or the one a graph engine wraps, computes; None for an engine
    outside torch (a llama.cpp engine's `device` is only where its logits land)."""
    if isinstance(model, torch.nn.Module):
        return device_of(model)
    inner = getattr(model, "model", None)
    return device_of(inner) if isinstance(inner, torch.nn.Module) else None


def feed(model, cache: DynamicCache, ids: torch.Tensor, keep: int = 0) -> torch.Tensor:
    """Run `ids` ([T] on the model's device) through the model; logits [min(keep, T), V] of the
    last `keep` positions, of all T where keep is 0 (the output layer runs on those alone)."""
    out = model(input_ids=ids[None], use_cache=True, logits_to_keep=keep,
                **{cache_kwarg(model): cache})
    return out.logits[0].float()


class Spans:
    """Time inside forward passes, per role, without a host sync per pass: CUDA events read once
    at the end on a GPU; elsewhere the host clock, synchronized after the pass (a no-op on the
    CPU, where a pass is done when it returns)."""

    def __init__(self):
        self.spans: dict[str, list] = defaultdict(list)
        self.passes: dict[str, list[int]] = defaultdict(list)
        self.entered: list[float] = []  # host time at each span's start, every role

    def host_gap(self, syncs: list[float]) -> float:
        """Summed host time from each of `syncs` (host times) to the next span's start."""
        gaps = (self.entered[i] - t for t in syncs
                if (i := bisect_right(self.entered, t)) < len(self.entered))
        return sum(gaps)

    @contextmanager
    def span(self, role: str, device: torch.device, passes: int = 1) -> Iterator[None]:
        """Time what runs inside as `passes` forward passes of `role`."""
        self.passes[role].append(passes)
        self.entered.append(time.perf_counter())
        if device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            yield
            end.record()
            self.spans[role].append((start, end))
        else:
            t = time.perf_counter()
            yield
            self.spans[role].append(now(device) - t)

    def feed(self, role: str, model, cache: DynamicCache, ids: torch.Tensor, keep: int = 0
             ) -> torch.Tensor:
        with self.span(role, ids.device):
            return feed(model, cache, ids, keep)

    def seconds(self, role: str) -> float:
        """Summed time of the role's passes; call after the last timestamp."""
        return sum(span_seconds(s) for s in self.spans[role])

    def first(self, role: str) -> float:
        """The time of the role's first pass (the target's: the prompt)."""
        return span_seconds(self.spans[role][0])

    def record(self, out: Result) -> None:
        """A run's forward-pass times into `out`, after its last timestamp: each role's sum, the
        target's prompt pass, and the draft's first span and how many passes it holds."""
        out.draft_s, out.verify_s = self.seconds("draft"), self.seconds("target")
        out.prefill_s = self.first("target")
        if self.spans["draft"]:
            out.draft_prefill_s = self.first("draft")
            out.draft_prefill_passes = self.passes["draft"][0]


def span_seconds(span) -> float:
    if isinstance(span, float):
        return span
    start, end = span
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def rollback(cache: DynamicCache, keep: int) -> None:
    # crop(-n) drops n tokens in transformers 5; crop(0) would empty a 4.x cache, so never call it.
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)


@dataclass
class Verdict:
    """A verification's outcome on the host (n accepted, the next token, the accepted draft
    tokens) and, where the rule decided on the device, the same tokens there: the accepted
    proposals ([n]) and the next token ([1])."""
    n: int
    next: int
    accepted: list[int]
    on_device: tuple[torch.Tensor, torch.Tensor] | None = None

    def tail(self, m: int, device: torch.device) -> torch.Tensor | None:
        """The last m of the new tokens (accepted proposals, then the next) on `device`, where
        they are there; None otherwise."""
        if self.on_device is None or m > self.n + 1:
            return None
        drafts, nxt = self.on_device
        if nxt.device != device:
            return None
        return nxt if m == 1 else torch.cat([drafts[self.n - m + 1:], nxt])


def to_device(tokens: list[int], device: torch.device) -> torch.Tensor:
    """Token ids from the host: through pinned memory to a GPU, a copy that does not wait for
    the device (one from pageable memory waits for everything queued before it)."""
    ids = torch.tensor(tokens)
    if device.type == "cuda":
        return ids.pin_memory().to(device, non_blocking=True)
    return ids.to(device)


def pending(seq: list[int], cache: DynamicCache, device, verdict: Verdict | None = None
            ) -> torch.Tensor:
    """The tokens of `seq` that `cache` has not seen yet: from the latest verdict's device
    tensors where they hold them, else from the host."""
    m = len(seq) - cache.get_seq_length()
    ids = verdict.tail(m, device) if verdict is not None else None
    return ids if ids is not None else to_device(seq[len(seq) - m:], device)


def uniforms(n: int, s: Sampling, generator: torch.Generator | None, device,
             out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The uniforms of n draws ([n, 1]) in one launch (into `out` where given); None in greedy
    mode, which draws none."""
    if s.greedy:
        return None
    return torch.rand(n, 1, generator=generator, device=device, dtype=wide(device), out=out)


def draw(logits: torch.Tensor, s: Sampling, generator: torch.Generator | None = None,
         u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One token ([1], on the logits' device, no host sync) and the distribution it came from,
    on the uniform `u` ([1]) where given; greedy: the argmax alone, a launch where building its
    one-hot distribution took five."""
    if s.greedy:
        return logits.argmax(-1, keepdim=True), None
    q = warp(logits, s.temperature, s.top_k, s.top_p)
    return sample(q, generator, u).reshape(1), q


def draws(step, ids: torch.Tensor, n: int, s: Sampling, u: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Feed `ids`, then draw n tokens, feeding each back but the last; `step` maps ids [T] to
    the logits [V] of the last. (tokens [n], their distributions [n, V] or None in greedy mode,
    the logits after `ids`)."""
    tokens, probs = [], []
    logits = first = step(ids)
    for i in range(n):
        token, q = draw(logits, s, u=None if u is None else u[i])
        tokens.append(token)
        probs.append(q)
        if i < n - 1:
            logits = step(token)
    return torch.cat(tokens), None if s.greedy else torch.stack(probs), first


def run_draws(model, cache, ids: torch.Tensor, n: int, s: Sampling, u: torch.Tensor | None,
              spans: Spans, role: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """`draws` on `model`'s cache. A graph engine replays the whole loop, its n passes and
    draws, as one CUDA graph: a one-layer draft's step is about as short as the host's launches
    of a pass and a draw, so replaying them one by one would leave the GPU waiting."""
    fused = getattr(model, "fused", None)
    if fused is None:
        return draws(lambda x: spans.feed(role, model, cache, x, keep=1)[-1], ids, n, s, u)
    with spans.span(role, ids.device, passes=n):
        return fused(("draws", len(ids), n, s), lambda x, v: draws(model.step, x, n, s, v),
                     (ids, u), len(ids) + n - 1, cache)


def propose(draft, cache: DynamicCache, ids: torch.Tensor, k: int, s: Sampling,
            generator: torch.Generator | None, spans: Spans | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """K draft tokens, the distributions they were drawn from ([K], [K, V]; None in greedy
    mode, whose verification compares tokens), and the draft's logits for the first of them
    ([V]; None when K = 0)."""
    if k == 0:
        vocab = draft.get_output_embeddings().out_features
        return (torch.empty(0, dtype=torch.long, device=ids.device),
                torch.empty(0, vocab, device=ids.device), None)
    u = uniforms(k, s, generator, ids.device)
    return run_draws(draft, cache, ids, k, s, u, spans or Spans(), "draft")


def pipelines(target, draft, prompt: list[int], k: int) -> bool:
    """Whether the pair runs its engines' own loop (a pipelined graph engine's: both roles have
    it, on one device), which needs K >= 1 and two prompt tokens (the draft's first input)."""
    loop = getattr(target, "speculative_loop", None)
    return (loop is not None and getattr(draft, "speculative_loop", None) is loop
            and target.device == draft.device and k >= 1 and len(prompt) >= 2)


# The rules whose verdict can stay on the device until the iteration's one sync.
ON_DEVICE = {speculative_accept: speculative_verdict}


def verify(target, cache: DynamicCache, ids: torch.Tensor, draft_tokens: torch.Tensor,
           draft_probs: torch.Tensor | None, s: Sampling, generator: torch.Generator | None,
           accept=speculative_accept, spans: Spans | None = None
           ) -> tuple[Verdict, torch.Tensor]:
    """(the verdict, the target's logits at the K+1 positions). One host sync."""
    k = len(draft_tokens)
    logits = (spans or Spans()).feed("target", target, cache, torch.cat([ids, draft_tokens]),
                                     keep=k + 1)
    if s.greedy:
        decided = greedy_verdict(logits, draft_tokens)
    else:
        p = warp(logits, s.temperature, s.top_k, s.top_p)
        q = draft_probs.to(p.device)
        if accept not in ON_DEVICE:
            n, nxt = accept(p, q, draft_tokens, generator)
            return Verdict(n, nxt, draft_tokens[:n].tolist()), logits
        decided = ON_DEVICE[accept](p, q, draft_tokens, generator)
    n, nxt, *proposed = torch.cat([decided, draft_tokens]).tolist()
    return Verdict(n, nxt, proposed[:n], (draft_tokens[:n], decided[1:])), logits


def keep_ends(kept: list, logits: torch.Tensor | None) -> None:
    """Keep the first and the latest logits of a model: the latest as a reference, the first as
    a copy (one launch per sequence), since a graph engine's later replays reuse its buffers."""
    if logits is not None:
        kept[1:] = [logits] if kept else [logits.clone()]


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
    `accept` is the rejection rule; verification swaps in deliberately wrong ones. Two pipelined
    graph engines run the correct rule's loop without a host sync per iteration
    (`decodelab.engines.pipelined`)."""
    check_vocab(target, draft)
    if (s.greedy or accept in ON_DEVICE) and pipelines(target, draft, prompt, k):
        return target.speculative_loop(target, draft, prompt, budget, k, s, draft_generator,
                                       target_generator)
    t_dev, d_dev = device_of(target), device_of(draft)
    t_cache, d_cache = new_cache(target), new_cache(draft)
    seq = list(prompt)
    out = Result(tokens=[])
    spans = Spans()
    kept = {"target": [], "draft": []}  # first and latest logits, checked after timing
    now(d_dev)
    start = now(t_dev)
    verdict, syncs = None, []
    while len(seq) - len(prompt) < budget:
        k_now = min(k, budget - (len(seq) - len(prompt)) - 1)  # never emit past the budget
        # The draft's pass first: the target's rollback and ids are launched while it runs.
        rollback(d_cache, len(seq) - 1)
        draft_tokens, draft_probs, draft_logits = propose(
            draft, d_cache, pending(seq, d_cache, d_dev, verdict), k_now, s, draft_generator,
            spans)
        rollback(t_cache, len(seq) - 1)
        verdict, target_logits = verify(
            target, t_cache, pending(seq, t_cache, t_dev, verdict), draft_tokens.to(t_dev),
            draft_probs, s, target_generator, accept, spans)
        syncs.append(time.perf_counter())
        keep_ends(kept["target"], target_logits)
        keep_ends(kept["draft"], draft_logits)
        n = verdict.n
        seq += verdict.accepted + [verdict.next]
        out.accepted.append(n)
        out.proposals.append(k_now)
        out.proposed += k_now
        out.draft_forwards += k_now
    now(d_dev)
    out.total_s = now(t_dev) - start
    check_finite({"target": target, "draft": draft}, kept)
    spans.record(out)
    out.host_gap_s = spans.host_gap(syncs)
    out.tokens = seq[len(prompt):]
    return out


@torch.inference_mode()
def autoregressive(model, prompt: list[int], budget: int, s: Sampling = GREEDY,
                   generator: torch.Generator | None = None) -> Result:
    """Exactly `budget` tokens from `model` alone, in the machinery of `generate` (`feed`, its
    cache, `draw`, `Spans`), synchronized only at the start and the end: the baseline that
    speculative decoding must beat. One target call per token, nothing proposed."""
    device = device_of(model)
    cache = new_cache(model)
    spans = Spans()
    start = now(device)
    u = uniforms(budget, s, generator, device)
    logits = spans.feed("target", model, cache, torch.tensor(prompt, device=device), keep=1)[-1]
    first = logits.clone()  # a graph engine's later replays reuse its buffers
    token, _ = draw(logits, s, u=None if u is None else u[0])
    tokens = [token]
    for i in range(1, budget):
        token, _, logits = run_draws(model, cache, token, 1, s,
                                     None if u is None else u[i:i + 1], spans, "target")
        tokens.append(token.clone())  # a graph's output buffer: the next replay overwrites it
    out = Result(tokens=torch.cat(tokens).tolist(), accepted=[0] * budget)
    out.total_s = now(device) - start
    check_finite({"target": model}, {"target": [first, logits]})
    spans.record(out)
    return out
