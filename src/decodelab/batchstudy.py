"""Throughput of batched decoding, tokens per second over the batch, per mode and batch size:
autoregressive, synchronized speculation with a draft model, synchronized self-speculation (every
row the same K) and the non-synchronized batch driven by `scheduler`; plus the batched forward
times that the scheduler's cost model is fitted to, measured on the same model first.

The sparse view of `batched` is a mask: a drafting row still reads every slot, so on this
executor a draft forward costs what a one-token full forward costs, and the fit says so.
"""

from __future__ import annotations

import pandas as pd
import torch

from . import batched, models
from .devices import fingerprint, now
from .scheduler import CostModel, Posterior, fit_costs, round_k
from .sparse_kv import Policy
from .speculative import Result

MODES = ("autoregressive", "synchronized", "self_synchronized", "unsynchronized")
WIDTHS = (1, 3, 5)  # tokens per row in the timed verification forwards


def prompts(batch: int, context: int, vocab: int, seed: int) -> list[list[int]]:
    """Prompts of different lengths, from half the context to all of it."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(context // 2, context, batch).long().tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


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
             "seconds": forward_seconds(model, b, c, w, seed)}
            for b in batches for c in contexts for w in WIDTHS]


def fitted_cost(rows: list[dict]) -> CostModel:
    """Drafts are one-token forwards (see the module's note); verifications every width."""
    draft = [(r["batch"], r["context"], r["seconds"]) for r in rows if r["tokens"] == 1]
    verify = [(r["batch"], r["context"], r["tokens"], r["seconds"]) for r in rows]
    return fit_costs(draft, verify)


def scheduled(cost: CostModel, batch: int, context: int, k_max: int):
    """next_k for `batched.unsynchronized`: each row's K* from its own acceptance so far."""
    def next_k(row: int, result: Result) -> int:
        posterior = Posterior()
        for proposed, accepted in zip(result.proposals, result.accepted, strict=True):
            posterior = posterior.update(proposed, accepted)
        return round_k(posterior, cost, batch, context, k_max)
    return next_k


def run_mode(mode: str, target, draft, batch_prompts, budget: int, k: int, policy: Policy,
             cost: CostModel) -> batched.Batch:
    if mode == "autoregressive":
        return batched.autoregressive(target, batch_prompts, budget)
    if mode == "synchronized":
        return batched.synchronized(target, draft, batch_prompts, budget, k)
    if mode == "self_synchronized":
        return batched.unsynchronized(target, batch_prompts, budget, batched.fixed(k), policy)
    context = max(map(len, batch_prompts))
    return batched.unsynchronized(target, batch_prompts, budget,
                                  scheduled(cost, len(batch_prompts), context, 2 * k), policy)


def throughput_rows(target, draft, batches, contexts, budget: int, k: int, policy: Policy,
                    repeats: int, cost: CostModel, seed: int = 0) -> list[dict]:
    rows = []
    for repeat in range(repeats):
        for context in contexts:
            for b in batches:
                batch_prompts = prompts(b, context, target.config.vocab_size, seed + repeat)
                for mode in MODES:
                    out = run_mode(mode, target, draft, batch_prompts, budget, k, policy, cost)
                    accepted = sum(sum(r.accepted) for r in out.rows)
                    proposed = sum(r.proposed for r in out.rows)
                    rows.append({"mode": mode, "batch": b, "context": context, "k": k,
                                 "repeat": repeat, "tokens": out.tokens,
                                 "seconds": out.total_s, "tokens_per_s": out.tokens_per_s,
                                 "forwards": out.forwards,
                                 "acceptance": accepted / proposed if proposed else float("nan")})
    return rows


def expected_rows(batches, contexts, repeats: int) -> tuple[int, str]:
    return (len(MODES) * len(batches) * len(contexts) * repeats,
            f"{len(MODES)} modes x {len(batches)} batch sizes x {len(contexts)} contexts x "
            f"{repeats} repeats")


def run(target_dir: str, draft_dir: str, backend: str, dtype: str, batches, contexts,
        budget: int, k: int, policy: Policy, repeats: int, seed: int = 0
        ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(throughput rows, the forward timings the scheduler's cost model was fitted to)."""
    target = models.load(target_dir, backend, dtype, role="target")
    draft = models.load(draft_dir, backend, dtype, role="draft")
    costs = cost_rows(target, batches, contexts, seed)
    rows = throughput_rows(target, draft, batches, contexts, budget, k, policy, repeats,
                           fitted_cost(costs), seed)
    meta = fingerprint(backend, {"dtype": dtype})
    return pd.DataFrame(rows).assign(**meta), pd.DataFrame(costs).assign(**meta)
