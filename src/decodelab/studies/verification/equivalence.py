"""Does speculative sampling preserve the target's distribution? Three levels of evidence, each
with deliberately wrong rejection rules (negative controls) that it must reject.

1. Exact, float64 closed forms. One step: the law of the token one accept/resample step emits
   equals p, for random, edge-case and real (p, q) pairs. One block and beyond: enumerating every
   outcome on a toy autoregressive pair, the law of the first m tokens that
   `speculative.generate(budget=m, k=K)` emits equals the target's autoregressive law of m tokens
   (`stream_law`, which states it precisely).
2. Monte Carlo: the rules themselves, run many times on fixed cases, against the exact laws with
   a goodness-of-fit chi-square.
3. Real model, two samples: tokens sampled from the target autoregressively and speculatively at
   temperature 1, compared with a 2 x (top + 1) chi-square of token frequencies (its p-value
   from swapping whole sequences between the samples) and with a per-sequence
   log-likelihood-ratio t-test; and greedy agreement. The engine (`Speculate`) and the draft
   law of the t-test (`LogProbs`) are parameters: the long-context pair drafts through a sparse
   KV view (`decodelab.studies.verification.run.run_long`), and level 1 also takes the (p, q) rows
   an engine's
   rule receives (`engine_pairs`).

The wrong rules: `accept_all` keeps every draft token (it emits q, not p); `resample_from_p` has
the right acceptance test but resamples from p instead of the residual after a rejection (it
emits min(p, q) + (1 - beta) p, right only where q = beta p on p's support: beta = 0, p = q,
p one-hot). `power` turns any level into a rejection rate over seeds.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from functools import cache, partial

import numpy as np
import torch
from scipy import stats
from tqdm import tqdm

from decodelab.config.settings import Sampling
from decodelab.engines.decode import decode, first_divergence, margin
from decodelab.engines.sampling import emitted_distribution, sample, speculative_accept, warp
from decodelab.engines.speculative import Result, device_of, generate, torch_device

TOL = 1e-9  # level 1: the closed forms must equal p to this, in float64
MIN_EXPECTED = 5.0  # chi-square bins are pooled until each expects at least this many
PERMUTATIONS = 1999  # sequence swaps behind the level-3 chi-square's p-value

Rule = Callable[..., tuple[int, int]]
# (target, draft, prompt, budget, k, sampling, draft_generator, target_generator, accept=rule)
# -> speculative.Result: the engine a level runs, `speculative.generate` unless told otherwise
# (the long-context pair drafts through a sparse KV view: `longctx.generate`)
Speculate = Callable[..., Result]
Model = Callable[[tuple[int, ...]], torch.Tensor]  # toy AR model: prefix -> float64 [V] law
Law = dict[tuple[int, ...], float]  # token sequence -> probability


# --- the rejection rules: the right one and two wrong ones ----------------------------------


def _first_rejection(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor,
                     generator: torch.Generator | None) -> int:
    """speculative_accept's acceptance test (u q(x) < p(x), u ~ U[0, 1)): the accepted count."""
    k = tokens.shape[0]
    x = tokens.long().unsqueeze(1)
    p_x, q_x = p[:k].gather(1, x).squeeze(1), q.gather(1, x).squeeze(1)
    u = torch.rand(k, generator=generator, device=p.device, dtype=p.dtype)
    return int((u * q_x < p_x).long().cumprod(0).sum())


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.device.type == "mps" else t.double()  # MPS has no float64


def accept_all(target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
               generator: torch.Generator | None = None) -> tuple[int, int]:
    """WRONG on purpose: keeps all K draft tokens, then a bonus token from p_K."""
    k = draft_tokens.shape[0]
    return k, int(sample(_wide(target_probs[k]), generator))


def resample_from_p(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                    draft_tokens: torch.Tensor, generator: torch.Generator | None = None
                    ) -> tuple[int, int]:
    """WRONG on purpose: the right acceptance test, but the next token comes from p_n at the
    first rejection n instead of norm(max(0, p_n - q_n)) (p_K when all K are kept)."""
    p, q = _wide(target_probs), _wide(draft_probs)
    n = _first_rejection(p, q, draft_tokens, generator)
    return n, int(sample(p[n], generator))


SAMPLERS: dict[str, Rule] = {
    "correct": speculative_accept,
    "accept_all": accept_all,
    "resample_from_p": resample_from_p,
}
WRONG = ("accept_all", "resample_from_p")


def _rule(sampler: str | Rule) -> Rule:
    return SAMPLERS[sampler] if isinstance(sampler, str) else sampler


# --- level 1: exact, one step ---------------------------------------------------------------


def _law(t: torch.Tensor) -> torch.Tensor:
    """float64 on the CPU, normalised over the last dim (float32 rows sum to 1 only to ~1e-7)."""
    t = t.detach().to("cpu", torch.float64)
    return t / t.sum(-1, keepdim=True)


def emitted_law(sampler: str, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Closed form (float64, [..., V]) of the token one step of `sampler` emits, x ~ q drafted:
    correct: min(p, q) + (1 - beta) norm(max(0, p - q)) = p  (sampling.emitted_distribution);
    accept_all: q;  resample_from_p: min(p, q) + (1 - beta) p;  beta = sum min(p, q)."""
    p, q = p.to(torch.float64), q.to(torch.float64)
    if sampler == "correct":
        return emitted_distribution(p, q)
    if sampler == "accept_all":
        return q.clone()
    if sampler == "resample_from_p":
        kept = torch.minimum(p, q)
        return kept + (1 - kept.sum(-1, keepdim=True)) * p
    raise ValueError(f"no closed form for sampler {sampler!r}; known: {', '.join(SAMPLERS)}")


def exact_single(p: torch.Tensor, q: torch.Tensor, sampler: str = "correct") -> float:
    """Max abs error of the emitted law against p over [..., V] pairs (both normalised in
    float64 first). The correct rule must give <= TOL; a wrong one must not, unless p = q."""
    p, q = _law(p), _law(q)
    return float((emitted_law(sampler, p, q) - p).abs().max())


def dirichlet_pair(vocab: int, concentration: float, seed: int) -> tuple[torch.Tensor, ...]:
    """A random (p, q) pair, each Dirichlet(concentration) over `vocab` tokens, float64."""
    rng = np.random.default_rng([seed, vocab])
    pair = rng.dirichlet(np.full(vocab, concentration), size=2)
    bad = ~np.isfinite(pair).all(1)  # every gamma draw underflowed: a tiny concentration
    pair[bad] = 0.0
    pair[bad, 0] = 1.0
    return tuple(torch.from_numpy(row) for row in pair)


def edge_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Named (p, q) pairs at the edges of the rule."""
    t = lambda *xs: torch.tensor(xs, dtype=torch.float64)  # noqa: E731
    uniform = torch.full((3,), 1 / 3, dtype=torch.float64)
    return {
        "q zero where p > 0": (t(0.5, 0.3, 0.2), t(0.6, 0.4, 0.0)),
        "p zero where q > 0": (t(0.5, 0.5, 0.0), t(0.2, 0.2, 0.6)),
        "p equals q": (t(0.1, 0.2, 0.3, 0.4), t(0.1, 0.2, 0.3, 0.4)),
        "p nearly q (residual ~ eps)": (uniform, uniform + t(1e-16, -1e-16, 0.0)),
        "disjoint supports": (t(0.5, 0.5, 0.0, 0.0), t(0.0, 0.0, 0.3, 0.7)),
        "one-hot p": (t(0.0, 1.0, 0.0), t(0.2, 0.3, 0.5)),
        "one-hot q": (t(0.2, 0.3, 0.5), t(0.0, 1.0, 0.0)),
        "both one-hot, same": (t(0.0, 1.0, 0.0), t(0.0, 1.0, 0.0)),
        "both one-hot, different": (t(1.0, 0.0, 0.0), t(0.0, 0.0, 1.0)),
        "vocabulary of two": (t(0.9, 0.1), t(0.1, 0.9)),
    }


@torch.inference_mode()
def real_pairs(target, draft, prompts: Sequence[Sequence[int]], positions: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """`positions` (p, q) rows [N, V] from the models (`warp` at temperature 1, as the speculative
    engine does), evenly spaced over every position of every prompt."""
    ps, qs = [], []
    for prompt in prompts:
        for model, rows in ((target, ps), (draft, qs)):
            ids = torch.tensor([list(prompt)], device=device_of(model))
            rows.append(warp(model(input_ids=ids).logits[0], 1.0).cpu())
    p, q = torch.cat(ps), torch.cat(qs)
    pick = torch.linspace(0, len(p) - 1, min(positions, len(p))).round().long().unique()
    return p[pick], q[pick]


def real_pairs_check(target, draft, prompts: Sequence[Sequence[int]], positions: int) -> dict:
    """Level 1 on real pairs: the max error of each sampler's emitted law against p."""
    return pair_check(*real_pairs(target, draft, prompts, positions))


def engine_pairs(target, draft, prompts: Sequence[Sequence[int]], positions: int, k: int,
                 seed: int, budget: int = 64, speculate: Speculate = generate
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """`positions` (p, q) rows [N, V] as the engine's rejection rule receives them (each
    drafted position's target and draft law, at temperature 1), recorded while `speculate`
    decodes `budget` tokens per prompt, prompts in turn until enough are drafted; evenly
    spaced over them. With a sparse draft cache, q is the draft's law on its view."""
    ps, qs = [], []

    def recording(target_probs, draft_probs, draft_tokens, generator=None):
        n = draft_tokens.shape[0]
        ps.append(target_probs[:n].detach().cpu())
        qs.append(draft_probs.detach().cpu())
        return speculative_accept(target_probs, draft_probs, draft_tokens, generator)

    for i in range(positions):  # each prompt drafts at least one position
        if sum(len(q) for q in qs) >= positions:
            break
        s_draft, s_target = _sequence_seeds(seed, "correct", i)
        speculate(target, draft, list(prompts[i % len(prompts)]), budget, k,
                  Sampling(temperature=1.0), _generator(device_of(draft), s_draft),
                  _generator(device_of(target), s_target), accept=recording)
    p, q = torch.cat(ps), torch.cat(qs)
    pick = torch.linspace(0, len(p) - 1, min(positions, len(p))).round().long().unique()
    return p[pick], q[pick]


def pair_check(p: torch.Tensor, q: torch.Tensor) -> dict:
    """Level 1 on given (p, q) rows: the max error of each sampler's emitted law against p."""
    beta = torch.minimum(_law(p), _law(q)).sum(-1)
    return {"pairs": len(p), "vocab": p.shape[-1], "beta_mean": float(beta.mean()),
            "max_error": {name: exact_single(p, q, name) for name in SAMPLERS}}


# --- level 1: exact, whole blocks on a toy autoregressive pair ------------------------------


def toy_model(vocab: int, seed: int, concentration: float = 1.0) -> Model:
    """A seeded toy autoregressive model: each prefix gets its own Dirichlet(concentration) row
    (float64 [vocab]), the same row every time."""

    @cache
    def row(prefix: tuple[int, ...]) -> torch.Tensor:
        rng = np.random.default_rng([seed, len(prefix), *prefix])
        return torch.from_numpy(rng.dirichlet(np.full(vocab, concentration)))

    return row


def _accept_probs(sampler: str, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(keep x) for each draft token x: min(1, p/q); 1[p > 0] where q = 0 (as u q < p)."""
    if sampler == "accept_all":
        return torch.ones_like(p)
    if sampler in ("correct", "resample_from_p"):
        return torch.where(q > 0, (p / q.where(q > 0, 1)).clamp(max=1), (p > 0).to(p.dtype))
    raise ValueError(f"no closed form for sampler {sampler!r}; known: {', '.join(SAMPLERS)}")


def _reject_law(sampler: str, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Law of the next token after a rejection: the residual (p if it has no mass), or p."""
    if sampler == "correct":
        residual = (p - q).clamp(min=0)
        return residual / residual.sum() if residual.sum() > 0 else p
    return p


def _support(row: torch.Tensor) -> list[tuple[int, float]]:
    return [(i, w) for i, w in enumerate(row.tolist()) if w > 0]


def _draft_paths(draft: Model, context: tuple[int, ...], k: int
                 ) -> Iterator[tuple[tuple[int, ...], float]]:
    """Every k-token draft continuation of `context` with its probability (> 0)."""
    if k == 0:
        yield (), 1.0
        return
    for head, weight in _draft_paths(draft, context, k - 1):
        for x, w in _support(draft(context + head)):
            yield head + (x,), weight * w


def block_law(sampler: str, target: Model, draft: Model, k: int,
              context: tuple[int, ...] = ()) -> Law:
    """Exact law of the tokens one block emits after `context` (1..k+1 of them): the draft
    samples x_1..x_k ~ q autoregressively, then `sampler`'s rule keeps a prefix of them and
    adds one token (from its rejection law, or from p_k when all are kept)."""
    law: Law = defaultdict(float)
    for drafted, weight in _draft_paths(draft, context, k):
        reach = weight  # P(this draft and x_1..x_i all kept)
        for i, x in enumerate(drafted):
            p, q = target(context + drafted[:i]), draft(context + drafted[:i])
            a = float(_accept_probs(sampler, p, q)[x])
            if a < 1:
                for y, r in _support(_reject_law(sampler, p, q)):
                    law[drafted[:i] + (y,)] += reach * (1 - a) * r
            reach *= a
        for y, r in _support(target(context + drafted)):
            law[drafted + (y,)] += reach * r
    return dict(law)


def stream_law(sampler: str, target: Model, draft: Model, k: int, m: int,
               context: tuple[int, ...] = (), clip: bool = True) -> Law:
    """Exact law of the first m tokens speculative decoding emits after `context`, blocks
    repeated until m tokens are out.

    clip=True is `speculative.generate(budget=m, k=k)` exactly: each block drafts
    min(k, m - emitted - 1) tokens, so none is emitted past the budget. clip=False drafts k
    tokens every block and cuts the stream after m tokens. The statement checked
    (`exact_block`) is, for every y in V^m: P_spec(y) = prod_t p(y_t | context, y_<t).
    """
    memo: dict[tuple[tuple[int, ...], int], Law] = {}

    def law(ctx: tuple[int, ...], left: int) -> Law:
        if left == 0:
            return {(): 1.0}
        if (ctx, left) not in memo:
            out: Law = defaultdict(float)
            k_now = min(k, left - 1) if clip else k
            for block, w in block_law(sampler, target, draft, k_now, ctx).items():
                block = block[:left]
                for rest, v in law(ctx + block, left - len(block)).items():
                    out[block + rest] += w * v
            memo[ctx, left] = dict(out)
        return memo[ctx, left]

    return law(tuple(context), m)


def ar_law(target: Model, m: int, context: tuple[int, ...] = ()) -> Law:
    """The target's autoregressive law of m tokens after `context`."""
    if m == 0:
        return {(): 1.0}
    return {(y, *rest): w * v for y, w in _support(target(context))
            for rest, v in ar_law(target, m - 1, context + (y,)).items()}


def law_error(a: Law, b: Law) -> float:
    return max(abs(a.get(y, 0.0) - b.get(y, 0.0)) for y in a.keys() | b.keys())


def exact_block(sampler: str, target: Model, draft: Model, k: int, m_max: int | None = None,
                clip: bool = True) -> dict[int, float]:
    """{m: max abs error of `stream_law` against `ar_law`} for m = 1..m_max (default k + 1).
    With clip=True, m = 1 drafts nothing, so every rule passes there."""
    return {m: law_error(stream_law(sampler, target, draft, k, m, clip=clip), ar_law(target, m))
            for m in range(1, (m_max or k + 1) + 1)}


# --- level 2: Monte Carlo against the exact laws --------------------------------------------


def _pool(observed: np.ndarray, expected: np.ndarray, min_expected: float
          ) -> tuple[np.ndarray, np.ndarray]:
    """Merge the bins expecting < min_expected into one, and that one into the smallest other
    bin if it still expects too few."""
    small = expected < min_expected
    if small.sum() == 0:
        return observed, expected
    obs, exp = observed[~small], expected[~small]
    pooled_obs, pooled_exp = observed[small].sum(), expected[small].sum()
    if pooled_exp >= min_expected or len(exp) == 0:
        return np.append(obs, pooled_obs), np.append(exp, pooled_exp)
    i = int(np.argmin(exp))
    obs, exp = obs.copy(), exp.copy()
    obs[i] += pooled_obs
    exp[i] += pooled_exp
    return obs, exp


def goodness_of_fit(observed: np.ndarray, law: np.ndarray,
                    min_expected: float = MIN_EXPECTED) -> dict:
    """Chi-square of counts against a law (pooled so each bin expects >= min_expected). A count
    where the law is 0 is an outright rejection (chi2 = inf, p = 0)."""
    observed, law = np.asarray(observed, dtype=float), np.asarray(law, dtype=float)
    expected = law / law.sum() * observed.sum()
    if observed[expected == 0].any():
        return {"chi2": math.inf, "dof": int((expected > 0).sum()), "p_value": 0.0}
    obs, exp = _pool(observed[expected > 0], expected[expected > 0], min_expected)
    if len(obs) < 2:
        return {"chi2": 0.0, "dof": 0, "p_value": 1.0}
    res = stats.chisquare(obs, exp)
    return {"chi2": float(res.statistic), "dof": len(obs) - 1, "p_value": float(res.pvalue)}


def monte_carlo_single(sampler: str | Rule, p: torch.Tensor, q: torch.Tensor, n: int,
                       seed: int) -> dict:
    """Run the rule n times with K = 1 and x ~ q; chi-square of the emitted token against p."""
    rule, p, q = _rule(sampler), _law(p), _law(q)
    g = torch.Generator().manual_seed(seed)
    drafted = torch.multinomial(q, n, replacement=True, generator=g)
    target_probs, draft_probs = torch.stack([p, p]), q[None]
    counts = np.zeros(len(p), dtype=np.int64)
    for x in drafted.split(1):
        n_accepted, token = rule(target_probs, draft_probs, x, g)
        counts[int(x) if n_accepted else token] += 1
    return goodness_of_fit(counts, p.numpy())


def simulate_stream(sampler: str | Rule, target: Model, draft: Model, k: int, m: int,
                    generator: torch.Generator, clip: bool = True) -> tuple[int, ...]:
    """One run of speculative decoding on a toy pair, calling the rule itself: m tokens."""
    rule, seq = _rule(sampler), ()
    while len(seq) < m:
        k_now = min(k, m - len(seq) - 1) if clip else k
        drafted: tuple[int, ...] = ()
        q_rows = []
        for _ in range(k_now):
            q_rows.append(draft(seq + drafted))
            drafted += (int(torch.multinomial(q_rows[-1], 1, generator=generator)),)
        p_rows = torch.stack([target(seq + drafted[:i]) for i in range(k_now + 1)])
        q_rows = torch.stack(q_rows) if q_rows else p_rows.new_zeros(0, p_rows.shape[1])
        n, token = rule(p_rows, q_rows, torch.tensor(drafted, dtype=torch.long), generator)
        seq += drafted[:n] + (token,)
    return seq[:m]


def monte_carlo_block(sampler: str | Rule, target: Model, draft: Model, k: int, m: int, n: int,
                      seed: int, clip: bool = True) -> dict:
    """n simulated streams of m tokens; chi-square of the m-token sequences against the target's
    exact autoregressive law (V^m bins, pooled)."""
    g = torch.Generator().manual_seed(seed)
    counts = Counter(simulate_stream(sampler, target, draft, k, m, g, clip) for _ in range(n))
    law = ar_law(target, m)
    cells = sorted(law.keys() | counts.keys())
    return goodness_of_fit(np.array([counts[c] for c in cells]),
                           np.array([law.get(c, 0.0) for c in cells]))


# --- level 3: the real model, two samples ---------------------------------------------------

METHODS = ("autoregressive", *SAMPLERS)


def _sequence_seeds(seed: int, method: str, i: int) -> list[int]:
    """Two seeds for sequence i of a method, independent across methods and sequences."""
    return np.random.SeedSequence([seed, METHODS.index(method), i]).generate_state(2).tolist()


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device.type).manual_seed(seed)


def sample_tokens(target, draft, prompts: Sequence[Sequence[int]], n_tokens: int, method: str,
                  k: int, seed: int, budget: int = 64, speculate: Speculate = generate
                  ) -> list[int]:
    """At least n_tokens tokens sampled at temperature 1 from the target: ceil(n_tokens / budget)
    sequences of `budget` tokens, cycling over the prompts, with plain autoregressive decoding
    or speculative decoding (`speculate`) under rule SAMPLERS[method]. A flat list of token
    ids."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    t_dev = device_of(target)
    tokens: list[int] = []
    for i in range(math.ceil(n_tokens / budget)):
        prompt = list(prompts[i % len(prompts)])
        s_draft, s_target = _sequence_seeds(seed, method, i)
        if method == "autoregressive":
            ids = torch.tensor([prompt], device=t_dev)
            out = decode(target, ids, budget, temperature=1.0,
                         generator=_generator(t_dev, s_target), role="target").tokens
        else:
            out = speculate(target, draft, prompt, budget, k, Sampling(temperature=1.0),
                            _generator(device_of(draft), s_draft), _generator(t_dev, s_target),
                            accept=SAMPLERS[method]).tokens
        tokens += out
    return tokens


def contingency(a: Sequence[int], b: Sequence[int], top: int) -> tuple[list[int], np.ndarray]:
    """The `top` most frequent tokens over both samples and the 2 x (top + 1) table of their
    counts, plus "other" for the rest (no "other" column when nothing else occurs)."""
    ca, cb = Counter(a), Counter(b)
    ranked = sorted((ca + cb).items(), key=lambda kv: (-kv[1], kv[0]))
    tokens = [t for t, _ in ranked[:top]]
    table = np.array([[c[t] for t in tokens] for c in (ca, cb)])
    other = np.array([len(a), len(b)]) - table.sum(1)
    return tokens, (np.column_stack([table, other]) if other.any() else table)


def sequence_counts(tokens: Sequence[int], budget: int, columns: list[int]) -> np.ndarray:
    """[sequences, len(columns) + 1]: each `budget`-token sequence's count of every column's
    token, and of all other tokens in the last column."""
    index = {t: i for i, t in enumerate(columns)}
    seqs = np.asarray(tokens).reshape(-1, budget)
    width = len(columns) + 1
    cols = np.vectorize(lambda t: index.get(t, width - 1), otypes=[int])(seqs)
    counts = np.zeros((len(seqs), width))
    np.add.at(counts, (np.arange(len(seqs))[:, None], cols), 1)
    return counts


def pearson(rows_a: np.ndarray, column_totals: np.ndarray, n_a: int, n_b: int) -> np.ndarray:
    """Pearson's chi-square of 2 x C tables given by their first rows (..., C), with fixed row
    totals n_a, n_b and column totals."""
    n = n_a + n_b
    ea, eb = n_a * column_totals / n, n_b * column_totals / n
    rows_b = column_totals - rows_a
    return ((rows_a - ea) ** 2 / ea + (rows_b - eb) ** 2 / eb).sum(-1)


def permuted_statistics(table: np.ndarray, swap: np.ndarray, permutations: int, seed: int,
                        chunk: int = 256) -> np.ndarray:
    """Pearson's chi-square after each of `permutations` random sets of pair swaps: swapping
    pair i moves swap[i] (its b counts minus its a counts) into the first row."""
    rng = np.random.default_rng(seed)
    n_a, n_b = table.sum(1)
    out = []
    for start in range(0, permutations, chunk):
        flips = rng.integers(0, 2, (min(chunk, permutations - start), len(swap)))
        out.append(pearson(table[0] + flips.astype(float) @ swap, table.sum(0), n_a, n_b))
    return np.concatenate(out)


def two_sample_test(a: Sequence[int], b: Sequence[int], top: int = 200, budget: int = 1,
                    permutations: int = PERMUTATIONS, seed: int = 0) -> dict:
    """Pearson's chi-square of the `contingency` table, dof = top (fewer when fewer tokens occur).

    Its p-value comes from swapping whole sequences: a and b are runs of `budget`-token
    sequences, sequence i of each from the same prompt, so under the null they are exchangeable
    pairwise; `permutations` random swaps give the statistic's null law. Tokens of one sequence
    are dependent, so the chi-square law of the token-level statistic (`p_asymptotic`) is
    anti-conservative for a peaked model, which puts most of a sequence's tokens in few cells.
    With budget=1 (independent tokens) both p-values agree."""
    if len(a) != len(b) or len(a) % budget:
        raise ValueError(f"two samples of equal length in whole sequences of {budget} tokens "
                         f"are needed, got {len(a)} and {len(b)} tokens")
    tokens, table = contingency(a, b, top)
    res = stats.chi2_contingency(table, correction=False)
    width = table.shape[1]  # no "other" column when every token is among the top
    swap = (sequence_counts(b, budget, tokens) - sequence_counts(a, budget, tokens))[:, :width]
    null = permuted_statistics(table, swap, permutations, seed)
    observed = res.statistic * (1 - 1e-9)  # a permutation equal up to rounding counts as extreme
    p_value = (1 + int(np.sum(null >= observed))) / (1 + permutations)
    return {"chi2": float(res.statistic), "dof": int(res.dof), "p_value": p_value,
            "p_asymptotic": float(res.pvalue), "permutations": permutations,
            "sequences": len(swap), "min_expected": float(res.expected_freq.min()),
            "tokens": tokens, "table": table.tolist()}


# (ids, start) -> [len(ids) - start]: log q(ids[t] | ids[:t]) for t = start..len(ids)-1
LogProbs = Callable[[list[int], int], torch.Tensor]


def full_log_probs(model) -> LogProbs:
    """A model's law of each token given everything before it: one full forward."""
    def log_probs(ids: list[int], start: int) -> torch.Tensor:
        logits = model(input_ids=torch.tensor([ids], device=device_of(model))).logits[0]
        where = torch.arange(start - 1, len(ids) - 1)
        return torch.log_softmax(logits.float().cpu()[where], -1).gather(
            1, torch.tensor(ids[start:])[:, None]).squeeze(1)
    return log_probs


@torch.inference_mode()
def sequence_log_ratios(target, draft, prompts: Sequence[Sequence[int]], tokens: Sequence[int],
                        budget: int = 64, draft_law: LogProbs | None = None) -> np.ndarray:
    """Per sequence of a `sample_tokens` output: the mean over its generated tokens y_t of
    log p(y_t | prefix) - log q(y_t | prefix), target p, draft q (one full forward of each; or
    q from `draft_law`, such as a sparse draft's, `longctx.first_draft_log_probs`)."""
    log_p, log_q = full_log_probs(target), draft_law or full_log_probs(draft)
    out = []
    for i in range(len(tokens) // budget):
        prompt, seq = list(prompts[i % len(prompts)]), list(tokens[i * budget:(i + 1) * budget])
        ids = prompt + seq
        out.append(float((log_p(ids, len(prompt)) - log_q(ids, len(prompt))).mean()))
    return np.array(out)


def welch(ra: np.ndarray, rb: np.ndarray) -> dict:
    """Welch's t-test of two samples of per-sequence statistics: level 3's log-ratio test on
    two `sample_tokens` outputs' `sequence_log_ratios`. Sequences, not tokens, are the
    independent units, so it is calibrated; and a rule that leans towards the draft raises
    log q, so it is powerful exactly against the errors speculative decoding can make."""
    res = stats.ttest_ind(ra, rb, equal_var=False)
    return {"t": float(res.statistic), "p_value": float(res.pvalue), "sequences": len(ra),
            "mean_a": float(ra.mean()), "mean_b": float(rb.mean())}


@torch.inference_mode()
def greedy_agreement(target, draft, prompts: Sequence[Sequence[int]], budget: int, k: int,
                     speculate: Speculate = generate) -> dict:
    """Greedy speculative vs greedy autoregressive decoding, per prompt. For a prompt whose
    tokens differ: the first differing position and the target's top-1 minus top-2 logit
    there, from a plain full forward of the target on prompt + autoregressive prefix."""
    t_dev = device_of(target)
    divergences = []
    for i, prompt in enumerate(prompts):
        prompt = list(prompt)
        ar = decode(target, torch.tensor([prompt], device=t_dev), budget, role="target").tokens
        spec = speculate(target, draft, prompt, budget, k).tokens
        j = first_divergence(spec, ar)
        if j is not None:
            divergences.append({"prompt": i, "position": j,
                                "margin": margin(target, prompt + ar[:j])})
    return {"fraction_equal": 1 - len(divergences) / len(prompts), "divergences": divergences}


# --- power: any level, repeated over seeds --------------------------------------------------

Level = Callable[[str, int], dict]  # (sampler, seed) -> {"p_value": ..., ...}


def p_values(level_fn: Level, sampler: str, seeds: Sequence[int]) -> list[float]:
    return [level_fn(sampler, seed)["p_value"] for seed in seeds]


def power(level_fn: Level, sampler: str, seeds: Sequence[int], alpha: float = 0.01) -> float:
    """Fraction of seeds at which the level rejects (p < alpha): the power against a wrong
    sampler, the false-rejection rate (about alpha) for the correct one."""
    return float(np.mean([p < alpha for p in p_values(level_fn, sampler, seeds)]))


def single_level(p: torch.Tensor, q: torch.Tensor, n: int) -> Level:
    return lambda sampler, seed: monte_carlo_single(sampler, p, q, n, seed)


def block_level(target: Model, draft: Model, k: int, m: int, n: int, clip: bool = True) -> Level:
    return lambda sampler, seed: monte_carlo_block(sampler, target, draft, k, m, n, seed, clip)


_TASK: Callable | None = None  # the workers' function: inherited by a fork, built in a spawn


def _one_thread() -> None:
    torch.set_num_threads(1)


def _build_task(make: Callable[[], Callable]) -> None:
    global _TASK
    _one_thread()
    _TASK = make()


def _run_task(key):
    return _TASK(key)


def in_processes(fn: Callable, keys: list, workers: int, desc: str | None = None) -> list:
    """[fn(key) for key in keys], in `workers` forked processes of one CPU thread each (a
    progress bar named `desc` where given).

    Sampling one sequence at a time from a small model gains almost nothing from torch's
    intra-op threads, while independent samples split over processes run side by side. `fn`
    must be deterministic in its key (its own seeds), so the result does not depend on workers.
    Linux only: macOS frameworks loaded beside torch are not safe to fork, so there it is serial.
    """
    global _TASK
    if workers <= 1 or len(keys) <= 1 or sys.platform != "linux":
        return [fn(key) for key in progress(keys, desc)]
    _TASK = fn
    try:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_one_thread) as pool:
            return list(progress(pool.imap(_run_task, keys, chunksize=1), desc, len(keys)))
    finally:
        _TASK = None


def in_spawned(make: Callable[[], Callable], keys: list, workers: int,
               desc: str | None = None) -> list:
    """[make()(key) for key in keys], in `workers` spawned processes that each build the
    function once with `make` (picklable): for models a fork cannot carry, such as CUDA ones,
    whose eager loop is bound by the host's launches, so processes sharing one GPU add up."""
    if workers <= 1 or len(keys) <= 1:
        fn = make()
        return [fn(key) for key in progress(keys, desc)]
    with multiprocessing.get_context("spawn").Pool(workers, initializer=_build_task,
                                                   initargs=(make,)) as pool:
        return list(progress(pool.imap(_run_task, keys, chunksize=1), desc, len(keys)))


def progress(items, desc: str | None, total: int | None = None):
    return tqdm(items, desc=desc, total=total, disable=desc is None, mininterval=2)


class Samples:
    """(method, seed) -> (its `sample_tokens`, their `sequence_log_ratios`): one level-3 sample
    and its statistic, deterministic in the key."""

    def __init__(self, target, draft, prompts: Sequence[Sequence[int]], n_tokens: int, k: int,
                 budget: int, speculate: Speculate = generate, draft_law: LogProbs | None = None):
        self.target, self.draft, self.prompts = target, draft, prompts
        self.n_tokens, self.k, self.budget = n_tokens, k, budget
        self.speculate, self.draft_law = speculate, draft_law

    def __call__(self, key: tuple[str, int]) -> tuple[tuple[int, ...], np.ndarray]:
        method, seed = key
        tokens = tuple(sample_tokens(self.target, self.draft, self.prompts, self.n_tokens,
                                     method, self.k, seed, self.budget, self.speculate))
        return tokens, sequence_log_ratios(self.target, self.draft, self.prompts, tokens,
                                           self.budget, self.draft_law)


def loaded_samples(load: Callable[[], tuple], *args, **kwargs) -> Samples:
    """`Samples` on the models `load()` returns: what a spawned worker builds."""
    return Samples(*load(), *args, **kwargs)


def real_model_levels(target, draft, prompts: Sequence[Sequence[int]], n_tokens: int, k: int,
                      budget: int = 64, top: int = 200, speculate: Speculate = generate,
                      draft_law: LogProbs | None = None,
                      load: Callable[[], tuple] | None = None) -> dict[str, Callable]:
    """Level 3 at a seed, both tests: `two_sample_test` ("chi2") and `welch` on the sequences'
    log ratios ("log_ratio", its q from `draft_law` where given). Each (method, seed) sample of
    n_tokens and its log ratios are computed once and shared, so the autoregressive sample of a
    seed serves every rule and both tests. "prefetch"(keys, workers) computes many of them at once,
    in `workers` processes: forked where both models are on the CPU (`in_processes`), spawned
    where they are on a CUDA device and `load` (picklable) loads them again (`in_spawned`)."""
    drawn: dict[tuple[str, int], tuple[tuple[int, ...], np.ndarray]] = {}
    both = Samples(target, draft, prompts, n_tokens, k, budget, speculate, draft_law)

    def sample(method: str, seed: int) -> tuple[tuple[int, ...], np.ndarray]:
        if (method, seed) not in drawn:
            drawn[method, seed] = both((method, seed))
        return drawn[method, seed]

    def tokens(method: str, seed: int) -> tuple[int, ...]:
        return sample(method, seed)[0]

    def ratios(method: str, seed: int) -> np.ndarray:
        return sample(method, seed)[1]

    def prefetch(keys: Sequence[tuple[str, int]], workers: int) -> None:
        todo = [key for key in dict.fromkeys(keys) if key not in drawn]
        devices = {getattr(torch_device(m), "type", None) for m in (target, draft)}
        # A llama.cpp engine's threads do not survive a fork, nor CUDA; MPS stays serial
        desc = f"level 3 samples of {n_tokens} tokens"
        if devices == {"cpu"}:
            done = in_processes(both, todo, workers, desc)
        elif devices == {"cuda"} and load is not None and draft_law is None:
            done = in_spawned(partial(loaded_samples, load, prompts, n_tokens, k, budget,
                                      speculate), todo, workers, desc)
        else:
            done = [both(key) for key in progress(todo, desc)]
        drawn.update(zip(todo, done, strict=True))

    def chi2(sampler: str, seed: int) -> dict:
        return two_sample_test(tokens("autoregressive", seed), tokens(sampler, seed), top,
                               budget, seed=seed)

    def log_ratio(sampler: str, seed: int) -> dict:
        return welch(ratios("autoregressive", seed), ratios(sampler, seed))

    return {"chi2": chi2, "log_ratio": log_ratio, "tokens": tokens, "prefetch": prefetch}


def real_model_level(target, draft, prompts: Sequence[Sequence[int]], n_tokens: int, k: int,
                     budget: int = 64, top: int = 200, test: str = "chi2") -> Level:
    """One of `real_model_levels`: test="chi2" or "log_ratio"."""
    levels = real_model_levels(target, draft, prompts, n_tokens, k, budget, top)
    if test not in ("chi2", "log_ratio"):
        raise ValueError(f"test must be 'chi2' or 'log_ratio', got {test!r}")
    return levels[test]
