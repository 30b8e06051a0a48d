"""A seeded simulator of batched speculation for the scheduler alone (no models): B requests,
each with its own per-token acceptance that may switch between two regimes, decoded under the
synchronized schedule with one fixed K, or per request by `scheduler` (its Beta posterior and
K*) in the non-synchronized batch.

Costs come from a `scheduler.CostModel`. A tick in which every row drafts costs t_draft(B, L), one
in which every row verifies w tokens t_verify(B, L, w); a mixed tick costs each row's share of
its own kind, t_draft / B per drafting row plus t_verify(B, L, w) / B per verifying row, w the
widest verification (the narrower ones are padded to it, as in `batched.unsynchronized`). That
share is the KV-bound reading of a long-context batch: each row's cost is the KV it reads.

Each request draws its draft tokens' acceptances from its own seeded stream, the same stream
under every schedule, so schedules are compared on common random numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from decodelab.core.errors import DecodelabError
from decodelab.engines.scheduler import CostModel, Posterior, round_k


@dataclass(frozen=True)
class Request:
    alphas: tuple[float, float]  # per-token acceptance in regime 0 and regime 1
    switch: float = 0.0  # chance per verification that the regime flips


@dataclass
class Stream:
    """One request's regime and its stream of random numbers."""

    request: Request
    rng: np.random.Generator
    regime: int = 0

    def verify(self, k: int) -> int:
        """Accepted of k draft tokens: the leading run of successes, then maybe a switch."""
        alpha = self.request.alphas[self.regime]
        accepted = k
        for i, u in enumerate(self.rng.random(k).tolist()):  # a Python loop: k is a few tokens
            if u >= alpha:
                accepted = i
                break
        if self.rng.random() < self.request.switch:
            self.regime = 1 - self.regime
        return accepted


@dataclass
class Run:
    tokens: int = 0
    seconds: float = 0.0
    ks: list[int] = field(default_factory=list)  # K of every round of every request

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds


def streams(requests: Sequence[Request], seed: int) -> list[Stream]:
    if not requests:
        raise DecodelabError("the simulator needs at least one request")
    for r in requests:
        if not all(0 <= a <= 1 for a in r.alphas) or not 0 <= r.switch <= 1:
            raise DecodelabError(f"acceptance and switch chance lie in [0, 1], got {r}")
    return [Stream(r, np.random.default_rng([seed, i])) for i, r in enumerate(requests)]


def synchronized(requests: Sequence[Request], k: int, cost: CostModel, context: float,
                 horizon: float, seed: int) -> Run:
    """Every request drafts K, the batch verifies, until `horizon` simulated seconds."""
    rows, batch, run = streams(requests, seed), len(requests), Run()
    round_s = k * cost.t_draft(batch, context) + cost.t_verify(batch, context, k + 1)
    while run.seconds < horizon:
        run.seconds += round_s
        run.tokens += sum(row.verify(k) + 1 for row in rows)
        run.ks += [k] * batch
    return run


def tick_seconds(cost: CostModel, batch: int, context: float, drafting: int,
                 widths: list[int]) -> float:
    """A tick with `drafting` rows drafting and the others verifying widths[i] tokens each."""
    if not widths:
        return cost.t_draft(batch, context)
    verify = cost.t_verify(batch, context, max(widths))
    return (drafting * cost.t_draft(batch, context) + len(widths) * verify) / batch


def adaptive(requests: Sequence[Request], cost: CostModel, context: float, horizon: float,
             seed: int, k_max: int, decay: float = 1.0) -> Run:
    """Each request drafts while it has drafted fewer than its K* (from its posterior and the
    cost model), and verifies otherwise, in ticks shared by the batch."""
    rows, batch, run = streams(requests, seed), len(requests), Run()
    posteriors = [Posterior() for _ in rows]
    targets = [round_k(p, cost, batch, context, k_max) for p in posteriors]
    drafted = [0] * batch
    while run.seconds < horizon:
        verifying = {r for r in range(batch) if drafted[r] == targets[r]}
        widths = [targets[r] + 1 for r in verifying]
        run.seconds += tick_seconds(cost, batch, context, batch - len(verifying), widths)
        for r in range(batch):
            if r not in verifying:
                drafted[r] += 1
                continue
            n = rows[r].verify(targets[r])
            run.tokens += n + 1
            run.ks.append(targets[r])
            posteriors[r] = posteriors[r].update(targets[r], n, decay)
            targets[r] = round_k(posteriors[r], cost, batch, context, k_max)
            drafted[r] = 0
    return run


def best_fixed(requests: Sequence[Request], cost: CostModel, context: float, horizon: float,
               seed: int, k_max: int, k_min: int = 0) -> tuple[int, Run]:
    """The synchronized K in k_min..k_max with the highest throughput on these very streams:
    the best fixed K in hindsight, the strongest synchronized baseline (K = 0: autoregressive)."""
    runs = {k: synchronized(requests, k, cost, context, horizon, seed)
            for k in range(k_min, k_max + 1)}
    k = max(runs, key=lambda k: runs[k].throughput)
    return k, runs[k]
