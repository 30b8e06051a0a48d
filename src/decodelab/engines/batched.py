"""Batched decoding of B requests with different prompt lengths in one KV cache: autoregressive,
synchronized speculation (every row drafts K with a draft model, the batch verifies K+1 together)
and the non-synchronized batch (one forward per tick in which some rows draft and others verify).

One `DynamicCache` holds the batch; its time axis is a set of slots that every row shares. Rows
feed different numbers of tokens per forward and accept different numbers of draft tokens, so a
row's tokens do not fill its slots: a slot table (`Rows.committed`, [B, S]) says which slots hold
the row's valid KV, and every forward gets its own 4-D mask built from it with true per-row
`position_ids`. A rejected token is rolled back by clearing its slot, not by cropping: `crop`
cuts every row at once, and transformers 5's cache has no per-row length. Only the tail that no
row uses is cropped; holes in the middle are squeezed out (`compact`) when they pile up. So the
cache is copied now and then instead of every time rows disagree, and nothing about the cache
class has to change.

In the non-synchronized batch the draft is the target itself through a sparse view of its cache
(self-speculation, as `longctx`): a view is a set of slots, so a drafting row is one more row of
the same forward under a sparser mask; a separate draft model could never share the target's
forward. The view is a mask shared by every layer and head, so the policies that select per layer
(`retrieval`) are refused. Draft tokens are fed under the sparse mask into scratch slots that
only their own row's later draft steps see, and are fed again, fully attended, to verify. With a
refresh layer (`refresh`) the view differs across layers and is re-selected at every draft step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from decodelab.backends.devices import now
from decodelab.backends.models import require_finite
from decodelab.config.settings import GREEDY, Sampling
from decodelab.core.errors import DecodelabError
from decodelab.engines.decode import cache_kwarg, new_cache
from decodelab.engines.refresh import RefreshLayer, ranks
from decodelab.engines.sampling import greedy_accept, speculative_accept, warp
from decodelab.engines.sparse_kv import Policy, sink_window
from decodelab.engines.speculative import Result, check_vocab, device_of, draw

SLACK = 32  # unused slots tolerated beyond the fullest row before the cache is compacted
PER_LAYER = ("retrieval",)  # policies whose view differs across layers and heads

Generators = Sequence[torch.Generator | None] | None


@dataclass
class Rows:
    """One model's batch cache and its slot table."""

    cache: DynamicCache
    committed: torch.Tensor  # [B, S] bool: slots holding the row's valid, fully attended KV
    scratch: torch.Tensor  # [B, S] bool: the row's draft tokens of this round (sparse KV)
    lengths: list[int]  # committed tokens per row: the true position of its next token

    @property
    def slots(self) -> int:
        return self.committed.shape[1]


@dataclass
class Batch:
    rows: list[Result]
    total_s: float = 0.0
    forwards: int = 0  # batched forward passes

    @property
    def tokens(self) -> int:
        return sum(len(r.tokens) for r in self.rows)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_s if self.total_s > 0 else float("nan")


def new_rows(model, batch: int) -> Rows:
    empty = torch.zeros(batch, 0, dtype=torch.bool, device=device_of(model))
    return Rows(new_cache(model), empty, empty.clone(), [0] * batch)


def chunk_mask(context: torch.Tensor, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive 4-D mask [B, 1, w, S + w] of a forward that feeds counts[r] tokens of row r
    into w new slots: a real query sees its row's `context` slots and the chunk's tokens up to
    itself; a padding query sees only itself (a query that sees nothing gives NaN in SDPA)."""
    batch, w = len(counts), int(counts.max())
    device = context.device
    real = torch.arange(w, device=device)[None] < counts[:, None]  # [B, w]
    causal = torch.ones(w, w, dtype=torch.bool, device=device).tril()[None] & real[:, None, :]
    new = torch.where(real[:, :, None], causal, torch.eye(w, dtype=torch.bool, device=device))
    past = context[:, None, :] & real[:, :, None]
    allowed = torch.cat([past.expand(batch, w, -1), new], dim=-1)[:, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
        ~allowed, torch.finfo(dtype).min)


def forward(model, rows: Rows, chunks: Sequence[Sequence[int]], starts: Sequence[int],
            context: torch.Tensor) -> torch.Tensor:
    """Feed chunks[r] (maybe empty) at true positions starts[r]... into new slots; their queries
    see `context` ([B, S]). Logits [B, w, V]; the new slots are neither committed nor scratch."""
    device = rows.committed.device
    counts = torch.tensor([len(c) for c in chunks], device=device)
    w = int(counts.max())
    ids = torch.tensor([list(c) + [0] * (w - len(c)) for c in chunks], device=device)
    offsets = torch.arange(w, device=device)[None].minimum((counts[:, None] - 1).clamp_min(0))
    positions = torch.tensor(list(starts), device=device)[:, None] + offsets
    mask = chunk_mask(context, counts, model.dtype)
    logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                   **{cache_kwarg(model): rows.cache}).logits.float()
    pad = torch.zeros(len(chunks), w, dtype=torch.bool, device=device)
    rows.committed = torch.cat([rows.committed, pad], dim=1)
    rows.scratch = torch.cat([rows.scratch, pad.clone()], dim=1)
    return logits


def commit(rows: Rows, row: int, first: int, n: int) -> None:
    rows.committed[row, first:first + n] = True
    rows.lengths[row] += n


def rollback(rows: Rows, row: int, keep: int) -> None:
    """Keep the row's first `keep` committed tokens; the slots of the rest become holes."""
    used = rows.committed[row].nonzero()[:, 0]
    rows.committed[row, used[keep:]] = False
    rows.lengths[row] = min(rows.lengths[row], keep)


def trim(rows: Rows) -> None:
    """Crop the slots no row uses at the end; squeeze out the holes when they pile up."""
    used = rows.committed | rows.scratch
    occupied = used.any(0).nonzero()
    last = int(occupied[-1]) + 1 if len(occupied) else 0
    if last < rows.slots:
        rows.cache.crop(last - rows.slots)
        rows.committed, rows.scratch = rows.committed[:, :last], rows.scratch[:, :last]
    if rows.slots > int(used.sum(1).max()) + SLACK:
        compact(rows)


def compact(rows: Rows) -> None:
    """Move every row's used slots, in order, to the front of the cache (one gather per layer);
    the shorter rows' tails are holes."""
    used = rows.committed | rows.scratch
    width = int(used.sum(1).max())
    # A stable sort of "unused" puts each row's used slots first, in their order.
    order = (~used).to(torch.int8).sort(dim=1, stable=True).indices[:, :width]
    for layer in rows.cache.layers:
        index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
        layer.keys, layer.values = layer.keys.gather(2, index), layer.values.gather(2, index)
    rows.committed, rows.scratch = rows.committed.gather(1, order), rows.scratch.gather(1, order)


def draw_rows(logits: torch.Tensor, s: Sampling, generators: Generators
              ) -> tuple[list[int], list[torch.Tensor]]:
    """One token per row from logits [B, V] (each row with its own generator) and the
    distributions they came from; one host sync."""
    if s.greedy:
        return logits.argmax(-1).tolist(), list(logits)
    drawn = [draw(row, s, g) for row, g in zip(logits, generators_of(generators, len(logits)),
                                               strict=True)]
    return torch.cat([t for t, _ in drawn]).tolist(), [q for _, q in drawn]


def generators_of(generators: Generators, batch: int) -> list[torch.Generator | None]:
    if generators is None:
        return [None] * batch
    if len(generators) != batch:
        raise DecodelabError(f"{len(generators)} generators for a batch of {batch} requests")
    return list(generators)


def check_prompts(prompts: Sequence[Sequence[int]]) -> None:
    if not prompts or not all(prompts):
        raise DecodelabError("batched decoding needs at least one request, each with a prompt "
                             "of at least one token")


def pending(seq: list[int], rows: Rows, row: int) -> list[int]:
    """The tokens of `seq` that the row's cache has not seen yet."""
    return seq[rows.lengths[row]:]


class Finite:
    """The first and latest logits of each role, checked after the last timestamp."""

    def __init__(self):
        self.kept: dict[str, tuple] = {}

    def keep(self, role: str, model, logits: torch.Tensor) -> None:
        first = self.kept.get(role, (model, logits))[1]
        self.kept[role] = (model, first, logits)

    def check(self) -> None:
        for role, (model, *logits) in self.kept.items():
            require_finite(torch.cat([x.reshape(-1) for x in logits]), model, role,
                           "in a batched forward")


@torch.inference_mode()
def autoregressive(model, prompts: Sequence[Sequence[int]], budget: int, s: Sampling = GREEDY,
                   generators: Generators = None) -> Batch:
    """Exactly `budget` tokens per request from `model` alone: one batched forward per token."""
    check_prompts(prompts)
    batch = len(prompts)
    rows, finite = new_rows(model, batch), Finite()
    out = Batch(rows=[Result(tokens=[]) for _ in prompts])
    chunks = [list(p) for p in prompts]
    start = now(device_of(model))
    for _ in range(budget):
        first = rows.slots
        logits = forward(model, rows, chunks, rows.lengths, rows.committed)
        last = logits[torch.arange(batch), [len(c) - 1 for c in chunks]]
        finite.keep("model", model, last)
        for r, chunk in enumerate(chunks):
            commit(rows, r, first, len(chunk))
        tokens, _ = draw_rows(last, s, generators)
        for r, token in enumerate(tokens):
            out.rows[r].tokens.append(token)
            out.rows[r].accepted.append(0)
        chunks = [[t] for t in tokens]
        out.forwards += 1
    out.total_s = now(device_of(model)) - start
    finite.check()
    return out


def clipped(k: int, row: Result, budget: int) -> int:
    """K for the row's next round: never past the budget; -1 once it is done."""
    left = budget - len(row.tokens)
    return min(k, left - 1) if left > 0 else -1


def accept_row(logits: torch.Tensor, drafts: list[int], probs: list[torch.Tensor], s: Sampling,
               generator: torch.Generator | None, accept) -> tuple[int, int]:
    """`speculative.verify`'s rule on one row: logits [k+1, V] of the target at its positions."""
    tokens = torch.tensor(drafts, dtype=torch.long, device=logits.device)
    if s.greedy:
        return greedy_accept(logits, tokens)
    p = warp(logits, s.temperature, s.top_k, s.top_p)
    q = torch.stack(probs) if probs else p.new_zeros(0, p.shape[-1])
    return accept(p, q, tokens, generator)


def record(row: Result, seq: list[int], drafts: list[int], n: int, token: int) -> None:
    seq += drafts[:n] + [token]
    row.tokens += drafts[:n] + [token]
    row.accepted.append(n)
    row.proposals.append(len(drafts))
    row.proposed += len(drafts)
    row.draft_forwards += len(drafts)


@torch.inference_mode()
def synchronized(target, draft, prompts: Sequence[Sequence[int]], budget: int, k: int,
                 s: Sampling = GREEDY, draft_generators: Generators = None,
                 target_generators: Generators = None, accept=speculative_accept) -> Batch:
    """Exactly `budget` tokens per request; per round every row drafts K tokens with `draft`
    (fewer near its budget), then one forward of `target` verifies K+1 positions of every row,
    each row accepting and rolling back on its own."""
    check_prompts(prompts)
    check_vocab(target, draft)
    batch = len(prompts)
    t_rows, d_rows, finite = new_rows(target, batch), new_rows(draft, batch), Finite()
    d_gens, t_gens = generators_of(draft_generators, batch), generators_of(target_generators,
                                                                           batch)
    out = Batch(rows=[Result(tokens=[]) for _ in prompts])
    seqs = [list(p) for p in prompts]
    start = now(device_of(target))
    while True:
        ks = [clipped(k, row, budget) for row in out.rows]
        if max(ks) < 0:
            break
        drafts, probs = propose(draft, d_rows, seqs, ks, s, d_gens, finite)
        out.forwards += max(ks)
        chunks = [pending(seq, t_rows, r) + d if ks[r] >= 0 else []
                  for r, (seq, d) in enumerate(zip(seqs, drafts, strict=True))]
        first = t_rows.slots
        logits = forward(target, t_rows, chunks, t_rows.lengths, t_rows.committed)
        out.forwards += 1
        for r, chunk in enumerate(chunks):
            if ks[r] < 0:
                continue
            commit(t_rows, r, first, len(chunk))
            row_logits = logits[r, len(chunk) - ks[r] - 1:len(chunk)]
            finite.keep("target", target, row_logits)
            n, token = accept_row(row_logits, drafts[r], probs[r], s, t_gens[r], accept)
            record(out.rows[r], seqs[r], drafts[r], n, token)
            rollback(t_rows, r, len(seqs[r]) - 1)
            rollback(d_rows, r, len(seqs[r]) - 1)
        trim(t_rows)
        trim(d_rows)
    out.total_s = now(device_of(target)) - start
    finite.check()
    return out


def propose(draft, rows: Rows, seqs: list[list[int]], ks: list[int], s: Sampling,
            generators: list, finite: Finite) -> tuple[list[list[int]], list[list]]:
    """ks[r] draft tokens per row (rows at 0 or -1 draft none), in max(ks) batched forwards,
    and the distributions they were drawn from."""
    batch = len(seqs)
    drafts: list[list[int]] = [[] for _ in seqs]
    probs: list[list] = [[] for _ in seqs]
    for step in range(max(ks)):
        chunks = [(pending(seqs[r], rows, r) if step == 0 else drafts[r][-1:])
                  if ks[r] > step else [] for r in range(batch)]
        first = rows.slots
        logits = forward(draft, rows, chunks, rows.lengths, rows.committed)
        last = logits[torch.arange(batch), [max(len(c) - 1, 0) for c in chunks]]
        finite.keep("draft", draft, last)
        tokens, q = draw_rows(last, s, generators)
        for r, chunk in enumerate(chunks):
            if chunk:
                commit(rows, r, first, len(chunk))
                drafts[r].append(tokens[r])
                probs[r].append(q[r])
    return drafts, probs


def fixed(k: int) -> Callable[[int, Result], int]:
    """The same K for every row and round: the synchronized self-speculative schedule."""
    return lambda row, result: k


def sparse_context(rows: Rows, row: int, policy: Policy) -> torch.Tensor:
    """[S] bool: the row's committed slots that `policy` keeps."""
    used = rows.committed[row].nonzero()[:, 0]
    context = torch.zeros_like(rows.committed[row])
    if len(used):
        keys = rows.cache.layers[0].keys[row:row + 1, :, used]
        context[used[policy.select(DynamicCache(ddp_cache_data=[(keys, keys)]))[0][0]]] = True
    return context


def draft_context(rows: Rows, policy: Policy, drafting: torch.Tensor) -> torch.Tensor:
    """[B, S]: what each row's queries see: a drafting row ([B] bool) its view of its committed
    slots and its own draft tokens, any other row its committed slots. Sink + window is drawn for
    every row at once (no host sync); other policies row by row."""
    if policy.name == "full":
        view = rows.committed
    elif policy.name == "sink_window":
        n = rows.committed.sum(1, keepdim=True)
        view = rows.committed & sink_window(ranks(rows.committed), n, policy.budget)
    else:
        view = torch.stack([sparse_context(rows, r, policy) if drafting[r]
                            else rows.committed[r] for r in range(len(drafting))])
    return torch.where(drafting[:, None], view | rows.scratch, rows.committed)


def refreshed_forward(model, rows: Rows, chunks, starts, context: torch.Tensor,
                      drafting: torch.Tensor, refresher: RefreshLayer) -> torch.Tensor:
    """`forward` with the refresh layer reading each drafting row's full cache."""
    full = torch.where(drafting[:, None], rows.committed | rows.scratch, context)
    counts = torch.tensor([len(c) for c in chunks], device=context.device)
    refresher.prepare(context, full, drafting, rows.committed,
                      lambda ctx: chunk_mask(ctx, counts, model.dtype))
    with refresher:
        return forward(model, rows, chunks, starts, context)


@torch.inference_mode()
def unsynchronized(model, prompts: Sequence[Sequence[int]], budget: int,
                   next_k: Callable[[int, Result], int], policy: Policy, s: Sampling = GREEDY,
                   draft_generators: Generators = None, target_generators: Generators = None,
                   accept=speculative_accept, refresh: int | None = None) -> Batch:
    """Exactly `budget` tokens per request, self-speculating: each row drafts next_k(row, its
    result so far) tokens through `policy`'s view of its cache, one per tick, then verifies them
    on the full cache, while the other rows draft or verify in the same forward. `refresh`: the
    refresh layer, which re-selects a drafting row's view for the layers after it at every draft
    step (`decodelab.engines.refresh`); `policy` then gives the view of the layers before it."""
    check_prompts(prompts)
    if policy.name in PER_LAYER:
        raise DecodelabError(f"sparse-KV policy {policy.name!r} selects per layer and head; the "
                             "non-synchronized batch draws one view per row for every layer")
    refresher = None if refresh is None else RefreshLayer(model, refresh, policy.budget)
    batch = len(prompts)
    rows, finite = new_rows(model, batch), Finite()
    d_gens, t_gens = generators_of(draft_generators, batch), generators_of(target_generators,
                                                                           batch)
    out = Batch(rows=[Result(tokens=[]) for _ in prompts])
    seqs = [list(p) for p in prompts]
    start = now(device_of(model))
    # As in longctx: the cache holds every token but the latest before a round.
    prefill = [list(p[:-1]) for p in prompts]
    if any(prefill):
        first = rows.slots
        forward(model, rows, prefill, rows.lengths, rows.committed)
        out.forwards += 1
        for r, chunk in enumerate(prefill):
            commit(rows, r, first, len(chunk))
    ks = [clipped(next_k(r, out.rows[r]), out.rows[r], budget) for r in range(batch)]
    drafts: list[list[int]] = [[] for _ in prompts]
    probs: list[list] = [[] for _ in prompts]
    while max(ks) >= 0:
        verifying = [0 <= ks[r] == len(drafts[r]) for r in range(batch)]
        chunks = [([seqs[r][-1]] + drafts[r] if verifying[r] else (drafts[r] or seqs[r])[-1:])
                  if ks[r] >= 0 else [] for r in range(batch)]
        starts = [rows.lengths[r] + (0 if verifying[r] else len(drafts[r])) for r in range(batch)]
        drafting = [r for r in range(batch) if ks[r] >= 0 and not verifying[r]]
        drafts_now = torch.zeros(batch, dtype=torch.bool, device=rows.committed.device)
        drafts_now[drafting] = True
        context = draft_context(rows, policy, drafts_now)
        first = rows.slots
        logits = (refreshed_forward(model, rows, chunks, starts, context, drafts_now, refresher)
                  if refresher and drafting else forward(model, rows, chunks, starts, context))
        out.forwards += 1
        if drafting:
            last = logits[drafting, 0]
            finite.keep("draft", model, last)
            tokens, q = draw_rows(last, s, [d_gens[r] for r in drafting])
            for r, token, dist in zip(drafting, tokens, q, strict=True):
                rows.scratch[r, first] = True
                drafts[r].append(token)
                probs[r].append(dist)
        for r in (r for r in range(batch) if verifying[r]):
            commit(rows, r, first, len(chunks[r]))
            finite.keep("target", model, logits[r, :len(chunks[r])])
            n, token = accept_row(logits[r, :len(chunks[r])], drafts[r], probs[r], s, t_gens[r],
                                  accept)
            record(out.rows[r], seqs[r], drafts[r], n, token)
            rollback(rows, r, len(seqs[r]) - 1)
            rows.scratch[r] = False
            drafts[r], probs[r] = [], []
            ks[r] = clipped(next_k(r, out.rows[r]), out.rows[r], budget)
        trim(rows)
    out.total_s = now(device_of(model)) - start
    finite.check()
    return out
