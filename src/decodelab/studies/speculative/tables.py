"""The speculative study's tables: acceptance per K, speedup over the fair baseline and the
stepped harness, the intervals over prompts, Leviathan's theory against the measurement,
Hugging Face assisted generation, verification parallelism and the bandwidth floor."""

from __future__ import annotations

import numpy as np
import pandas as pd

from decodelab.analysis.stability import paired
from decodelab.analysis.stats import bootstrap_ci, median_ratio
from decodelab.analysis.theory import (
    alpha_from_tokens_per_call,
    alpha_of_calls,
    expected_speedup,
    expected_tokens_per_call,
)
from decodelab.config.settings import Confidence

SPEC_KEYS = ["pair", "mode", "k"]


def is_list(cell) -> bool:
    return isinstance(cell, list | np.ndarray)


def summed(f):
    """Sum of f over the list cells of a column; rows of other methods hold NaN there."""
    return lambda cells: sum(f(c) for c in cells if is_list(c))


def pooled_alpha(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per speculative group: alpha from its full-K calls pooled over prompts; from all calls'
    tokens per call for runs from before the per-call proposals were recorded (a reference
    may hold both)."""
    rows = []
    for key, g in runs[runs["method"] == "speculative"].groupby(keys):
        k = int(dict(zip(keys, key, strict=True))["k"])
        if "proposals" in g and g["proposals"].map(is_list).all():
            accepted = [n for cell in g["accepted"] for n in cell]
            alpha = alpha_of_calls(accepted, [m for cell in g["proposals"] for m in cell], k)
        else:
            alpha = alpha_from_tokens_per_call(g["tokens"].map(len).sum()
                                               / g["target_calls"].sum(), k)
        rows.append({**dict(zip(keys, key, strict=True)), "alpha": alpha})
    return pd.DataFrame(rows, columns=[*keys, "alpha"])


def spec_per_process(runs: pd.DataFrame) -> pd.DataFrame:
    """Per process, method, mode and K: median time over prompts; pooled acceptance, both kinds:
    per proposal (accepted / proposed) and per token (alpha, from tokens per target call)."""
    keys = ["pair", "repeat", "method", "mode", "k"]
    g = runs.groupby(keys)
    out = g.agg(total_s=("total_s", "median"), prompts=("prompt", "nunique")).reset_index()
    if "proposed" in runs:
        pooled = g.agg(accepted=("accepted", summed(sum)), proposed=("proposed", "sum"),
                       tokens=("tokens", summed(len)), calls=("target_calls", "sum")).reset_index()
        out = out.merge(pooled, on=keys)
        out["proposal_acceptance"] = out["accepted"] / out["proposed"].where(out["proposed"] > 0)
        out["tokens_per_call"] = out["tokens"] / out["calls"].where(out["calls"] > 0)
        out = out.merge(pooled_alpha(runs, keys), on=keys, how="left")
    for column in ("step_s", "overhead_share", "host_gap_share"):
        if column in runs:
            out = out.merge(g.agg(**{column: (column, "median")}).reset_index(), on=keys)
    if {"verify_s", "prefill_s"} <= set(runs):
        passes = runs.assign(pass_s=target_pass_s(runs)).groupby(keys)["pass_s"].median()
        out = out.merge(passes.reset_index(), on=keys)
    if {"draft_s", "draft_prefill_s", "draft_forwards"} <= set(runs):
        passes = runs.assign(draft_pass_s=draft_pass_s(runs)).groupby(keys)["draft_pass_s"]
        out = out.merge(passes.median().reset_index(), on=keys)
    return out


def draft_pass_s(runs: pd.DataFrame) -> pd.Series:
    """Time of one draft pass after the first span's in a speculative run, inside the forward
    pass: each follows a verification or another draft pass, where the draft's own loop (its
    `pass_s`) follows only its own passes. The first span is the prompt's pass, and with a graph
    engine the rest of its proposal (`draft_prefill_passes`; rows from before it: one)."""
    first = runs["draft_prefill_passes"] if "draft_prefill_passes" in runs else 1
    passes = runs["draft_forwards"] - first
    return (runs["draft_s"] - runs["draft_prefill_s"]) / passes.where(passes > 0)


def target_pass_s(runs: pd.DataFrame) -> pd.Series:
    """Time of one target pass after the prompt's, inside the forward pass: a verification of
    K+1 tokens in a speculative run, one token in the baseline's."""
    return (runs["verify_s"] - runs["prefill_s"]) / (runs["target_calls"] - 1).where(
        runs["target_calls"] > 1)


def acceptance_table(proc: pd.DataFrame, ci: Confidence) -> pd.DataFrame:
    """Per pair, mode and K: alpha (per-token acceptance, what the theory takes) with its
    interval over processes, and the per-proposal acceptance beside it."""
    spec = proc[proc["method"] == "speculative"]
    rows = []
    for key, group in spec.groupby(SPEC_KEYS):
        x = group["alpha"].to_numpy(dtype=float)
        low, high = bootstrap_ci(np.median, (x,), ci)
        rows.append({**dict(zip(SPEC_KEYS, key, strict=True)), "alpha": float(np.median(x)),
                     "ci_low": low, "ci_high": high,
                     "proposal_acceptance": float(group["proposal_acceptance"].median()),
                     "tokens_per_call": float(group["tokens_per_call"].median()), "n": len(x)})
    return pd.DataFrame(rows)


BASELINE = "autoregressive"  # the target alone in the speculative engine's loop


STEPPED = "autoregressive_stepped"  # the latency harness, synchronized after every step


def speedup_table(proc: pd.DataFrame, ci: Confidence, verdict: pd.DataFrame) -> pd.DataFrame:
    """Autoregressive over speculative wall time, same pair, mode and processes; stable when
    both are (`verdict`: `stability.verdicts(raw runs, SPECULATIVE, ...)`). `speedup` is over
    the fair baseline (`baseline` says which: "fair", or "stepped" for runs from before it,
    whose `autoregressive` was the stepped harness); `speedup_stepped` over the stepped one."""
    rows = []
    for (pair, mode), group in proc.groupby(["pair", "mode"]):
        base = group.loc[group["method"] == BASELINE, "total_s"].to_numpy(dtype=float)
        stepped = group.loc[group["method"] == STEPPED, "total_s"].to_numpy(dtype=float)
        for k, spec in group[group["method"] == "speculative"].groupby("k"):
            x = spec["total_s"].to_numpy(dtype=float)
            low, high = bootstrap_ci(median_ratio, (base, x), ci)
            row = {"pair": pair, "mode": mode, "k": k, "baseline": "fair" if len(stepped)
                   else "stepped", "speedup": median_ratio(base, x), "ci_low": low,
                   "ci_high": high, "spec_s": float(np.median(x)),
                   "autoregressive_s": float(np.median(base)), "n": len(x),
                   **{column: float(spec[column].median()) if column in spec else np.nan
                      for column in ("overhead_share", "host_gap_share")}}
            if len(stepped):
                low, high = bootstrap_ci(median_ratio, (stepped, x), ci)
                row |= {"speedup_stepped": median_ratio(stepped, x), "stepped_ci_low": low,
                        "stepped_ci_high": high, "stepped_s": float(np.median(stepped))}
            rows.append(row)
    return paired(pd.DataFrame(rows), verdict, {
        "speculative": (SPEC_KEYS, {"method": "speculative"}),
        BASELINE: (["pair", "mode"], {"method": BASELINE})})


def prompt_table(runs: pd.DataFrame, ci: Confidence) -> pd.DataFrame:
    """Per pair, mode and K: the speedup's interval over prompts, each prompt's baseline and
    speculative times (medians over processes) resampled together. Every process decodes the
    same prompts, so the interval over processes holds them fixed; this one shows what the
    choice of prompts adds (how well the draft guesses differs from text to text)."""
    columns = [*SPEC_KEYS, "prompts", "prompt_ci_low", "prompt_ci_high"]
    times = runs.groupby(["pair", "mode", "method", "k", "prompt"])["total_s"].median()
    times = times.reset_index()
    base = times[times["method"] == BASELINE].drop(columns=["method", "k"])
    spec = times[times["method"] == "speculative"].drop(columns="method")
    rows = []
    for key, group in spec.merge(base, on=["pair", "mode", "prompt"]).groupby(SPEC_KEYS):
        x, b = (group[c].to_numpy(dtype=float) for c in ("total_s_x", "total_s_y"))
        low, high = bootstrap_ci(median_ratio, (b, x), ci, paired=True)
        rows.append((*key, len(group), low, high))
    return pd.DataFrame(rows, columns=columns)


def theory_table(proc: pd.DataFrame, speedup: pd.DataFrame,
                 acceptance: pd.DataFrame) -> pd.DataFrame:
    """Leviathan et al.'s expected speedup from measured alpha and cost ratio c (draft step over
    target step, both in the engine's loop), against the measured speedup over that loop.

    Leviathan's formula prices a verification of K+1 tokens as one target step. `verify_cost`
    is what it measured in the same runs (a verification pass over a baseline pass, forward
    time alone), and `predicted_verify` the same formula with that price: where verification is
    not free (a CPU), the gap between the two predictions is its cost, and what remains between
    `predicted_verify` and `measured` is the draft's passes in the loop and the host.
    `draft_cost` is a draft pass in the loop over one in the draft's own loop (above 1 where
    the target's pass evicts the draft's weights from the caches), and `predicted_passes` the
    formula with both passes at their measured prices (as `predicted_verify`, on whole steps):
    what remains between it and `measured` is the host."""
    steps = proc.groupby(["pair", "mode", "method"])["step_s"].median()
    passes = (proc.groupby(["pair", "mode", "method", "k"])["pass_s"].median()
              if "pass_s" in proc else pd.Series(dtype=float))
    drafts = (proc.groupby(["pair", "mode", "method", "k"])["draft_pass_s"].median()
              if "draft_pass_s" in proc else pd.Series(dtype=float))
    rows = []
    for row in speedup.merge(acceptance, on=SPEC_KEYS, suffixes=("", "_acc")).itertuples():
        c = steps[(row.pair, row.mode, "draft_autoregressive")] / \
            steps[(row.pair, row.mode, BASELINE)]
        v = (passes.get((row.pair, row.mode, "speculative", row.k), np.nan)
             / passes.get((row.pair, row.mode, BASELINE, 0), np.nan))
        d = (drafts.get((row.pair, row.mode, "speculative", row.k), np.nan)
             / passes.get((row.pair, row.mode, "draft_autoregressive", 0), np.nan))
        tokens = expected_tokens_per_call(row.alpha, row.k)
        rows.append({"pair": row.pair, "mode": row.mode, "k": row.k, "alpha": row.alpha,
                     "cost_ratio": float(c), "predicted": expected_speedup(row.alpha, row.k, c),
                     "measured": row.speedup, "verify_cost": float(v),
                     "predicted_verify": tokens / (row.k * c + v), "draft_cost": float(d),
                     "predicted_passes": tokens / (row.k * c * d + v)})
    return pd.DataFrame(rows)


def method_ratios(proc: pd.DataFrame) -> pd.DataFrame:
    """Per K: plain decoding, ours and HF assisted generation (median seconds), as ratios."""
    table = proc.pivot_table(index="k", columns="method", values="total_s")
    base = table.loc[0, "autoregressive"]
    table = table.drop(index=0)[["speculative", "hf_assisted"]].assign(
        speedup_vs_plain=lambda t: base / t["speculative"],
        hf_speedup_vs_plain=lambda t: base / t["hf_assisted"],
        ours_over_hf=lambda t: t["hf_assisted"] / t["speculative"])
    table.insert(0, "plain", base)
    return table


def agreement(runs: pd.DataFrame, method: str) -> pd.DataFrame:
    """Per pair and K: the fraction of greedy sequences of `method` equal to the target's own."""
    greedy = runs[runs["mode"] == "greedy"]
    base = greedy[greedy["method"] == "autoregressive"].set_index(["pair", "repeat", "prompt"])
    rows = []
    for (pair, k), group in greedy[greedy["method"] == method].groupby(["pair", "k"]):
        same = [list(r.tokens) == list(base.loc[(pair, r.repeat, r.prompt), "tokens"])
                for r in group.itertuples()]
        rows.append({"pair": pair, "k": k, "method": method, "agree": float(np.mean(same)),
                     "sequences": len(same)})
    return pd.DataFrame(rows, columns=["pair", "k", "method", "agree", "sequences"])


def hf_table(proc: pd.DataFrame, runs: pd.DataFrame, ci: Confidence) -> pd.DataFrame:
    """Our greedy speculative decoding against HF assisted generation at the same K."""
    greedy = proc[proc["mode"] == "greedy"]
    rows = []
    for (pair, k), hf in greedy[greedy["method"] == "hf_assisted"].groupby(["pair", "k"]):
        ours = greedy[(greedy["pair"] == pair) & (greedy["k"] == k)
                      & (greedy["method"] == "speculative")]["total_s"].to_numpy(dtype=float)
        theirs = hf["total_s"].to_numpy(dtype=float)
        low, high = bootstrap_ci(median_ratio, (theirs, ours), ci)
        rows.append({"pair": pair, "k": k, "ours_s": float(np.median(ours)),
                     "hf_s": float(np.median(theirs)), "ours_over_hf": median_ratio(theirs, ours),
                     "ci_low": low, "ci_high": high})
    table = pd.DataFrame(rows, columns=["pair", "k", "ours_s", "hf_s", "ours_over_hf", "ci_low",
                                        "ci_high"])
    agree = pd.concat([agreement(runs, "speculative"), agreement(runs, "hf_assisted")])
    wide = agree.pivot_table(index=["pair", "k"], columns="method", values="agree").reset_index()
    wide.columns = [c if c in ("pair", "k") else f"agree_{c}" for c in wide.columns]
    return table.merge(wide, on=["pair", "k"], how="outer")


def parallelism_table(runs: pd.DataFrame, ci: Confidence) -> pd.DataFrame:
    """Forward time on K+1 tokens over time on one token, per process, then across processes."""
    keys = ["backend", "model", "context"]
    if not len(runs):  # a run without the parallelism study (scripts/gpu_pair.py)
        return pd.DataFrame(columns=[*keys, "k", "ratio", "ci_low", "ci_high", "n"])
    per = runs.groupby([*keys, "repeat", "tokens"])["seconds"].median().reset_index()
    rows = []
    for key, group in per.groupby(keys):
        one = group[group["tokens"] == 1].set_index("repeat")["seconds"]
        for n, sub in group[group["tokens"] > 1].groupby("tokens"):
            ratio = (sub.set_index("repeat")["seconds"] / one).dropna().to_numpy()
            low, high = bootstrap_ci(np.median, (ratio,), ci)
            rows.append({**dict(zip(keys, key, strict=True)), "k": int(n) - 1,
                         "ratio": float(np.median(ratio)), "ci_low": low, "ci_high": high,
                         "n": len(ratio)})
    return pd.DataFrame(rows)


# the bandwidth floor (decodelab.engines.cuda.floor measures it): role -> the method whose rows
# time that
# model alone, one token per step (`step_s`), in the engine's loop
ALONE = {"target": BASELINE, "draft": "draft_autoregressive"}


def engine_of(row: pd.Series) -> str:
    engine = row.get("pair_engine")
    return engine if isinstance(engine, str) else "eager"


def floor_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per pair and role: the model's greedy step alone in the engine's loop (median over
    processes of each process's median), its weight bytes, the measured bandwidth, the floor
    and the step over it. Runs from before the columns were recorded give no rows."""
    if "target_bandwidth" not in runs:
        return pd.DataFrame()
    rows = []
    for role, method in ALONE.items():
        alone = runs[(runs["method"] == method) & (runs["mode"] == "greedy")]
        for pair, group in alone.groupby("pair"):
            step = float(group.groupby("repeat")["step_s"].median().median())
            nbytes = float(group[f"{role}_weight_bytes"].median())
            bandwidth = float(group[f"{role}_bandwidth"].median())
            floor_s = nbytes / bandwidth
            first = group.iloc[0]
            rows.append({"pair": pair, "role": role, "model": first.get(f"pair_{role}", ""),
                         "device": first.get(f"pair_{role}_device", ""),
                         "engine": engine_of(first),
                         "step_s": step, "weight_bytes": nbytes, "bandwidth": bandwidth,
                         "floor_s": floor_s, "over_floor": step / floor_s if floor_s else np.nan,
                         "n": group["repeat"].nunique()})
    return pd.DataFrame(rows)
