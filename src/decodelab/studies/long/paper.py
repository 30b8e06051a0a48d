r"""Long contexts: sparse-KV drafting against the full-cache target, per context length, KV
budget, policy, drafter and mode, with intervals over held-out documents.

    generated/tab_long.tex  per drafter, policy, budget, length and mode at the K of the best
                            speedup: alpha, per-proposal acceptance, speedup, c, the prediction

The stage is optional: without rows in long_acceptance.csv \LongReady is false and the macros
read '--'. BudgetDraft's own speedups are quoted (`seed.long_claims`), never matched: a 7B
verifier's on an A100. The committed CUDA reference of the study (results/reference/<name>/long,
read by `reference.compare` into reference_comparison.csv) is quoted from that table, with its
own flag \LongRefReady.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from decodelab.core import tables
from decodelab.report import reference as rf
from decodelab.report import seed
from decodelab.report.section import Section, placeholders, stage
from decodelab.report.settings import confidence
from decodelab.report.tex import (
    NONE,
    budget_list,
    ci,
    human_list,
    integer,
    label,
    sig,
    tabular,
    tex_escape,
    tt,
)

GREEDY = "greedy"


def policy_name(row) -> str:
    return tt(row.policy) if row.drafter == "self" else f"{tt(row.policy)} ({tt(row.drafter)})"


def headline(acceptance: pd.DataFrame) -> pd.DataFrame:
    """The rows the text quotes: greedy where run, the longest context, the smallest K."""
    rows = acceptance[acceptance["mode"] == GREEDY] if (acceptance["mode"] == GREEDY).any() \
        else acceptance
    rows = rows[rows["length"] == rows["length"].max()]
    return rows[rows["k"] == rows["k"].min()]


def alpha_text(row) -> str:
    return f"{sig(row.alpha)} {ci(row.ci_low, row.ci_high)}"


def full_sentence(acceptance: pd.DataFrame) -> str:
    """The positive control: the full cache drafts exactly the target (alpha 1 greedy)."""
    full = acceptance[(acceptance["policy"] == "full") & (acceptance["mode"] == GREEDY)
                      & (acceptance["drafter"] == "self")]  # a separate drafter is no control
    if not len(full):
        return "the full-cache control did not run"
    return (f"greedy per-token acceptance with the full cache is {sig(full['alpha'].min())} "
            f"to {sig(full['alpha'].max())} over every context length and $K$")


def acceptance_sentence(acceptance: pd.DataFrame) -> str:
    rows = headline(acceptance)
    budget = rows.loc[rows["kv_budget"] > 0, "kv_budget"].min()
    rows = rows[(rows["kv_budget"] == budget) | (rows["kv_budget"] == 0)]
    said = [f"{policy_name(r)} {alpha_text(r)}" for r in rows.sort_values("policy").itertuples()]
    first = rows.iloc[0]
    where = (f"$L={integer(first['length'])}$, $K={integer(first['k'])}$, "
             f"{tex_escape(first['mode'])}")
    if np.isfinite(budget):
        where += f", budget $B={integer(budget)}$"
    return f"at {where}: {human_list(said, empty=NONE)}"


def control_sentence(acceptance: pd.DataFrame) -> str:
    """Retrieval against random chunks (the negative control) at the headline rows."""
    rows = headline(acceptance)
    by = {(r.drafter, r.kv_budget): {} for r in rows.itertuples()}
    for r in rows.itertuples():
        by[(r.drafter, r.kv_budget)][r.policy] = r
    apart = [(key, p) for key, p in by.items() if {"retrieval", "random_chunks"} <= set(p)]
    if not apart:
        return "retrieval and random chunks were not both run"
    above = sum(p["retrieval"].ci_low > p["random_chunks"].ci_high for _, p in apart)
    return (f"retrieval's interval lies above random chunks' at {above} of {len(apart)} "
            f"budgets")


def speedup_sentence(speedup: pd.DataFrame) -> str:
    """Per context length: the best configuration's speedup, its interval, and whether the
    interval lies above 1."""
    parts = []
    for length, g in speedup.groupby("length"):
        best = g.loc[g["speedup"].idxmax()]
        budget = f"$B={integer(best.kv_budget)}$, " if best.kv_budget > 0 else ""
        where = f"{policy_name(best)}, {budget}$K={integer(best.k)}$, {tex_escape(best['mode'])}"
        verdict = ("an interval of zero width, as from one document"
                   if best["ci_low"] == best["ci_high"]
                   else "interval above 1" if best["ci_low"] > 1 else "interval not above 1")
        parts.append(f"{sig(best['speedup'])} {ci(best['ci_low'], best['ci_high'])} at "
                     f"$L={integer(length)}$ ({where}; {verdict})")
    return human_list(parts, empty=NONE)


def cost_sentence(speedup: pd.DataFrame) -> str:
    c = speedup["cost_ratio"]
    gap = (speedup["predicted"] - speedup["speedup"]).abs()
    return (f"$c$ is {sig(c.min())} to {sig(c.max())}; the prediction from the measured alpha "
            f"and $c$ is off the measured speedup by {sig(gap.median())} (median over "
            f"configurations)")


def memory_sentence(memory: pd.DataFrame) -> str:
    longest = memory[memory["length"] == memory["length"].max()]
    sparse = longest[longest["policy"] != "full"]
    peak = memory["peak_bytes"]
    text = (f"at $L={integer(longest['length'].max())}$ the verifier holds "
            f"{sig(longest['verifier_kv_bytes'].max() / 2**20)} MiB of keys and values, a "
            f"sparse draft view at most {sig(sparse['draft_kv_bytes'].min() / 2**20)} to "
            f"{sig(sparse['draft_kv_bytes'].max() / 2**20)} MiB" if len(sparse) else NONE)
    if peak.notna().any():
        text += f"; the allocator's peak is {sig(peak.max() / 2**20)} MiB"
    return text


def long_table(speedup: pd.DataFrame, acceptance: pd.DataFrame, level: str) -> str:
    keys = ["drafter", "policy", "kv_budget", "length", "mode", "k"]
    merged = speedup.merge(acceptance[[*keys, "ci_low", "ci_high", "proposal_acceptance"]],
                           on=keys, suffixes=("", "_alpha")) if len(speedup) else speedup
    rows = []
    for _, g in merged.groupby(keys[:-1], sort=True) if len(merged) else ():
        b = g.loc[g["speedup"].idxmax()]
        rows.append([policy_name(b), integer(b.kv_budget) if b.kv_budget else "all",
                     integer(b.length), tex_escape(b["mode"]), integer(b.k),
                     f"{sig(b.alpha)} {ci(b.ci_low_alpha, b.ci_high_alpha)}",
                     sig(b.proposal_acceptance), sig(b.speedup), ci(b.ci_low, b.ci_high),
                     sig(b.cost_ratio), sig(b.predicted)])
    header = [rf"Policy & $B$ & $L$ & Mode & $K$ & alpha ({level} CI) & per proposal & "
              rf"speedup & {level} CI & $c$ & predicted \\"]
    return tabular("@{}lrrlrlrrcrr@{}", header, rows, "no long-context runs in this build")


def built(acceptance: pd.DataFrame, speedup: pd.DataFrame, memory: pd.DataFrame,
          settings: dict) -> Section:
    ran = bool(len(acceptance))
    macros = {
        "LongTarget": human_list([tt(t) for t in sorted(set(acceptance["target"]))]) if ran
        else NONE,
        "LongBackends": human_list([label(b) for b in sorted(set(acceptance["backend"]))])
        if ran else NONE,
        "LongLengths": budget_list(acceptance["length"].unique()) if ran else NONE,
        "LongBudgets": budget_list(acceptance.loc[acceptance["kv_budget"] > 0, "kv_budget"]
                                   .unique()) if ran else NONE,
        "LongPolicies": human_list([tt(p) for p in sorted(set(acceptance["policy"]))]) if ran
        else NONE,
        "LongDocuments": integer(acceptance["n"].max()) if ran else NONE,
        "LongFullSentence": full_sentence(acceptance) if ran else NONE,
        "LongAcceptanceSentence": acceptance_sentence(acceptance) if ran else NONE,
        "LongControlSentence": control_sentence(acceptance) if ran else NONE,
        "LongSpeedupSentence": speedup_sentence(speedup) if len(speedup) else NONE,
        "LongCostSentence": cost_sentence(speedup) if len(speedup) else NONE,
        "LongMemorySentence": memory_sentence(memory) if len(memory) else NONE,
    }
    return Section(macros, {}, {"tab_long.tex": long_table(speedup, acceptance,
                                                           confidence(settings))})


# --- the committed CUDA reference of the study, from reference_comparison.csv ---------------

def reference_rows(comparison: pd.DataFrame) -> pd.DataFrame:
    """The long-context rows the first CUDA reference of the study measured: one row per
    configuration, its quantities as the long tables' columns (speedup, ci_low, ci_high, alpha,
    alpha_low, alpha_high), plus reference and reference_device."""
    names = {q: ("alpha_" + c.removeprefix("ci_") if q.startswith("long_alpha_") else c)
             for table in rf.LONG.values() for c, q in table.items()}
    comparison = comparison.reindex(columns=rf.COLUMNS)
    return rf.measured(comparison[comparison["backend"] == "cuda"], names, rf.LONG_KEYS)


def as_acceptance(rows: pd.DataFrame) -> pd.DataFrame:
    """The reference's rows as long_acceptance's columns (alpha with its interval)."""
    return rows.drop(columns=["ci_low", "ci_high"]).rename(
        columns={"alpha_low": "ci_low", "alpha_high": "ci_high"})


def self_retrieval_sentence(speedup: pd.DataFrame) -> str:
    """Self-speculation with retrieval per context length: its speedups' range over budgets,
    modes and K, and in how many of them the interval lies above 1."""
    rows = speedup[(speedup["drafter"] == "self") & (speedup["policy"] == "retrieval")]
    if not len(rows):
        return "self-speculation with retrieval did not run there"
    parts = [f"{sig(g['speedup'].min())} to {sig(g['speedup'].max())}$\\times$ at "
             f"$L={integer(length)}$" for length, g in rows.groupby("length")]
    above = int((rows["ci_low"] > 1).sum())
    return (f"self-speculation with retrieval runs {human_list(parts)}, its interval above 1 in "
            f"{above} of {len(rows)} settings")


def reference_section(comparison: pd.DataFrame) -> Section:
    """LongRef*: what the first CUDA reference of the study measured, from the comparison."""
    rows = reference_rows(comparison)
    ran = bool(len(rows))
    acceptance = as_acceptance(rows)
    macros = {
        "LongRefName": tt(rows["reference"].iloc[0]) if ran else NONE,
        "LongRefDevice": tex_escape(rows["reference_device"].iloc[0]) if ran else NONE,
        "LongRefLengths": budget_list(rows["length"].unique()) if ran else NONE,
        "LongRefBudgets": budget_list(rows.loc[rows["kv_budget"] > 0, "kv_budget"].unique())
        if ran else NONE,
        "LongRefDrafters": human_list([tt(d) for d in sorted(set(rows["drafter"]))])
        if ran else NONE,
        "LongRefFullSentence": full_sentence(acceptance) if ran else NONE,
        "LongRefSelfSentence": self_retrieval_sentence(rows) if ran else NONE,
        "LongRefSpeedupSentence": speedup_sentence(rows) if ran else NONE,
    }
    return stage("LongRefReady", ran, Section(macros, {}))


def parts(stats_dir: Path, settings: dict) -> Section:
    t = tables.read_group(stats_dir, "long")
    ran = bool(len(t["acceptance"]))
    section = built(t["acceptance"], t["speedup"], t["memory"], settings)
    shown = section if ran else placeholders(section)
    ref = reference_section(tables.read(stats_dir, "reference_comparison"))
    return stage("LongReady", ran, Section({**shown.macros, **seed.long_claims(), **ref.macros},
                                           {**shown.flags, **ref.flags}, shown.files))
