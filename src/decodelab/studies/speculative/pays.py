r"""Where speculative decoding pays: the committed reference whose pairs are fastest, read from
the reference comparison (`reference.compare`), quoted whether or not this build measured it,
beside this build's own pairs.

    generated/tab_spec_pays.tex  per pair and mode of that reference: best speedup, the cost
                                 ratio c, per-token acceptance alpha, and measured over
                                 Leviathan's prediction, all at the best K

\SpecPaysReady is false while no reference has a speculative speedup.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.core import tables
from decodelab.report import reference as rf
from decodelab.report.section import Section, placeholders, stage
from decodelab.report.tex import NONE, human_list, sig, tabular, tex_escape, tt

COLUMNS = {"spec_speedup": "speedup", "spec_c": "c", "spec_alpha": "alpha", "spec_fit": "fit"}


def fastest_reference(comparison: pd.DataFrame) -> pd.DataFrame:
    """The rows (pair, mode, models and COLUMNS) of the reference with the largest speedup."""
    comparison = comparison.reindex(columns=rf.COLUMNS)
    names = comparison.loc[comparison["quantity"] == "spec_speedup", "reference"].unique()
    found = [rf.measured(comparison, COLUMNS, ["pair", "mode", "models"], name)
             for name in names]
    found = [rows for rows in found if len(rows)]
    if not found:
        return rf.measured(comparison, COLUMNS, ["pair", "mode", "models"], "")
    return max(found, key=lambda rows: rows["speedup"].max())


def pays_table(rows: pd.DataFrame) -> str:
    header = [r"Pair & Mode & Speedup & $c$ & $\alpha$ & Measured / predicted \\"]
    body = [[tt(r["pair"]), r["mode"], f"{sig(r['speedup'])}$\\times$", sig(r["c"]),
             sig(r["alpha"]), sig(r["fit"])] for _, r in rows.iterrows()]
    return tabular("@{}llrrrr@{}", header, body, "no reference with speculative rows")


def best_sentence(rows: pd.DataFrame, mode: str) -> str:
    of_mode = rows[rows["mode"] == mode]
    if not len(of_mode):
        return NONE
    best = of_mode.loc[of_mode["speedup"].idxmax()]
    return f"{sig(best['speedup'])}$\\times$ ({tt(best['pair'])})"


def models_sentence(models: str) -> str:
    """'draft:7609856,target:80114688' -> 'draft 7.61M and target 80.1M parameters'."""
    named = [m.rsplit(":", 1) for m in str(models).split(",") if ":" in m]
    sizes = [f"{tt(name)} {sig(float(n) / 1e6)}M" for name, n in named]
    return human_list(sizes, empty=NONE) + " parameters" * bool(sizes)


def built(rows: pd.DataFrame) -> Section:
    rows = rows.sort_values(["pair", "mode"])
    ran = bool(len(rows))
    models = rows["models"].iloc[0] if ran else ""
    macros = {
        "SpecPaysRef": tt(rows["reference"].iloc[0]) if ran else NONE,
        "SpecPaysDevice": tex_escape(rows["reference_device"].iloc[0]) if ran else NONE,
        "SpecPaysModels": models_sentence(models),
        "SpecPaysGreedy": best_sentence(rows, "greedy"),
        "SpecPaysSampled": best_sentence(rows, "sampled"),
    }
    return Section(macros, {}, {"tab_spec_pays.tex": pays_table(rows)})


def parts(stats_dir: Path, settings: dict) -> Section:
    rows = fastest_reference(tables.read(stats_dir, "reference_comparison"))
    section = built(rows)
    return stage("SpecPaysReady", bool(len(rows)), section if len(rows) else placeholders(section))
