"""Throughput of batched decoding, tokens per second over the batch, per mode and batch size:
autoregressive, synchronized speculation with a draft model, synchronized self-speculation (every
row the same K), the non-synchronized batch driven by `scheduler` and, given a refresh layer, the
same batch with its views re-selected every draft step (`refreshed`); plus the batched forward
times that the scheduler's cost model is fitted to, measured on the same model first.

Prompts are windows of held-out text at seeded offsets (`longstudy.heldout_files`: a `train`
model's own held-out files, one stream), so that acceptance varies across the rows of a batch as
it does across real requests; one batch's prompts run from half its context to all of it.

The sparse view of `batched` is a mask: a drafting row still reads every slot, so on this
executor a draft forward costs what a one-token full forward costs, and the fit says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from decodelab.backends import models
from decodelab.backends.devices import fingerprint, now
from decodelab.config.settings import BatchedJob
from decodelab.core.errors import DecodelabError
from decodelab.engines import batched
from decodelab.engines.scheduler import CostModel, Posterior, fitted_cost, round_k
from decodelab.engines.sparse_kv import Policy
from decodelab.engines.speculative import Result
from decodelab.studies.long.run import heldout_files, vocab_size

MODES = ("autoregressive", "synchronized", "self_synchronized", "unsynchronized")
REFRESHED = "refreshed"
WIDTHS = (1, 3, 5)  # tokens per row in the timed verification forwards
TIMINGS = 3  # forwards per shape, the median kept: a shape's first forward can be cold


def heldout_stream(model_dir: str, context: int, seed: int) -> torch.Tensor:
    """The target's held-out files as one token stream (seeded random ids for a model without a
    tokenizer), refused when it is too short for a prompt."""
    files = heldout_files(model_dir)
    if files is None:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(vocab_size(model_dir), (4 * context,), generator=g)
    stream = torch.tensor([t for _, ids in files for t in ids])
    if len(stream) <= context:
        raise DecodelabError(f"config 'batched.contexts': a prompt of {context} tokens wanted, "
                             f"the target's held-out files hold {len(stream)}; ask for shorter")
    return stream


def prompts(stream: torch.Tensor, batch: int, context: int, seed: int) -> list[list[int]]:
    """A batch of prompts of different lengths from the stream, from half the context to all
    of it, each at its own seeded offset."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(context // 2, context, batch).long().tolist()
    starts = torch.randint(len(stream) - context, (batch,), generator=g).tolist()
    return [stream[s:s + n].tolist() for s, n in zip(starts, lengths, strict=True)]


def prompt_seed(seed: int, process: int, round_: int) -> int:
    """Distinct prompt sets for every round of every process."""
    return seed + 1000 * process + round_


@torch.inference_mode()
def forward_seconds(model, batch: int, context: int, width: int, seed: int) -> float:
    """One batched forward of `width` tokens per row over a cache of `context` tokens."""
    rows = batched.new_rows(model, batch)
    g = torch.Generator().manual_seed(seed)
    filled = torch.randint(0, model.config.vocab_size, (batch, context + width), generator=g)
    filled = filled.tolist()
    first = rows.slots
    batched.forward(model, rows, [p[:context] for p in filled], rows.lengths, rows.committed)
    for r in range(batch):
        batched.commit(rows, r, first, context)
    chunks = [p[context:context + width] for p in filled]
    start = now(rows.committed.device)
    batched.forward(model, rows, chunks, rows.lengths, rows.committed)
    return now(rows.committed.device) - start


def cost_rows(model, batches, contexts, seed: int = 0) -> list[dict]:
    return [{"batch": b, "context": c, "tokens": w,
             "seconds": float(np.median([forward_seconds(model, b, c, w, seed)
                                         for _ in range(TIMINGS)]))}
            for b in batches for c in contexts for w in WIDTHS]


def scheduled(cost: CostModel, batch: int, context: int, k_max: int):
    """next_k for `batched.unsynchronized`: each row's K* from its own acceptance so far."""
    def next_k(row: int, result: Result) -> int:
        posterior = Posterior()
        for proposed, accepted in zip(result.proposals, result.accepted, strict=True):
            posterior = posterior.update(proposed, accepted)
        return round_k(posterior, cost, batch, context, k_max)
    return next_k


def modes(spec: BatchedJob) -> tuple[str, ...]:
    return MODES if spec.refresh_layer is None else (*MODES, REFRESHED)


def refresh_of(mode: str, spec: BatchedJob) -> int | None:
    """The mode's refresh layer: only the refreshed mode has one."""
    return spec.refresh_layer if mode == REFRESHED else None


def run_mode(mode: str, target, draft, batch_prompts, spec: BatchedJob, policy: Policy,
             cost: CostModel) -> batched.Batch:
    budget, k = spec.budget, spec.k
    if mode == "autoregressive":
        return batched.autoregressive(target, batch_prompts, budget)
    if mode == "synchronized":
        return batched.synchronized(target, draft, batch_prompts, budget, k)
    if mode == "self_synchronized":
        return batched.unsynchronized(target, batch_prompts, budget, batched.fixed(k), policy)
    context = max(map(len, batch_prompts))
    return batched.unsynchronized(target, batch_prompts, budget,
                                  scheduled(cost, len(batch_prompts), context, 2 * k), policy,
                                  refresh=refresh_of(mode, spec))


def throughput_rows(target, draft, target_dir: str, spec: BatchedJob, process: int,
                    cost: CostModel) -> list[dict]:
    rows, k, policy = [], spec.k, Policy(spec.policy, spec.kv_budget)
    stream = heldout_stream(target_dir, max(spec.contexts), spec.seed)
    for round_ in range(spec.rounds):
        for context in spec.contexts:
            for b in spec.batches:
                seed = prompt_seed(spec.seed, process, round_)
                batch_prompts = prompts(stream, b, context, seed)
                for mode in modes(spec):
                    out = run_mode(mode, target, draft, batch_prompts, spec, policy, cost)
                    accepted = sum(sum(r.accepted) for r in out.rows)
                    proposed = sum(r.proposed for r in out.rows)
                    refresh = refresh_of(mode, spec)
                    rows.append({"mode": mode, "batch": b, "context": context, "k": k,
                                 "policy": policy.name, "kv_budget": policy.budget,
                                 "refresh_layer": np.nan if refresh is None else refresh,
                                 "process": process, "round": round_, "tokens": out.tokens,
                                 "seconds": out.total_s, "tokens_per_s": out.tokens_per_s,
                                 "forwards": out.forwards,
                                 "acceptance": accepted / proposed if proposed else float("nan")})
    return rows


def expected_rows(spec: BatchedJob) -> tuple[int, str]:
    batches, contexts, rounds = len(spec.batches), len(spec.contexts), spec.rounds
    n = len(modes(spec))
    return (n * batches * contexts * rounds,
            f"{n} modes x {batches} batch sizes x {contexts} contexts x {rounds} rounds")


def run(target_dir: str, draft_dir: str, backend: str, spec: BatchedJob, process: int
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(throughput rows, the forward timings the scheduler's cost model was fitted to), of one
    process of config 'batched' (`Batched.job`)."""
    dtype = spec.dtype
    target = models.load(target_dir, backend, dtype, role="target")
    draft = models.load(draft_dir, backend, dtype, role="draft")
    costs = cost_rows(target, spec.batches, spec.contexts, spec.seed + process)
    rows = throughput_rows(target, draft, target_dir, spec, process, fitted_cost(costs))
    meta = fingerprint(backend, spec.job_spec())
    return pd.DataFrame(rows).assign(**meta), pd.DataFrame(costs).assign(**meta)
