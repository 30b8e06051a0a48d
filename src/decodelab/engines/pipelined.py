"""Speculative decoding with the host one iteration ahead of the device (engine `pipelined`).

`speculative.generate` waits for every verdict: the host needs the accepted count to extend the
sequence, roll both caches back and feed the next tokens, and the device idles through that turn of
the host. With graph engines none of it needs the host: a static cache's write position lives on
the device (`graphs.Engine.counters`), and the next inputs are the verdict's own tokens. So here
an iteration is launched whole, without a sync: the draft's proposal, the verification, the verdict,
both rollbacks by K - n, the next inputs, and a copy of (n, the next token, the proposals) to
pinned host memory. The host reads that copy while the device runs the next iteration, and never
launches one that the budget may not need.

Shapes stay fixed, so each pass replays a graph captured once: the draft is fed the sequence's last
two tokens (its cache rolled back one token further than the target's: the earlier of the two is
written again at its own position), the target the last token and the K proposals. Every iteration
proposes K, so the last may overshoot the budget; the tokens past it are dropped. The rejection
rule and the randomness it draws are `speculative.generate`'s.
"""

from __future__ import annotations

import math
from collections import deque

import torch

from decodelab.backends.devices import now
from decodelab.config.settings import GREEDY, Sampling
from decodelab.engines.sampling import (
    greedy_verdict,
    speculative_verdict,
    verdict_uniforms,
    warp,
    wide,
)
from decodelab.engines.speculative import (
    Result,
    Spans,
    check_finite,
    draws,
    keep_ends,
    to_device,
    uniforms,
)


def room(tokens: int, k: int) -> int:
    """The static cache that a sequence of `tokens` (prompt and budget) needs when speculating K
    ahead: the last proposal may overshoot the budget by K + 1."""
    return tokens + k + 1


class Verdicts:
    """The iterations launched and not yet read: each one's [n, next, K proposals] on its way to
    the host, in one of two pinned buffers (at most two iterations are in flight)."""

    def __init__(self, k: int, device: torch.device):
        cuda = device.type == "cuda"
        self.buffers = [torch.empty(k + 2, dtype=torch.long, pin_memory=cuda) for _ in "ab"]
        self.events = [torch.cuda.Event() if cuda else None for _ in "ab"]
        self.queue: deque[int] = deque()
        self.launched = 0

    def __len__(self) -> int:
        return len(self.queue)

    def send(self, verdict: torch.Tensor) -> None:
        slot = self.launched % 2
        self.buffers[slot].copy_(verdict, non_blocking=True)
        if self.events[slot] is not None:
            self.events[slot].record()
        self.queue.append(slot)
        self.launched += 1

    def receive(self) -> list[int]:
        """The oldest iteration's [n, next, proposals], once the device has written it."""
        slot = self.queue.popleft()
        if self.events[slot] is not None:
            self.events[slot].synchronize()
        return self.buffers[slot].tolist()


class Buffers:
    """The loop's state at draft length K, in buffers fixed for the target engine's lifetime, which
    the graphs read and write in place: the draft's next input (the sequence's last two tokens),
    the uniforms of a proposal and of a verdict, and how far the verdict moved both caches back."""

    def __init__(self, k: int, device: torch.device):
        dtype = wide(device)
        self.d_ids = torch.zeros(2, dtype=torch.long, device=device)
        self.u = torch.zeros(k, 1, dtype=dtype, device=device)
        self.u_accept = torch.zeros(k, dtype=dtype, device=device)
        self.u_next = torch.zeros(1, 1, dtype=dtype, device=device)
        self.back = torch.zeros((), dtype=torch.long, device=device)


def propose(draft, d_ids: torch.Tensor, u: torch.Tensor | None, k: int, s: Sampling):
    """The draft's turn: (its K proposals' distributions or None, its logits after d_ids, the
    target's input [the last token, K proposals])."""
    proposals, probs, first = draws(draft.step, d_ids, k, s, u)
    return probs, first, torch.cat([d_ids[1:], proposals])


def decide(logits: torch.Tensor, probs: torch.Tensor | None, ids: torch.Tensor,
           u_accept: torch.Tensor | None, u_next: torch.Tensor | None, buffers: Buffers, k: int,
           s: Sampling) -> torch.Tensor:
    """The device's turn after a verification of `ids` [the last token, K proposals]: the
    verdict [n, next, K proposals]; in place, the draft's next input and how far both caches
    move back (K - n: each holds K - n tokens past its next length)."""
    logits, t_last, proposals = logits[0].float(), ids[:1], ids[1:]
    if s.greedy:
        decided = greedy_verdict(logits, proposals)
    else:
        p = warp(logits, s.temperature, s.top_k, s.top_p)
        decided = speculative_verdict(p, probs, proposals, u=(u_accept, u_next))
    n = decided[:1]
    before = torch.where(n > 0, proposals.index_select(0, (n - 1).clamp_min(0)), t_last)
    buffers.d_ids.copy_(torch.cat([before, decided[1:]]))
    buffers.back.copy_(k - decided[0])
    return torch.cat([decided, proposals])


def iterate(target, draft, buffers: Buffers, k: int, s: Sampling, draft_generator,
            target_generator, spans: Spans):
    """Launch one iteration, no sync: (the verdict [n, next, K proposals], the target's and the
    draft's logits). Each pass and the verdict replay a graph that reads the loop's buffers and
    the other graphs' outputs in place: a sampled verdict is some thirty small kernels, and each
    copy or replay outside a graph one launch more."""
    device = buffers.d_ids.device  # both roles'
    u = uniforms(k, s, draft_generator, device, out=buffers.u)
    with spans.span("draft", device, passes=k):
        probs, d_logits, ids = draft.replay(
            ("pipelined", k, s), lambda x, v: propose(draft, x, v, k, s), (buffers.d_ids, u),
            k + 1, held=True)
    with spans.span("target", device):
        logits = target.replay(("pipelined", k + 1), lambda x: target.run(x[None], k + 1),
                               (ids,), k + 1, held=True)
    v = (None, None) if s.greedy else verdict_uniforms(
        k, target_generator, device, out=(buffers.u_accept, buffers.u_next))

    def counters():  # both caches' positions: read when the verdict is captured, not per replay
        return target.counters() + draft.counters()

    def decided(*x):
        verdict = target.decide(*x, buffers, k, s)
        # Outside the compiled verdict (`fuse_verdict`): Inductor fuses this move with the sum
        # that yields n into one kernel whose blocks for the other counters can read n before the
        # block writing it has run, a race.
        torch._foreach_add_(counters(), buffers.back, alpha=-1)
        return verdict

    verdict = target.between.replay(
        ("verdict", k, s, draft), decided, (logits, probs, ids, *v), warm_ups=2,
        undo=lambda: torch._foreach_add_(counters(), buffers.back), held=True)
    return verdict, logits, d_logits


@torch.inference_mode()
def generate(target, draft, prompt: list[int], budget: int, k: int, s: Sampling = GREEDY,
             draft_generator: torch.Generator | None = None,
             target_generator: torch.Generator | None = None) -> Result:
    """`speculative.generate` on two pipelined engines (`speculative.pipelines`), with the
    correct rule."""
    for model in (target, draft):
        model.check_room(room(len(prompt) + budget, k))
    device = target.device
    t_cache, d_cache = target.new_cache(), draft.new_cache()
    out, spans, verdicts = Result(tokens=[]), Spans(), Verdicts(k, device)
    kept = {"target": [], "draft": []}
    seq = list(prompt)
    start = now(device)
    ids = to_device(prompt, device)
    keep_ends(kept["target"], spans.feed("target", target, t_cache, ids[:-1], keep=1))
    if len(prompt) > 2:
        spans.feed("draft", draft, d_cache, ids[:-2], keep=1)
    if k not in target.buffers:
        target.buffers[k] = Buffers(k, device)
    buffers = target.buffers[k]
    buffers.d_ids.copy_(ids[-2:])
    while len(seq) - len(prompt) < budget:
        # Launch while even K + 1 tokens from every iteration in flight leave the budget short.
        while len(verdicts) < 2 and len(seq) - len(prompt) + (k + 1) * len(verdicts) < budget:
            verdict, t_logits, d_logits = iterate(
                target, draft, buffers, k, s, draft_generator, target_generator, spans)
            verdicts.send(verdict)
            keep_ends(kept["target"], t_logits)
            keep_ends(kept["draft"], d_logits)
        n, nxt, *proposals = verdicts.receive()
        seq += proposals[:n] + [nxt]
        out.accepted.append(n)
        out.proposals.append(k)
    out.total_s = now(device) - start
    t_cache.length, d_cache.length = len(seq) - 1, len(seq) - 2  # where the devices' are
    check_finite({"target": target, "draft": draft}, kept)
    out.proposed = out.draft_forwards = k * len(out.accepted)
    spans.record(out)
    out.host_gap_s = math.nan  # the device runs the next iteration through the host's turn
    out.tokens = seq[len(prompt):len(prompt) + budget]
    return out
