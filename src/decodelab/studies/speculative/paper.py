r"""Speculative decoding: draft/target pairs, acceptance, speedup against the theory, the
verification parallelism, Hugging Face assisted generation, and the models trained here.

    generated/tab_spec_pairs.tex  per draft/target pair: best K, speedup, acceptance, ran/skipped
    generated/tab_spec_hf.tex     our speculative decoding over Hugging Face assisted generation
    generated/tab_spec_floor.tex  each pair's models, their greedy step alone over the
                                  memory-bandwidth floor (weight bytes / measured copy bandwidth)
    generated/tab_models.tex      models trained here: size, losses, acceptance vs the teacher

The stage is optional: without speculative_speedup.csv \SpeculativeReady is false and the
macros that come from its tables read '--' (those of the settings still say what was asked for).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from decodelab.analysis.selection import best_pair, best_per_pair_mode, headline_mode
from decodelab.core import tables
from decodelab.report import seed
from decodelab.report.environment import backends_run
from decodelab.report.noise import finding, read
from decodelab.report.read import model_field, read_models, spec_modes, spec_pairs
from decodelab.report.section import Section, stage
from decodelab.report.settings import (
    PARALLEL_K,
    confidence,
    requested_pairs,
    spec_settings,
    spec_settings_macros,
)
from decodelab.report.tex import (
    NONE,
    ci,
    finite,
    human_list,
    label,
    percent,
    sig,
    tabular,
    tex_escape,
    tt,
)


def no_rows() -> dict[str, pd.DataFrame]:
    """The stage's tables without rows: what its macros are built on when it did not run."""
    return {t.key: pd.DataFrame() for t in tables.group("speculative")}


def read_speculative(stats_dir: Path) -> dict[str, pd.DataFrame] | None:
    """The speculative tables, or None when the stage did not run (no speculative_speedup.csv)."""
    if not tables.path(stats_dir, "speculative_speedup").exists():
        return None
    return tables.read_group(stats_dir, "speculative")


def num(models: pd.DataFrame, model: str, field: str, fmt=sig) -> str:
    value = model_field(models, model, field)
    return fmt(float(value)) if finite(value) else NONE



def value(row: pd.Series | None, column: str, fmt=sig) -> str:
    """`fmt` of a row's column, '--' without the row, the column or a finite value."""
    x = row.get(column) if row is not None else None
    return fmt(float(x)) if finite(x) else NONE


def prompt_ci(row: pd.Series | None) -> str:
    """The speedup's interval over prompts; '--' for rows from before it was computed."""
    if row is None or not finite(row.get("prompt_ci_low")):
        return NONE
    return ci(row["prompt_ci_low"], row["prompt_ci_high"])


BASELINE_WORDS = {
    "fair": "the target alone in the same engine loop, synchronized only at its start and end",
    "stepped": "the per-step synchronized harness (runs from before the fair baseline)"}


def pair_order(settings: dict, *frames: pd.DataFrame) -> list[str]:
    """Pairs in the order the configuration lists them, then any others in the tables."""
    requested = list(requested_pairs(settings))
    return requested + [p for p in spec_pairs(*frames) if p not in requested]


def pair_devices(settings: dict, pair: str) -> tuple[str, str]:
    """(draft device, target device) labels of a pair, '--' where the settings do not say."""
    spec = requested_pairs(settings).get(pair, {})
    return (label(spec["draft_device"]) if "draft_device" in spec else NONE,
            label(spec["target_device"]) if "target_device" in spec else NONE)


def lookup(df: pd.DataFrame, column: str, **keys):
    """The value of `column` in the one row matching `keys`, else NaN."""
    if not len(df) or column not in df:
        return float("nan")
    hit = df[np.logical_and.reduce([df[k] == v for k, v in keys.items()])]
    return hit[column].iloc[0] if len(hit) else float("nan")


def first_k(acceptance: pd.DataFrame, pair: str | None = None, mode: str | None = None):
    rows = acceptance
    if len(rows) and pair is not None:
        rows = rows[(rows["pair"] == pair) & (rows["mode"] == mode)]
    return int(rows["k"].min()) if len(rows) else None


def slower_pairs(speedup: pd.DataFrame, mode: str, column: str = "speedup") -> list[str]:
    """Pairs whose `column` (median, or the CI's upper end) is below one at every K."""
    rows = speedup[speedup["mode"] == mode] if len(speedup) else speedup
    if not len(rows):
        return []
    top = rows.groupby("pair")[column].max()
    return sorted(top[top < 1].index)


def parallel_row(parallelism: pd.DataFrame, backend: str, target: str | None):
    """The ratio row quoted for `backend`: K = PARALLEL_K or the largest K below it measured
    (the smallest K when all exceed it), for the headline target model when measured there."""
    rows = parallelism[parallelism["backend"] == backend] if len(parallelism) else parallelism
    if not len(rows):
        return None
    models = sorted(rows["model"].astype(str).unique())
    model = target if target in models else models[0]
    rows = rows[rows["model"].astype(str) == model]
    below = rows[rows["k"] <= PARALLEL_K]
    k = below["k"].max() if len(below) else rows["k"].min()
    return rows[rows["k"] == k].iloc[0]


def skipped_pairs(settings: dict, speedup: pd.DataFrame, env: pd.DataFrame) -> dict[str, str]:
    """Requested pairs without a result -> the devices they need that this host lacks."""
    requested = requested_pairs(settings)
    ran = set(speedup["pair"]) if len(speedup) else set()
    have = set(backends_run(env))
    for name in ran & set(requested):
        have |= {requested[name].get("draft_device"), requested[name].get("target_device")}
    out = {}
    for name, pair in requested.items():
        if name in ran:
            continue
        devices = list(dict.fromkeys([pair.get("draft_device"), pair.get("target_device")]))
        missing = [label(d) for d in devices if d and d not in have]
        out[name] = (f"needs {human_list(missing)}" if missing
                     else "no result reached the statistics")
    return out


def spec_pair_macros(t: dict[str, pd.DataFrame], settings: dict,
                     env: pd.DataFrame) -> dict[str, str]:
    speedup, acceptance, theory = t["speedup"], t["acceptance"], t["theory"]
    ran = spec_pairs(speedup)
    skipped = skipped_pairs(settings, speedup, env)
    requested = requested_pairs(settings)
    mode = headline_mode(speedup)
    macros = {
        "SpecNumPairsRequested": str(len(requested)),
        "SpecNumPairsRun": str(len(ran)),
        "SpecPairsRun": human_list([tt(p) for p in pair_order(settings, speedup) if p in ran]),
        "SpecNumPairsSkipped": str(len(skipped)),
        "SpecPairsSkipped": human_list([f"{tt(p)} ({why})" for p, why in skipped.items()]),
    }
    for m in ("sampled", "greedy"):
        name = m.title()
        slow = slower_pairs(speedup, m)
        macros[f"SpecNumSlower{name}"] = str(len(slow))
        macros[f"SpecSlowerPairs{name}"] = human_list([tt(p) for p in slow])
        macros[f"SpecNumSlowerCI{name}"] = str(len(slower_pairs(speedup, m, "ci_high")))
    pair = best_pair(speedup)
    draft, target = pair_devices(settings, pair) if pair else (NONE, NONE)
    macros.update({"SpecBestPair": tt(pair) if pair else NONE,
                   "SpecBestDraftDevice": draft, "SpecBestTargetDevice": target})
    best = best_per_pair_mode(speedup)
    for m in ("sampled", "greedy"):
        name = m.title()
        row = best[(best["pair"] == pair) & (best["mode"] == m)] if len(best) else best
        row = row.iloc[0] if len(row) else None
        k = int(row["k"]) if row is not None else None
        k1 = first_k(acceptance, pair, m) if pair else None
        macros.update({
            f"SpecBestK{name}": str(k) if k is not None else NONE,
            f"SpecBestSpeedup{name}": sig(row["speedup"]) if row is not None else NONE,
            f"SpecBestCI{name}": ci(row["ci_low"], row["ci_high"]) if row is not None else NONE,
            f"SpecBestPromptCI{name}": prompt_ci(row),
            f"SpecBestPrompts{name}": value(row, "prompts", lambda x: str(int(x))),
            f"SpecBestSpeedupStepped{name}": value(row, "speedup_stepped"),
            f"SpecBestOverhead{name}": value(row, "overhead_share", percent),
            f"SpecBestHostGap{name}": value(row, "host_gap_share", percent),
            f"SpecFirstK{name}": str(k1) if k1 is not None else NONE,
            f"SpecTokensPerCallBest{name}": sig(lookup(acceptance, "tokens_per_call", pair=pair,
                                                       mode=m, k=k)) if k is not None else NONE,
        })
        for at, kk in (("FirstK", k1), ("BestK", k)):
            for prefix, column in (("SpecAlpha", "alpha"), ("SpecPropAcc", "proposal_acceptance")):
                macros[f"{prefix}{at}{name}"] = percent(lookup(
                    acceptance, column, pair=pair, mode=m, k=kk)) if kk is not None else NONE
    macros["SpecBaseline"] = BASELINE_WORDS.get(lookup(speedup, "baseline", pair=pair, mode=mode),
                                                NONE)
    k = macros[f"SpecBestK{mode.title()}"] if mode.title() in ("Sampled", "Greedy") else NONE
    at = {"pair": pair, "mode": mode, "k": int(k)} if k != NONE else None
    macros.update({
        "SpecBestAlpha": sig(lookup(theory, "alpha", **at)) if at else NONE,
        "SpecBestCostRatio": sig(lookup(theory, "cost_ratio", **at)) if at else NONE,
        "SpecBestPredicted": sig(lookup(theory, "predicted", **at)) if at else NONE,
    })
    return macros


def theory_gap(theory: pd.DataFrame, predicted: str) -> pd.Series:
    """Measured over a prediction column of the theory table, where both are finite."""
    if not len(theory) or not {"measured", predicted} <= set(theory.columns):
        return pd.Series(dtype=float)
    ok = theory[np.isfinite(theory[predicted]) & (theory[predicted] > 0)]
    return (ok["measured"] / ok[predicted]).dropna()


def spec_result_macros(t: dict[str, pd.DataFrame], settings: dict) -> dict[str, str]:
    """Theory gap, verification parallelism per backend, and the HF assisted peer."""
    theory, parallelism, hf = t["theory"], t["parallelism"], t["hf"]
    gap, priced = theory_gap(theory, "predicted"), theory_gap(theory, "predicted_verify")
    cost = theory["verify_cost"].dropna() if "verify_cost" in theory else pd.Series(dtype=float)
    macros = {"SpecTheoryGap": sig(gap.median()) if len(gap) else NONE,
              "SpecTheoryGapMin": sig(gap.min()) if len(gap) else NONE,
              "SpecTheoryGapMax": sig(gap.max()) if len(gap) else NONE,
              "SpecTheoryPoints": str(len(gap)),
              "SpecVerifyCostMin": sig(cost.min()) if len(cost) else NONE,
              "SpecVerifyCostMax": sig(cost.max()) if len(cost) else NONE,
              "SpecTheoryGapVerify": sig(priced.median()) if len(priced) else NONE,
              "SpecTheoryGapVerifyMin": sig(priced.min()) if len(priced) else NONE,
              "SpecTheoryGapVerifyMax": sig(priced.max()) if len(priced) else NONE}

    pair = best_pair(t["speedup"])
    target = requested_pairs(settings).get(pair, {}).get("target") if pair else None
    summary = []
    for backend in tables.BACKEND_ORDER:
        row = parallel_row(parallelism, backend, target)
        if row is not None:
            k = int(row["k"])
            summary.append(f"{label(backend)} {sig(row['ratio'])}\\x{{}} "
                           f"{ci(row['ci_low'], row['ci_high'])} at $K={k}$ (serial: {k + 1})")
    macros["SpecParallelSummary"] = "; ".join(summary) or NONE

    ratio = hf.dropna(subset=["ours_over_hf"]) if "ours_over_hf" in hf else hf.iloc[0:0]
    macros["SpecHfNumPairs"] = str(ratio["pair"].nunique()) if len(ratio) else "0"
    macros["SpecHfPairs"] = human_list([tt(p) for p in spec_pairs(ratio)])
    for name, pick in (("Min", "idxmin"), ("Max", "idxmax")):
        row = ratio.loc[getattr(ratio["ours_over_hf"], pick)()] if len(ratio) else None
        macros.update({
            f"SpecHfOver{name}": sig(row["ours_over_hf"]) if row is not None else NONE,
            f"SpecHf{name}CI": ci(row["ci_low"], row["ci_high"]) if row is not None else NONE,
            f"SpecHf{name}Pair": tt(row["pair"]) if row is not None else NONE,
            f"SpecHf{name}K": str(int(row["k"])) if row is not None else NONE,
        })
    for name, col in (("Ours", "agree_speculative"), ("Hf", "agree_hf_assisted")):
        values = hf[col].dropna() if col in hf else pd.Series(dtype=float)
        macros[f"SpecAgree{name}"] = percent(values.min()) if len(values) else NONE
    return macros


def spec_model_macros(models: pd.DataFrame, settings: dict, pair: str | None) -> dict[str, str]:
    target, draft = headline_models(settings, pair)
    sha = model_field(models, draft, "corpus_sha256") or model_field(models, target,
                                                                     "corpus_sha256")
    nbytes = model_field(models, target, "corpus_bytes")
    return {
        "SpecTarget": tt(target) if target else NONE, "SpecDraft": tt(draft) if draft else NONE,
        "SpecTargetParams": num(models, target, "parameters", millions),
        "SpecDraftParams": num(models, draft, "parameters", millions),
        "SpecTargetHeldoutLoss": num(models, target, "heldout_loss"),
        "SpecDraftHeldoutLoss": num(models, draft, "heldout_loss"),
        "SpecBeta": num(models, draft, "beta"),
        "SpecDraftGreedyAgreement": num(models, draft, "greedy_agreement", percent),
        "SpecCorpusHash": tt(str(sha)[:12]) if isinstance(sha, str) and sha else NONE,
        "SpecCorpusMiB": f"{sig(float(nbytes) / 2**20)}~MiB" if finite(nbytes) else NONE,
        "SpecCorpusPython": tex_escape(model_field(models, target, "python") or NONE),
    }


def millions(n) -> str:
    return f"{sig(float(n) / 1e6)}M"


def headline_models(settings: dict, pair: str | None) -> tuple[str | None, str | None]:
    """(target, draft) of the best pair, else of the first pair the configuration lists."""
    pairs = requested_pairs(settings)
    spec = pairs.get(pair) or next(iter(pairs.values()), {})
    return spec.get("target"), spec.get("draft")


def trained_pair(models: pd.DataFrame, settings: dict, pair: str | None) -> bool:
    return all(r and model_field(models, r, "source") == "train"
               for r in headline_models(settings, pair))


def init_pair_models(models: pd.DataFrame, settings: dict) -> list[str]:
    """Models with random weights (`init`) that a requested pair drafts or verifies with."""
    named = dict.fromkeys(m for p in requested_pairs(settings).values()
                          for m in (p.get("draft"), p.get("target")) if m)
    return [m for m in named if model_field(models, m, "source") == "init"]


def init_pairs(t: dict[str, pd.DataFrame], models: pd.DataFrame, settings: dict,
               env: pd.DataFrame) -> list[str]:
    """Pairs with a result whose draft or target has random weights (`init`)."""
    init = set(init_pair_models(models, settings))
    requested, skipped = requested_pairs(settings), skipped_pairs(settings, t["speedup"], env)
    return [p for p in pair_order(settings, t["speedup"]) if p not in skipped
            and init & {requested.get(p, {}).get("draft"), requested.get(p, {}).get("target")}]


def distilled_pair(models: pd.DataFrame, settings: dict, pair: str | None) -> bool:
    """The draft names the target as its teacher."""
    target, draft = headline_models(settings, pair)
    teacher = model_field(models, draft, "teacher") if draft else None
    if teacher is None and draft:
        teacher = settings.get("models", {}).get(draft, {}).get("teacher")
    return bool(target) and teacher == target


def selected_best(selection: pd.DataFrame) -> str:
    """The quoted best, chosen on one half of the processes and estimated on the other
    (`decodelab.analysis.selection`); the naive maximum of medians is quoted only for contrast."""
    rows = selection[selection["claim"] == "speculative_best"] if len(selection) else selection
    return finding(rows.iloc[0] if len(rows) else None)


def speculative_macros(t: dict[str, pd.DataFrame] | None, models: pd.DataFrame, settings: dict,
                       env: pd.DataFrame, selection: pd.DataFrame | None = None
                       ) -> tuple[dict[str, str], dict[str, bool]]:
    """Every speculative macro, '--' without the stage, so the paper compiles either way."""
    t = t or no_rows()
    pair = best_pair(t["speedup"])
    macros = {**seed.speculative_claims(), **spec_settings_macros(settings),
              **spec_pair_macros(t, settings, env), **spec_result_macros(t, settings),
              **spec_model_macros(models, settings, pair),
              "SpecSelBest": selected_best(pd.DataFrame() if selection is None else selection),
              "SpecInitModels": human_list([tt(m) for m in init_pair_models(models, settings)]),
              "SpecInitPairs": human_list([tt(p) for p in init_pairs(t, models, settings, env)])}
    hf = t["hf"]
    flags = {
        "SpecParallelRan": len(t["parallelism"]) > 0,
        "SpecFloorRan": bool("over_floor" in t["floor"] and t["floor"]["over_floor"].notna().any()),
        "SpecHfRan": bool("ours_over_hf" in hf and hf["ours_over_hf"].notna().any()),
        "SpecHfRequested": bool(spec_settings(settings).get("hf_assisted")),
        "SpecAnySkipped": macros["SpecNumPairsSkipped"] != "0",
        "SpecTrainedPair": trained_pair(models, settings, pair),
        "SpecDraftDistilled": distilled_pair(models, settings, pair),
        "SpecBestPipelined": requested_pairs(settings).get(pair, {}).get("engine") == "pipelined",
        "SpecInitPair": bool(init_pair_models(models, settings)),
        "SpecInitRows": macros["SpecInitPairs"] != "none",
    }
    return macros, flags


def spec_pairs_table(t: dict[str, pd.DataFrame] | None, settings: dict, env: pd.DataFrame,
                     confidence: str) -> str:
    speedup = t["speedup"] if t else pd.DataFrame()
    acceptance = t["acceptance"] if t else pd.DataFrame()
    best = best_per_pair_mode(speedup)
    skipped = skipped_pairs(settings, speedup, env)
    k1 = first_k(acceptance)
    rows = []
    for pair in pair_order(settings, speedup):
        draft, target = pair_devices(settings, pair)
        if pair in skipped:
            rows.append([tt(pair), draft, target,
                         f"\\multicolumn{{8}}{{l}}{{\\emph{{{skipped[pair]}}}}}", "skipped"])
            continue
        for i, mode in enumerate(spec_modes(speedup[speedup["pair"] == pair])):
            row = best[(best["pair"] == pair) & (best["mode"] == mode)]
            row = row.iloc[0] if len(row) else None
            k = int(row["k"]) if row is not None else None
            first = first_k(acceptance, pair, mode)
            rows.append([tt(pair) if i == 0 else "", draft if i == 0 else "",
                         target if i == 0 else "", tex_escape(mode),
                         str(k) if k is not None else NONE,
                         sig(row["speedup"]) if row is not None else NONE,
                         ci(row["ci_low"], row["ci_high"]) if row is not None else NONE,
                         *[percent(lookup(acceptance, column, pair=pair, mode=mode, k=at))
                           if at is not None else NONE
                           for column in ("alpha", "proposal_acceptance") for at in (first, k)],
                         "ran" if i == 0 else ""])
    first = f"$K={k1}$" if k1 is not None else "first $K$"
    header = [
        r" & \multicolumn{2}{c}{Device} & & \multicolumn{3}{c}{Best speedup}"
        r" & \multicolumn{2}{c}{Per-token $\alpha$} & \multicolumn{2}{c}{Accepted / proposed}"
        r" & \\",
        r"\cmidrule(lr){2-3} \cmidrule(lr){5-7} \cmidrule(lr){8-9} \cmidrule(lr){10-11}",
        f"Pair & draft & target & Mode & $K$ & speedup & {confidence} CI & at {first} & "
        f"at best $K$ & at {first} & at best $K$ & Status \\\\",
    ]
    return tabular("@{}llllrrcrrrrl@{}", header, rows, "no draft/target pair in this build")


def spec_hf_table(t: dict[str, pd.DataFrame] | None, confidence: str) -> str:
    hf = t["hf"] if t else pd.DataFrame()
    rows = []
    for pair in spec_pairs(hf):
        g = hf[hf["pair"] == pair]
        ratio = g.dropna(subset=["ours_over_hf"]) if "ours_over_hf" in g else g.iloc[0:0]
        agree = [percent(g[c].min()) if c in g and g[c].notna().any() else NONE
                 for c in ("agree_speculative", "agree_hf_assisted")]
        if not len(ratio):
            rows.append([tt(pair), str(g["k"].nunique()), *[NONE] * 7, *agree])
            continue
        lo = ratio.loc[ratio["ours_over_hf"].idxmin()]
        hi = ratio.loc[ratio["ours_over_hf"].idxmax()]
        rows.append([tt(pair), str(ratio["k"].nunique()),
                     sig(lo["ours_over_hf"]), ci(lo["ci_low"], lo["ci_high"]), str(int(lo["k"])),
                     sig(ratio["ours_over_hf"].median()),
                     sig(hi["ours_over_hf"]), ci(hi["ci_low"], hi["ci_high"]), str(int(hi["k"])),
                     *agree])
    header = [
        r" & & \multicolumn{3}{c}{Minimum} & Median & \multicolumn{3}{c}{Maximum}"
        r" & \multicolumn{2}{c}{Greedy agreement} \\",
        r"\cmidrule(lr){3-5} \cmidrule(lr){7-9} \cmidrule(lr){10-11}",
        f"Pair & $K$s & ratio & {confidence} CI & $K$ & ratio & ratio & {confidence} CI & $K$ & "
        r"ours & HF \\",
    ]
    return tabular("@{}lrrcrrrcrrr@{}", header, rows,
                   "no Hugging Face assisted run in this build (same-device pairs only)")


def floor_table(floor: pd.DataFrame) -> str:
    """Per pair and role: the model's greedy step alone, its bandwidth floor, the ratio."""
    rows = [[tt(r["pair"]), tex_escape(r["role"]), tt(r["model"]),
             tex_escape(f"{r['device']}, {r['engine']}"),
             sig(r["weight_bytes"] / 1e6), sig(r["bandwidth"] / 1e9), sig(r["step_s"] * 1e3),
             sig(r["floor_s"] * 1e3), f"{sig(r['over_floor'])}$\\times$"]
            for _, r in floor.iterrows()] if "over_floor" in floor else []
    header = [r"Pair & Role & Model & Device, engine & Weights (MB) & Copy (GB/s) & "
              r"Step (ms) & Floor (ms) & Step / floor \\"]
    return tabular("@{}llllrrrrr@{}", header, rows, "no bandwidth measured in this build")


def models_table(models: pd.DataFrame, settings: dict) -> str:
    specs = settings.get("models", {})
    names = [m for m in models["model"].astype(str)
             if model_field(models, m, "source") == "train"] if len(models) else []
    rows = []
    for m in names:
        spec = specs.get(m, {})
        layers = model_field(models, m, "n_layer") or spec.get("n_layer")
        width = model_field(models, m, "n_embd") or spec.get("n_embd")
        teacher = model_field(models, m, "teacher") or spec.get("teacher")
        rows.append([tt(m), tt(teacher) if teacher else NONE,
                     f"{int(layers)} $\\times$ {int(width)}" if finite(layers) and finite(width)
                     else NONE,
                     num(models, m, "parameters", millions), num(models, m, "train_loss"),
                     num(models, m, "heldout_loss"), num(models, m, "beta"),
                     num(models, m, "greedy_agreement", percent), num(models, m, "wall_s")])
    header = [r"Model & Teacher & Layers $\times$ width & Parameters & Train loss & "
              r"Held-out loss & $\beta$ & Greedy agreement & Wall (s) \\"]
    return tabular("@{}llrrrrrrr@{}", header, rows, "no model trained in this build")


def parts(stats_dir: Path, settings: dict) -> Section:
    t = read_speculative(stats_dir)
    env, models = tables.read(stats_dir, "environment"), read_models(stats_dir)
    macros, flags = speculative_macros(t, models, settings, env, read(stats_dir, "selection"))
    return stage("SpeculativeReady", t is not None, Section(macros, flags, {
        "tab_spec_pairs.tex": spec_pairs_table(t, settings, env, confidence(settings)),
        "tab_spec_hf.tex": spec_hf_table(t, confidence(settings)),
        "tab_spec_floor.tex": floor_table(t["floor"] if t else pd.DataFrame()),
        "tab_models.tex": models_table(models, settings)}))
