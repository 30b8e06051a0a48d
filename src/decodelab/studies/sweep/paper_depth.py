r"""Regimes in depth (rule regime_depth): spikes per family, prefill against decode, variance
between processes, memory correlation, change points, step-ups, KV-cache speedup at spikes.

    generated/tab_regime_depth.tex  per backend and family: spikes, phase, variance share,
                                    change points

Until the rule has run every macro reads '--' and every flag is false (\RegimeDepthReady
among them); the placeholders are what the section builds on the tables without rows.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.analysis import changepoints, regimes, variance
from decodelab.core import tables
from decodelab.report.section import Section, placeholders, stage
from decodelab.report.tex import (
    NONE,
    family_label,
    finite,
    human_list,
    integer,
    label,
    percent,
    plain,
    sig,
    tabular,
    tex_escape,
)
from decodelab.studies.sweep import collapse, memory, onsets, phases
from decodelab.studies.sweep.paper import cache_on

COLUMNS = {  # the rule's tables that the paper reads -> the columns the rule writes
    "summary": regimes.SUMMARY_COLUMNS, "phases": phases.COLUMNS, "variance": variance.COLUMNS,
    "variance_summary": variance.SUMMARY_COLUMNS, "memory": memory.COLUMNS,
    "changepoint_curves": changepoints.CURVE_COLUMNS, "agreement": changepoints.AGREEMENT_COLUMNS,
    "kv_collapse": collapse.COLUMNS, "onsets": onsets.COLUMNS,
}
MEMORY_NAMES = {"mem_cuda_peak_bytes": "CUDA allocator peak",
                "mem_mps_current_bytes": "MPS allocator (current)",
                "mem_mps_driver_bytes": "MPS driver", "rss_bytes": "process RSS"}


def phase_depth_macros(phases: pd.DataFrame) -> tuple[dict[str, str], dict[str, bool]]:
    spikes = phases[phases["scope"] == "spike"]
    pooled = phases[phases["scope"] == "backend"]
    decisions = spikes["decision"].astype(str)
    on = cache_on(pooled)
    tested = pooled[pooled["spikes"] > 0]
    top = tested.loc[tested["spikes"].idxmax()] if len(tested) else None
    none_flagged = [label(b) for b in tables.ordered_backends(on[on["spikes"] == 0]["backend"])]
    macros = {
        "PhaseNumSpikes": integer(len(spikes)),
        "PhaseNumDecode": integer(int(decisions.eq("decode").sum())),
        "PhaseNumPrefill": integer(int(decisions.eq("prefill").sum())),
        "PhaseNumUndecided": integer(int(decisions.str.startswith("undecided").sum())),
        "PhaseDecodeShare": (percent(spikes["decode_share"].median())
                             if spikes["decode_share"].notna().any() else NONE),
        "PhaseBackend": label(top["backend"]) if top is not None else NONE,
        "PhaseBackendSpikes": integer(top["spikes"]) if top is not None else NONE,
        "PhaseBackendDecision": tex_escape(top["decision"]) if top is not None else NONE,
        "PhaseBackendP": sig(top["p_decode"]) if top is not None else NONE,
        "PhaseNoSpikeBackends": human_list(none_flagged),
    }
    return macros, {"PhaseTestApplies": len(spikes) > 0}


def variance_depth_macros(variance: pd.DataFrame, summary: pd.DataFrame) -> dict[str, str]:
    on = cache_on(variance)
    total = on[on["metric"] == "total_s"]
    ok = total[total["status"].astype(str).str.startswith("ok")]
    share = {}
    for metric in ("total_s", "prefill_s", "decode_s"):
        rows = on[(on["metric"] == metric) & on["status"].astype(str).str.startswith("ok")]
        b, w = rows["var_between"].mean(), rows["var_within"].mean()
        share[metric] = b / (b + w) if len(rows) and b + w > 0 else None
    groups = cache_on(summary)
    groups = groups[groups["metric"] == "total_s"].dropna(subset=["share_pooled"])
    lo = groups.loc[groups["share_pooled"].idxmin()] if len(groups) else None
    hi = groups.loc[groups["share_pooled"].idxmax()] if len(groups) else None
    where = lambda r: f"{label(r['backend'])}, {family_label(r['family'])}"  # noqa: E731
    not_separable = total[~total["status"].astype(str).str.startswith("ok")]
    return {
        "VarNumConfigs": integer(len(total)),
        "VarNumSeparable": integer(len(ok)),
        "VarNumNotSeparable": integer(len(not_separable)),
        "VarNumSignificant": integer(int((ok["p_value"] < float(
            summary["alpha"].iloc[0] if len(summary) else 0.05)).sum())),
        "VarShareTotal": percent(share["total_s"]),
        "VarSharePrefill": percent(share["prefill_s"]),
        "VarShareDecode": percent(share["decode_s"]),
        "VarShareMin": percent(lo["share_pooled"]) if lo is not None else NONE,
        "VarShareMinWhere": where(lo) if lo is not None else NONE,
        "VarShareMax": percent(hi["share_pooled"]) if hi is not None else NONE,
        "VarShareMaxWhere": where(hi) if hi is not None else NONE,
    }


def memory_depth_macros(memory: pd.DataFrame,
                        alpha: float) -> tuple[dict[str, str], dict[str, bool]]:
    ok = memory[memory["status"] == "ok"].dropna(subset=["r2"])
    best = ok.loc[ok["r2"].idxmax()] if len(ok) else None
    na = memory[memory["status"] != "ok"]
    na_text = "; ".join(
        f"{label(b)}: {human_list([MEMORY_NAMES.get(c, tex_escape(c)) for c in g['column']])}"
        for b, g in na.groupby("backend", sort=False)) or "none"
    return {
        "MemBestColumn": MEMORY_NAMES.get(best["column"], NONE) if best is not None else NONE,
        "MemBestBackend": label(best["backend"]) if best is not None else NONE,
        "MemBestRSquared": percent(best["r2"]) if best is not None else NONE,
        "MemBestRho": sig(best["rho"], 2) if best is not None else NONE,
        "MemBestP": sig(best["p_value"], 2) if best is not None else NONE,
        "MemBestConfigs": integer(best["configs"]) if best is not None else NONE,
        "MemBestRhoGivenBudget": sig(best["rho_given_budget"], 2) if best is not None else NONE,
        "MemBestPGivenBudget": sig(best["p_given_budget"], 2) if best is not None else NONE,
        "MemNumSignificant": integer(int((ok["p_value"] < alpha).sum())),
        "MemNumTested": integer(len(ok)),
        "MemNotApplicable": na_text,
    }, {"MemoryApplies": best is not None}


def changepoint_depth_macros(curves: pd.DataFrame, agreement: pd.DataFrame,
                             settings: dict) -> tuple[dict[str, str], dict[str, bool]]:
    cp = settings.get("regimes", {}).get("changepoints", {})
    model = cp.get("model")
    macros = {
        "ChgModel": {"linear": "piecewise linear", "constant": "piecewise constant"}.get(
            model, tex_escape(model or NONE)),
        "ChgPenalty": plain(cp.get("penalty")),
        "ChgMinSize": str(cp.get("min_size", NONE)),
        "ChgNoiseFloor": percent(cp["noise_floor"], plain) if "noise_floor" in cp else NONE,
        "ChgNumCurves": integer(len(curves)),
        "ChgNumChangePoints": integer(int(curves["changepoints"].sum())) if len(curves) else "0",
        "ChgNumCurvesWith": integer(int((curves["changepoints"] > 0).sum())) if len(curves)
        else "0",
        "ChgNumSpikes": integer(int(agreement["spikes"].sum())) if len(agreement) else "0",
        "ChgNumCoinciding": integer(int(agreement["spikes_coinciding"].sum()))
        if len(agreement) else "0",
        "ChgNumAtSpikes": integer(int(agreement["changepoints_at_spikes"].sum()))
        if len(agreement) else "0",
    }
    return macros, {"AnyChangePoints": bool(len(curves) and curves["changepoints"].sum() > 0)}


def onset_depth_macros(onsets: pd.DataFrame,
                       settings: dict) -> tuple[dict[str, str], dict[str, bool]]:
    """Step-ups inside cache-on runs: how many, from which steps, where."""
    cfg = settings.get("regimes", {}).get("onsets", {})
    up = onsets[onsets["onset"] >= 0] if len(onsets) else onsets
    where = (up.groupby(["backend", "family"]).size().reset_index(name="n")
             if len(up) else pd.DataFrame())
    macros = {
        "OnsetFactor": plain(cfg.get("factor")), "OnsetBaseline": str(cfg.get("baseline", NONE)),
        "OnsetRun": str(cfg.get("run", NONE)), "OnsetTested": integer(len(onsets)),
        "OnsetRuns": integer(len(up)),
        "OnsetSteps": human_list([str(int(x)) for x in sorted(up["onset"].unique())],
                                 empty=NONE) if len(up) else NONE,
        "OnsetWhere": human_list([f"{label(r['backend'])} {family_label(r['family'])} ({r['n']})"
                                  for _, r in where.iterrows()], empty=NONE),
        "OnsetStepUp": sig(up["step_up"].median()) if len(up) else NONE,
    }
    none = pd.Series(dtype=float)  # rows from before the harness timed launches
    launch, launch_cpu = (up.get(col, none) for col in ("launch_up", "launch_cpu_up"))
    macros |= {"OnsetLaunchUp": sig(launch.median()), "OnsetLaunchCpuUp": sig(launch_cpu.median())}
    return macros, {"AnyOnsets": bool(len(up)), "OnsetHasLaunch": bool(launch.notna().any())}


def collapse_depth_macros(kvc: pd.DataFrame) -> tuple[dict[str, str], dict[str, bool]]:
    spikes = kvc[kvc["scope"] == "spike"]
    pooled = kvc[kvc["scope"] == "backend"]
    tested = pooled[pooled["spikes"] > 0]
    top = tested.loc[tested["spikes"].idxmax()] if len(tested) else None
    return {
        "KvcNumSpikes": integer(len(spikes)),
        "KvcNumCollapse": integer(int(spikes["decision"].eq("collapse").sum())),
        "KvcSpeedupRatio": sig(spikes["speedup_ratio"].median()) if len(spikes) else NONE,
        "KvcBackend": label(top["backend"]) if top is not None else NONE,
        "KvcBackendDecision": tex_escape(top["decision"]) if top is not None else NONE,
        "KvcBackendP": sig(top["p_value"], 2) if top is not None else NONE,
        "KvcControlRatio": (sig(pooled["control_ratio"].median())
                            if pooled["control_ratio"].notna().any() else NONE),
    }, {"KvCollapseApplies": len(spikes) > 0}


def regime_depth_macros(t: dict[str, pd.DataFrame],
                        settings: dict) -> tuple[dict[str, str], dict[str, bool]]:
    """Macros and flags of the regimes-in-depth subsection from the rule's tables."""
    phase_m, phase_f = phase_depth_macros(t["phases"])
    mem_m, mem_f = memory_depth_macros(t["memory"],
                                       float(settings.get("regimes", {}).get("alpha", 0.05)))
    chg_m, chg_f = changepoint_depth_macros(t["changepoint_curves"], t["agreement"], settings)
    kvc_m, kvc_f = collapse_depth_macros(t["kv_collapse"])
    ons_m, ons_f = onset_depth_macros(t["onsets"], settings)
    macros = {**phase_m, **variance_depth_macros(t["variance"], t["variance_summary"]),
              **mem_m, **chg_m, **kvc_m, **ons_m}
    return macros, {**phase_f, **mem_f, **chg_f, **kvc_f, **ons_f}


def phase_cell(spikes: pd.DataFrame) -> str:
    if not len(spikes):
        return "n/a"
    d = spikes["decision"].astype(str)
    return f"{int(d.eq('decode').sum())} / {int(d.eq('prefill').sum())} / " \
           f"{int(d.str.startswith('undecided').sum())}"


def regime_depth_table(t: dict[str, pd.DataFrame] | None) -> str:
    """Per backend and family, cache-on sweep: spikes, phase, variance share, change points."""
    rows = []
    if t is not None:
        summary = cache_on(t["summary"])
        var = cache_on(t["variance_summary"])
        var = var[var["metric"] == "total_s"]
        spikes = cache_on(t["phases"][t["phases"]["scope"] == "spike"])
        curves = cache_on(t["changepoint_curves"])
        rank = {b: i for i, b in enumerate(tables.BACKEND_ORDER)}
        summary = summary.assign(_r=summary["backend"].map(lambda b: rank.get(b, len(rank))))
        for _, r in summary.sort_values(["_r", "backend", "family", "dtype"]).iterrows():
            def pick(df: pd.DataFrame, r=r) -> pd.DataFrame:
                return df[(df["backend"] == r["backend"]) & (df["family"] == r["family"])
                          & (df["dtype"] == r["dtype"])]
            v = pick(var)
            share = (f"{sig(v['share_pooled'].iloc[0], 2)} "
                     f"[{sig(v['share_q25'].iloc[0], 2)}, {sig(v['share_q75'].iloc[0], 2)}]"
                     if len(v) and finite(v["share_pooled"].iloc[0]) else NONE)
            c = pick(curves)
            rows.append([label(r["backend"]), family_label(r["family"]),
                         f"\\texttt{{{tex_escape(r['dtype'])}}}", integer(r["configs"]),
                         integer(r["spikes"]), sig(r["max_ratio"]), phase_cell(pick(spikes)),
                         share, integer(c["changepoints"].sum()) if len(c) else NONE])
    header = [
        r" & & & & & Largest & Phase & Between-process & Change \\",
        r"Backend & Family & dtype & Budgets & Spikes & ratio & dec.\,/\,pre.\,/\,und. & "
        r"share [IQR] & points \\",
    ]
    return tabular("@{}lllrrrcll@{}", header, rows, "no regime analysis in depth in this build")


def read_regime_depth(stats_dir: Path) -> dict[str, pd.DataFrame] | None:
    """The rule's tables that the paper reads, or None when the rule has not run."""
    return tables.read_group(stats_dir, "regime_depth", keys=COLUMNS)


def no_rows() -> dict[str, pd.DataFrame]:
    return {key: pd.DataFrame(columns=columns) for key, columns in COLUMNS.items()}


def parts(stats_dir: Path, settings: dict) -> Section:
    t = read_regime_depth(stats_dir)
    section = Section(*regime_depth_macros(t if t is not None else no_rows(), settings),
                      {"tab_regime_depth.tex": regime_depth_table(t)})
    return stage("RegimeDepthReady", t is not None, section if t is not None
                 else placeholders(section))
