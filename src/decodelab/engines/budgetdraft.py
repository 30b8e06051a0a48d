"""BudgetDraft's budget-robust objective for a separate sparse drafter (`config.DraftObjective`).

Each training sequence is a prefix and the `continuation` tokens after it that the loss sees
(BudgetDraft: 16K tokens, the last 256). The prefix goes once through the drafter without
gradients into a full KV cache, as BudgetDraft prefills it; then, with gradients:
- the full branch feeds the continuation on that full cache;
- the sparse branch feeds it on `sparse_kv.sparse_view` of the cache, selected by the same
  `Policy` code that drafts at inference under a budget drawn per step from `budgets` with
  `budget_weights`, at true positions (`longctx.TruePositions`). One drafting proposal of C
  tokens computes exactly these logits (the oracle test: a full-cache forward masked to the
  selection), and the branch costs the budget's memory, not an L x L mask.
Both are matched to the teacher's full-cache distribution at the continuation positions by
KL(teacher || drafter): soft targets, not BudgetDraft's argmax cross-entropy, because the study
measures sampled acceptance too, where a token is accepted with probability sum min(p, q), which
argmax labels do not train for; greedily both train the argmax. The loss is
KL_full + sparse_weight * KL_sparse. Ablations: sparse_weight 0 (full cache only), one budget
(fixed), and `no_prefix`, which feeds the continuation alone (true positions, empty cache): the
control that shows whether the drafter uses the prefix at all.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from decodelab.config.settings import DraftObjective
from decodelab.engines.decode import cache_kwarg
from decodelab.engines.longctx import TruePositions
from decodelab.engines.sparse_kv import Policy, QueryProbe, select_rows, sparse_view


def describe(objective: DraftObjective) -> str:
    """The manifest's `objective` line."""
    on = f"KL(teacher || model) on the last {objective.continuation} tokens"
    if objective.objective == "no_prefix":
        return f"{on}, without the prefix (no-prefix control)"
    budgets = "/".join(map(str, objective.budgets))
    weights = "/".join(f"{w:g}" for w in objective.budget_weights)
    return (f"{on}: full cache + {objective.sparse_weight:g} * sparse cache "
            f"({objective.sparse_policy}, budgets {budgets}, weights {weights})")


def check_budgets(objective: DraftObjective) -> None:
    """Every budget must suit the policy (`Policy` raises naming the minimum)."""
    for budget in objective.budgets:
        Policy(objective.sparse_policy, budget)


def draw_policy(objective: DraftObjective, gen: torch.Generator) -> Policy:
    weights = torch.tensor(objective.budget_weights, dtype=torch.float)
    i = int(torch.multinomial(weights, 1, generator=gen))
    seed = int(torch.randint(2**31, (1,), generator=gen))  # random_chunks: new chunks each step
    return Policy(objective.sparse_policy, objective.budgets[i], seed)


@torch.no_grad()
def prefill(model, prefix: torch.Tensor, retrieval: bool
            ) -> tuple[DynamicCache, list[list[torch.Tensor]] | None]:
    """The prefix's full cache and, for retrieval, each row's queries of its latest token."""
    cache = DynamicCache(config=model.config)
    with QueryProbe(model) if retrieval else nullcontext() as probe:
        model(input_ids=prefix, use_cache=True, **{cache_kwarg(model): cache})
    queries = None if probe is None else [probe.at(-1, i) for i in range(len(prefix))]
    return cache, queries


def sparse_branch(model, cache: DynamicCache, queries, continuation: torch.Tensor,
                  policy: Policy) -> torch.Tensor:
    """The continuation's logits on `policy`'s view of the prefix cache: what drafting sees."""
    view = sparse_view(cache, select_rows(policy, cache, queries))
    return TruePositions(model, cache.get_seq_length())(continuation, view).logits


def kl(logits: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    log_q = F.log_softmax(logits.flatten(0, 1).float(), dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def loss(model, teacher, x: torch.Tensor, objective: DraftObjective,
         gen: torch.Generator) -> torch.Tensor:
    """The objective on a batch of sequences x [b, T] (module docstring)."""
    c = objective.continuation
    prefix, continuation = x[:, :-c], x[:, -c:]
    with torch.no_grad():
        target = teacher(input_ids=x, use_cache=False, logits_to_keep=c).logits
        log_p = F.log_softmax(target.flatten(0, 1).float(), dim=-1)
    if objective.objective == "no_prefix":
        empty = DynamicCache(config=model.config)
        return kl(TruePositions(model, prefix.shape[1])(continuation, empty).logits, log_p)
    cache, queries = prefill(model, prefix, objective.sparse_policy == "retrieval")
    sparse = None
    if objective.sparse_weight > 0:  # first: the full branch extends the cache in place
        sparse = sparse_branch(model, cache, queries, continuation, draw_policy(objective, gen))
    full = model(input_ids=continuation, use_cache=True, **{cache_kwarg(model): cache}).logits
    total = kl(full, log_p)
    return total if sparse is None else total + objective.sparse_weight * kl(sparse, log_p)
