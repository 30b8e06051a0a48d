"""The verification stage: the three levels of `equivalence`, run from the config, as JSON rows.

Every check runs for the correct rejection rule and for the two wrong ones, which it must reject;
power tables repeat the statistical checks over seeds.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import torch
from tqdm import tqdm

from . import equivalence as eq
from . import models
from .config import Pair, Verification
from .train import heldout_prompts

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


def real_levels(spec: Verification, target, draft, prompts, n_tokens: int
                ) -> tuple[dict, Callable]:
    """Both level-3 tests by check name, and the (method, seed) -> tokens sampler they share."""
    levels = eq.real_model_levels(target, draft, prompts, n_tokens, spec.k, spec.real.budget,
                                  spec.real.top)
    return ({"two-sample chi-square": levels["chi2"], "log-ratio t-test": levels["log_ratio"]},
            levels["tokens"])


def power_rows(levels: dict, spec: Verification, level: int, n: int, pair: str = ""
               ) -> tuple[list, list]:
    seeds = range(1, spec.seeds + 1)
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


def run_real(spec: Verification, pair_name: str, pair: Pair, target_dir: str, draft_dir: str,
             seed: int) -> dict:
    """Level 3 on one draft/target configuration: both tests at full size, greedy agreement,
    and power over seeds at `power_tokens`."""
    real = spec.real
    target, draft = load_models(target_dir, draft_dir, pair.target_device, pair.draft_device,
                                pair.dtype)
    prompts = heldout_prompts(target_dir, real.prompts, 32, seed)
    full, samples = real_levels(spec, target, draft, prompts, real.tokens)
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
    greedy_prompts = heldout_prompts(target_dir, real.greedy_prompts, 32, seed + 1)
    greedy = eq.greedy_agreement(target, draft, greedy_prompts, real.budget, spec.k)
    small, _ = real_levels(spec, target, draft, prompts, real.power_tokens)
    power, pvalues = power_rows(small, spec, 3, real.power_tokens, pair_name)
    margins = [d["margin"] for d in greedy["divergences"]]
    return {"level": 3, "pair": pair_name, "results": results, "power": power,
            "pvalues": pvalues, "tokens": tokens,
            # the full-size samples themselves, so any test can be recomputed from the report
            "samples": {m: list(samples(m, 0)) for m in eq.METHODS},
            "greedy": [{"pair": pair_name, "prompts": len(greedy_prompts),
                        "fraction_equal": greedy["fraction_equal"],
                        "divergences": len(margins),
                        "min_margin": min(margins) if margins else None,
                        "detail": greedy["divergences"]}]}
