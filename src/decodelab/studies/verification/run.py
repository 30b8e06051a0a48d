"""The verification stage: the three levels of `equivalence`, run from the config, as JSON rows.

Every check runs for the correct rejection rule and for the two wrong ones, which it must reject;
power tables repeat the statistical checks over seeds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from functools import partial

import numpy as np
import torch
from tqdm import tqdm

from decodelab.backends import models
from decodelab.backends.llamacpp import load_role
from decodelab.backends.train import heldout_prompts
from decodelab.config.settings import GREEDY, LongVerificationJob, Pair, Verification
from decodelab.core import tables
from decodelab.core.errors import DecodelabError
from decodelab.engines import longctx
from decodelab.engines.cuda import graphs
from decodelab.engines.sparse_kv import Policy
from decodelab.engines.speculative import generate
from decodelab.studies.verification import equivalence as eq

TOY_SEEDS = (11, 12)  # the toy target and draft of the block checks


def row(level: int, check: str, sampler: str, statistic: float, n: int, alpha: float,
        p_value: float | None = None, dof: int | None = None, pair: str = "") -> dict:
    rejected = statistic > eq.TOL if p_value is None else p_value < alpha
    return {"level": level, "check": check, "pair": pair, "sampler": sampler,
            "statistic": float(statistic), "dof": dof, "p_value": p_value, "n": n,
            "rejected": bool(rejected), "expected_rejected": sampler != "correct"}


def toy_pair(vocab: int):
    return eq.toy_model(vocab, TOY_SEEDS[0]), eq.toy_model(vocab, TOY_SEEDS[1])


def exact_rows(spec: Verification, target, draft, prompts) -> list[dict]:
    ex, alpha = spec.exact, spec.alpha
    grid = list(itertools.product(ex.vocab_sizes, ex.concentrations))
    pairs = [eq.dirichlet_pair(v, c, seed) for seed in range(ex.random_pairs)
             for v, c in [grid[seed % len(grid)]]]
    real = eq.real_pairs_check(target, draft, prompts, ex.real_positions)
    toy_t, toy_d = toy_pair(ex.block_vocab)
    rows = []
    for sampler in eq.SAMPLERS:
        errors = [eq.exact_single(p, q, sampler) for p, q in pairs]
        rows.append(row(1, "one step, Dirichlet pairs", sampler, max(errors), len(pairs), alpha))
        edges = [eq.exact_single(p, q, sampler) for p, q in eq.edge_cases().values()]
        rows.append(row(1, "one step, edge cases", sampler, max(edges), len(edges), alpha))
        rows.append(row(1, "one step, real pairs", sampler, real["max_error"][sampler],
                        real["pairs"], alpha))
        for k in ex.block_ks:
            err = max(eq.exact_block(sampler, toy_t, toy_d, k).values())
            rows.append(row(1, f"block K={k}", sampler, err, ex.block_vocab ** (k + 1), alpha))
    return rows


def monte_carlo_levels(spec: Verification) -> dict:
    mc = spec.monte_carlo
    p, q = eq.dirichlet_pair(mc.vocab, 1.0, seed=0)
    toy_t, toy_d = toy_pair(3)
    k = min(spec.k, 2)
    return {
        "Monte Carlo, one step": (eq.single_level(p, q, mc.draws), mc.draws),
        f"Monte Carlo, block K={k}": (eq.block_level(toy_t, toy_d, k, k + 1, mc.block_draws),
                                      mc.block_draws),
    }


def real_levels(spec: Verification, target, draft, prompts, n_tokens: int, seeds: Sequence[int],
                speculate: eq.Speculate = generate, draft_law: eq.LogProbs | None = None,
                load: Callable[[], tuple] | None = None) -> tuple[dict, Callable]:
    """Both level-3 tests by check name, and the (method, seed) -> tokens sampler they share;
    every method's sample at `seeds` drawn up front, in as many processes as torch has CPU
    threads (`equivalence.real_model_levels`' prefetch; `load` loads the models in each)."""
    levels = eq.real_model_levels(target, draft, prompts, n_tokens, spec.k, spec.real.budget,
                                  spec.real.top, speculate, draft_law, load)
    levels["prefetch"]([(m, s) for s in seeds for m in eq.METHODS], torch.get_num_threads())
    return ({"two-sample chi-square": levels["chi2"], "log-ratio t-test": levels["log_ratio"]},
            levels["tokens"])


def power_seeds(spec: Verification) -> range:
    return range(1, spec.seeds + 1)


def power_rows(levels: dict, spec: Verification, level: int, n: int, pair: str = ""
               ) -> tuple[list, list]:
    seeds = power_seeds(spec)
    power, pvalues = [], []
    grid = list(itertools.product(levels.items(), eq.SAMPLERS))
    for (check, fn), sampler in tqdm(grid, desc=f"power, level {level} {pair}".rstrip()):
        ps = eq.p_values(fn, sampler, seeds)
        pvalues += [{"level": level, "check": check, "pair": pair, "sampler": sampler,
                     "seed": s, "p_value": p} for s, p in zip(seeds, ps, strict=True)]
        rejections = int(np.sum(np.asarray(ps) < spec.alpha))
        power.append({"level": level, "check": check, "pair": pair, "sampler": sampler,
                      "seeds": len(ps), "alpha": spec.alpha, "rejections": rejections,
                      "rate": rejections / len(ps), "n": n})
    return power, pvalues


def token_rows(test: dict, pair: str, sampler: str) -> list[dict]:
    table = np.asarray(test["table"])
    return [{"pair": pair, "sampler": sampler, "rank": i + 1, "token": tok,
             "autoregressive": int(table[0, i]), "speculative": int(table[1, i]),
             "n_autoregressive": int(table[0].sum()), "n_speculative": int(table[1].sum())}
            for i, tok in enumerate(test["tokens"])]


def load_models(target_dir: str, draft_dir: str, device: str = "cpu",
                draft_device: str | None = None, dtype: str = "float32"):
    return (models.load(target_dir, device, dtype, role="target"),
            models.load(draft_dir, draft_device or device, dtype, role="draft"))


def run_exact(spec: Verification, target_dir: str, draft_dir: str, seed: int) -> dict:
    target, draft = load_models(target_dir, draft_dir)
    prompts = heldout_prompts(target_dir, spec.real.prompts, 32, seed)
    with torch.inference_mode():
        return {"level": 1, "results": exact_rows(spec, target, draft, prompts)}


def run_monte_carlo(spec: Verification) -> dict:
    levels = monte_carlo_levels(spec)
    results = []
    for check, (fn, n) in levels.items():
        for sampler in eq.SAMPLERS:
            out = fn(sampler, 0)
            results.append(row(2, check, sampler, out["chi2"], n, spec.alpha,
                               out["p_value"], out.get("dof")))
    power, pvalues = [], []
    for check, (fn, n) in levels.items():
        pw, pv = power_rows({check: fn}, spec, 2, n)
        power += pw
        pvalues += pv
    return {"level": 2, "results": results, "power": power, "pvalues": pvalues}


def load_pair(target_dir: str, draft_dir: str, roles: dict, key: str, max_len: int,
              k: int = 0) -> tuple:
    """A configuration's target and draft in its engine (eager, or CUDA graphs holding
    sequences of `max_len` tokens, drafted K = `k` ahead); `key` names the engine's config key
    in errors."""
    return tuple(graphs.engine(load_role(d, roles, role), roles["engine"], key, max_len, k)
                 for d, role in ((target_dir, "target"), (draft_dir, "draft")))


def run_real(spec: Verification, pair_name: str, pair: Pair, target_dir: str, draft_dir: str,
             seed: int, gguf: dict[str, str] | None = None) -> dict:
    """Level 3 on one draft/target configuration, in its engine (eager or CUDA graphs): both
    tests at full size, greedy agreement, and power over seeds at `power_tokens`. A role the
    pair runs in llama.cpp loads its GGUF file (`gguf`: role -> path), so the sampled mode of a
    quantized pair is checked the same way."""
    real, prompt_len = spec.real, 32
    roles = asdict(pair) | {f"{role}_gguf": path for role, path in (gguf or {}).items()}
    load = partial(load_pair, target_dir, draft_dir, roles,
                   f"speculative.pairs.{pair_name}.engine", prompt_len + real.budget, spec.k)
    target, draft = load()
    prompts = heldout_prompts(target_dir, real.prompts, prompt_len, seed)
    greedy_prompts = heldout_prompts(target_dir, real.greedy_prompts, prompt_len, seed + 1)
    return {"level": 3, "pair": pair_name,
            **level_three(spec, pair_name, target, draft, prompts, greedy_prompts, load=load)}


def level_three(spec: Verification, pair_name: str, target, draft, prompts, greedy_prompts,
                speculate=generate, draft_law: eq.LogProbs | None = None,
                load: Callable[[], tuple] | None = None) -> dict:
    """Level 3's report on one pair: both tests at `spec.real.tokens` for every rule, the token
    table, greedy agreement on `greedy_prompts`, power over seeds at `power_tokens`, and the
    full-size samples themselves (so any test can be recomputed from the report).
    `speculate` and `draft_law` (the log-ratio test's q): `real_model_levels`'."""
    real = spec.real
    full, samples = real_levels(spec, target, draft, prompts, real.tokens, [0], speculate,
                                draft_law, load)
    results, tokens = [], []
    for sampler in eq.SAMPLERS:
        chi = full["two-sample chi-square"](sampler, 0)
        results.append({**row(3, "two-sample chi-square", sampler, chi["chi2"], real.tokens,
                              spec.alpha, chi["p_value"], chi["dof"], pair_name),
                        "p_asymptotic": chi["p_asymptotic"], "permutations": chi["permutations"]})
        tokens += token_rows(chi, pair_name, sampler)
        lr = full["log-ratio t-test"](sampler, 0)
        results.append(row(3, "log-ratio t-test", sampler, lr["t"], real.tokens, spec.alpha,
                           lr["p_value"], None, pair_name))
    greedy = eq.greedy_agreement(target, draft, greedy_prompts, real.budget, spec.k, speculate)
    small, _ = real_levels(spec, target, draft, prompts, real.power_tokens, power_seeds(spec),
                           speculate, draft_law, load)
    power, pvalues = power_rows(small, spec, 3, real.power_tokens, pair_name)
    margins = [d["margin"] for d in greedy["divergences"]]
    return {"results": results, "power": power, "pvalues": pvalues, "tokens": tokens,
            "samples": {m: list(samples(m, 0)) for m in eq.METHODS},
            "greedy": [{"pair": pair_name, "prompts": len(greedy_prompts),
                        "fraction_equal": greedy["fraction_equal"],
                        "divergences": len(margins),
                        "min_margin": min(margins) if margins else None,
                        "detail": greedy["divergences"]}]}


# --- the long-context pair: the levels through a sparse draft cache (config 'long.verification')

def long_pair_name(drafter: str) -> str:
    return f"{tables.LONG_PAIR}{drafter}"


def sparse_speculate(policy: Policy, self_draft: bool) -> eq.Speculate:
    """`speculative.generate`'s call, run by `longctx.generate`: the draft (the target itself
    where `self_draft`) drafts through `policy`'s view, the target verifies on its full cache."""
    def speculate(target, draft, prompt, budget, k, s=GREEDY, draft_generator=None,
                  target_generator=None, accept=eq.SAMPLERS["correct"]):
        return longctx.generate(target, prompt, budget, k, policy, s, draft_generator,
                                target_generator, accept, drafter=None if self_draft else draft)
    return speculate


def long_levels_one_two(spec: Verification, pair_name: str, p, q, check: dict
                        ) -> tuple[list, list, list]:
    """Level 1 on the engine's own (p, q) rows (`check`: `equivalence.pair_check`'s) and level
    2 on its least-overlapping row (the most mass a rule must move): rows, power, p-values."""
    results = [row(1, "one step, long-context pairs", sampler, check["max_error"][sampler],
                   check["pairs"], spec.alpha, pair=pair_name) for sampler in eq.SAMPLERS]
    overlap = torch.minimum(p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)).sum(-1)
    i = int(overlap.argmin())
    mc = {"Monte Carlo, one step, long-context pair": eq.single_level(p[i], q[i],
                                                                     spec.monte_carlo.draws)}
    for check_name, fn in mc.items():
        for sampler in eq.SAMPLERS:
            out = fn(sampler, 0)
            results.append(row(2, check_name, sampler, out["chi2"], spec.monte_carlo.draws,
                               spec.alpha, out["p_value"], out.get("dof"), pair_name))
    power, pvalues = power_rows(mc, spec, 2, spec.monte_carlo.draws, pair_name)
    return results, power, pvalues


def run_long(spec: Verification, job: LongVerificationJob, target_dir: str,
             drafter_dir: str | None) -> dict:
    """Every level on the long-context pair of config 'long.verification', its own sample sizes
    in place of `spec`'s: level 1 on the (p, q) rows the engine's rule receives, level 2 on one
    of them, level 3 on prompts of `length` tokens of held-out documents, its log-ratio test's
    q the sparse draft's law at the first draft step of a proposal at each token
    (`longctx.first_draft_log_probs`: the target's own full-cache law would make the ratio 0)."""
    from decodelab.studies.long.run import heldout_documents

    v = job.check
    spec = replace(spec, k=v.k, seeds=v.seeds,
                   real=replace(spec.real, tokens=v.tokens, power_tokens=v.power_tokens))
    self_draft = v.drafter == "self"
    if not self_draft and drafter_dir is None:
        raise DecodelabError(f"config 'long.verification.drafter': {v.drafter!r} needs its "
                             "model directory (--draft-dir)")
    target = models.load(target_dir, job.device, job.dtype, role="target")
    draft = target if self_draft else models.load(drafter_dir, job.device, job.dtype,
                                                  role="draft")
    docs = heldout_documents(target_dir, v.documents, v.length, job.seed,
                             key="long.verification")
    prompts = [ids[:v.length] for _, ids in docs]
    policy = Policy(v.policy, v.kv_budget, seed=job.seed)
    speculate = sparse_speculate(policy, self_draft)
    draft_law = partial(longctx.first_draft_log_probs, draft, policy)
    name = long_pair_name(v.drafter)
    with torch.inference_mode():
        p, q = eq.engine_pairs(target, draft, prompts, spec.exact.real_positions, v.k, job.seed,
                               spec.real.budget, speculate)
        check = eq.pair_check(p, q)
        results, power, pvalues = long_levels_one_two(spec, name, p, q, check)
        three = level_three(spec, name, target, draft, prompts, prompts, speculate, draft_law)
    return {"level": "long", "pair": name, "settings": {**asdict(v), "device": job.device},
            "beta_mean": check["beta_mean"], **three, "results": results + three["results"],
            "power": power + three["power"], "pvalues": pvalues + three["pvalues"]}
