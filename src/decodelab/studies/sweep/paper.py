"""Decode latency, the KV-cache speedup and the regime (latency-spike) rule's findings.

    generated/tab_kv.tex       KV-cache speedup range per backend x model
    generated/tab_regimes.tex  spikes flagged per backend x model, with phase attribution
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.core import tables
from decodelab.report.environment import backends_run
from decodelab.report.section import Section
from decodelab.report.settings import confidence
from decodelab.report.tex import (
    NONE,
    camel,
    ci,
    family_label,
    human_list,
    integer,
    label,
    ms,
    sig,
    tabular,
    tex_escape,
)


def cache_on(df: pd.DataFrame) -> pd.DataFrame:
    """The cache-on sweep rows (the experiment the headline numbers come from)."""
    return df[(df["experiment"] == "sweep") & df["use_cache"]] if len(df) else df


def cache_off(df: pd.DataFrame) -> pd.DataFrame:
    return df[~df["use_cache"]]


def pairs(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(backend, model) pairs in backend order, then model order."""
    if not len(df):
        return []
    rank = {b: i for i, b in enumerate(tables.BACKEND_ORDER)}
    keys = df[["backend", "model"]].drop_duplicates().itertuples(index=False, name=None)
    return sorted(keys, key=lambda k: (rank.get(k[0], len(rank)), k[0], k[1]))


def select(df: pd.DataFrame, backend: str, model: str) -> pd.DataFrame:
    return df[(df["backend"] == backend) & (df["model"] == model)]


def phase_ratios(regimes: pd.DataFrame, flagged: pd.DataFrame, metric: str) -> pd.Series:
    """ratio_median of `metric` at the configurations flagged on total latency."""
    keys = ["experiment", "backend", "model", "dtype", "prompt_len", "use_cache", "budget"]
    phase = regimes[regimes["metric"] == metric][keys + ["ratio_median"]]
    return flagged[keys].merge(phase, on=keys, how="left")["ratio_median"]


# -----------------------------------------------------------------------------
# macros

def latency_macros(latency: pd.DataFrame) -> dict[str, str]:
    on = cache_on(latency)
    per_token = on[on["metric"] == "decode_per_token_s"]["median"]
    prefill = on[on["metric"] == "prefill_s"]["median"]
    families = sorted(latency["family"].unique()) if len(latency) else []
    return {
        "NumFamilies": str(len(families)),
        "Families": human_list([family_label(f) for f in families]),
        "ProcessesMin": integer(latency["n"].min()) if len(latency) else NONE,
        "DecodeTokenMsMin": ms(per_token.min()) if len(per_token) else NONE,
        "DecodeTokenMsMax": ms(per_token.max()) if len(per_token) else NONE,
        "PrefillMsMin": ms(prefill.min()) if len(prefill) else NONE,
        "PrefillMsMax": ms(prefill.max()) if len(prefill) else NONE,
    }


def regime_macros(regimes: pd.DataFrame, ran: list[str]) -> tuple[dict[str, str], dict[str, bool]]:
    """Spikes flagged; those in configurations not judged stable (`stable`,
    decodelab.analysis.stability)
    are counted apart and never in the per-backend counts that the claims quote."""
    on = cache_on(regimes)
    total = on[on["metric"] == "total_s"]
    flagged = total[total["spike"]]
    claimed = flagged[flagged["stable"]] if len(flagged) else flagged
    off = cache_off(regimes)
    off_flagged = off[(off["metric"] == "total_s") & off["spike"]] if len(off) else off
    macros = {
        "NumRegimePoints": integer(len(total)),
        "NumSpikes": integer(len(flagged)),
        "NumSpikesUnstable": integer(len(flagged) - len(claimed)),
        "NumSpikesCacheOff": integer(int(off_flagged["stable"].sum()) if len(off_flagged) else 0),
        "NumSpikesCacheOffUnstable": integer(int((~off_flagged["stable"]).sum())
                                             if len(off_flagged) else 0),
    }
    for backend in tables.BACKEND_ORDER:
        n = int(claimed["backend"].eq(backend).sum())
        macros[f"NumSpikes{camel(backend)}"] = integer(n) if backend in ran else NONE
    by_backend = [f"{label(b)} {int(flagged['backend'].eq(b).sum())}" for b in ran]
    macros["SpikesByBackend"] = ", ".join(by_backend) or "none (no backend ran)"
    macros.update(extreme_macros("MaxTrend", total))
    macros.update(extreme_macros("MaxSpike", flagged))  # naive: the claims quote the selection
    top = flagged.sort_values("ratio_median").tail(1)
    macros["MaxSpikePrefillRatio"] = sig(phase_ratios(regimes, top, "prefill_s").max())
    macros["MaxSpikeDecodeRatio"] = sig(phase_ratios(regimes, top, "decode_s").max())
    return macros, {"AnySpikes": len(flagged) > 0,
                    "AnyUnstableSpikes": len(flagged) > len(claimed)}


def extreme_macros(prefix: str, rows: pd.DataFrame) -> dict[str, str]:
    """<prefix>Ratio, Budget, Backend, Model of the row with the largest ratio_median."""
    rows = rows.dropna(subset=["ratio_median"])
    if not len(rows):
        return {f"{prefix}{k}": NONE for k in ("Ratio", "Budget", "Backend", "Model")}
    top = rows.loc[rows["ratio_median"].idxmax()]
    return {f"{prefix}Ratio": sig(top["ratio_median"]), f"{prefix}Budget": str(int(top["budget"])),
            f"{prefix}Backend": label(top["backend"]),
            f"{prefix}Model": f"\\texttt{{{tex_escape(top['model'])}}}"}


def kv_macros(kv: pd.DataFrame) -> dict[str, str]:
    total = kv[kv["metric"] == "total_s"]
    decode = kv[kv["metric"] == "decode_s"]
    macros = {
        "KvNumConfigs": integer(len(total)),
        "KvSpeedupMedian": sig(total["speedup"].median()) if len(total) else NONE,
        "KvNumAboveOne": integer(int((total["ci_low"] > 1).sum())),
        "KvNumBelowOne": integer(int((total["ci_high"] < 1).sum())),
        "KvDecodeSpeedupMin": sig(decode["speedup"].min()) if len(decode) else NONE,
        "KvDecodeSpeedupMax": sig(decode["speedup"].max()) if len(decode) else NONE,
    }
    for name, pick in (("Min", "idxmin"), ("Max", "idxmax")):
        if not len(total):
            macros.update({f"KvSpeedup{name}": NONE, f"Kv{name}CI": NONE, f"Kv{name}Budget": NONE,
                           f"Kv{name}Backend": NONE, f"Kv{name}Model": NONE})
            continue
        row = total.loc[getattr(total["speedup"], pick)()]
        macros.update({
            f"KvSpeedup{name}": sig(row["speedup"]),
            f"Kv{name}CI": ci(row["ci_low"], row["ci_high"]),
            f"Kv{name}Budget": str(int(row["budget"])), f"Kv{name}Backend": label(row["backend"]),
            f"Kv{name}Model": f"\\texttt{{{tex_escape(row['model'])}}}",
        })
    return macros


# -----------------------------------------------------------------------------
# tables

def kv_table(kv: pd.DataFrame, confidence: str) -> str:
    total = kv[kv["metric"] == "total_s"]
    rows = []
    for backend, model in pairs(total):
        g = select(total, backend, model)
        lo, hi = g.loc[g["speedup"].idxmin()], g.loc[g["speedup"].idxmax()]
        rows.append([label(backend), f"\\texttt{{{tex_escape(model)}}}",
                     sig(lo["speedup"]), ci(lo["ci_low"], lo["ci_high"]), str(int(lo["budget"])),
                     sig(g["speedup"].median()),
                     sig(hi["speedup"]), ci(hi["ci_low"], hi["ci_high"]), str(int(hi["budget"])),
                     str(g["budget"].nunique())])
    header = [
        r" & & \multicolumn{3}{c}{Minimum} & Median & \multicolumn{3}{c}{Maximum} & \\",
        r"\cmidrule(lr){3-5} \cmidrule(lr){7-9}",
        f"Backend & Model & speedup & {confidence} CI & budget & speedup & speedup & "
        f"{confidence} CI & budget & budgets \\\\",
    ]
    return tabular("@{}llrcrrrcrr@{}", header, rows, "no KV-cache ablation in this build")


def regimes_table(regimes: pd.DataFrame) -> str:
    on, off = cache_on(regimes), cache_off(regimes)
    total, off_total = on[on["metric"] == "total_s"], off[off["metric"] == "total_s"]
    rows = []
    for backend, model in pairs(total):
        g, flagged = select(total, backend, model), select(total[total["spike"]], backend, model)
        g_off = select(off_total, backend, model)
        finite = g.dropna(subset=["ratio_median"])
        top = finite.loc[finite["ratio_median"].idxmax()] if len(finite) else None
        attribution = [sig(phase_ratios(regimes, flagged, m).median()) if len(flagged) else NONE
                       for m in ("prefill_s", "decode_s")]
        rows.append([label(backend), f"\\texttt{{{tex_escape(model)}}}",
                     str(g["budget"].nunique()), str(len(flagged)),
                     str(int(g_off["spike"].sum())) if len(g_off) else NONE,
                     sig(top["ratio_median"]) if top is not None else NONE,
                     str(int(top["budget"])) if top is not None else NONE, *attribution])
    header = [
        r" & & & \multicolumn{2}{c}{Spikes flagged} & \multicolumn{2}{c}{Largest ratio}"
        r" & \multicolumn{2}{c}{Ratio at spikes} \\",
        r"\cmidrule(lr){4-5} \cmidrule(lr){6-7} \cmidrule(lr){8-9}",
        r"Backend & Model & Budgets & cache on & cache off & ratio & budget & prefill & decode \\",
    ]
    return tabular("@{}llrrrrrrr@{}", header, rows, "no regime analysis in this build")


def parts(stats_dir: Path, settings: dict) -> Section:
    latency, kv, regimes = (tables.read(stats_dir, name)
                            for name in ("latency", "kv_speedup", "regimes"))
    reg_macros, reg_flags = regime_macros(regimes, backends_run(tables.read(stats_dir,
                                                                            "environment")))
    macros = {**latency_macros(latency), **reg_macros, **kv_macros(kv)}
    return Section(macros, reg_flags, {"tab_kv.tex": kv_table(kv, confidence(settings)),
                                       "tab_regimes.tex": regimes_table(regimes)})
