r"""Whether the machine was quiet, said first, and every quoted best without the winner's curse.

From the stability verdicts (stability_summary, stability: `decodelab.analysis.stability`) and the
selection table (`decodelab.analysis.selection`):

    \NoiseVerdict    the abstract's first sentences and the first claim: a noisy build names
                     the share of unstable configurations, its noisiest jobs and `make
                     remeasure`; a quiet one says so and how it was judged
    \NoiseJudgedBy   the limits of the verdicts, in words (the statistics section)
    \Sel...Finding   each quoted best (speculative, KV cache, largest ratio to the trend), as
                     chosen on one half of the processes and estimated on the other; one whose
                     interval includes 1 reads "no configuration distinguishable from 1x"
    \SelSpikePhaseFinding, \SelKvAtSpikeFinding
                     claims 4 and 6: the phases' ratios and the KV-cache speedup at that chosen
                     spike, on the other half; "not testable" without a spike distinguishable
                     from 1x (\ifSelSpikeFound)

Results from before the verdicts (results/reference/, older imports) have neither table: the
text says the build carries no verdict and quotes no best.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.analysis import stability
from decodelab.analysis.selection import MIN_PER_HALF
from decodelab.config.settings import Stability
from decodelab.core import tables
from decodelab.report.section import Section
from decodelab.report.tex import NONE, ci, finite, human_list, integer, percent, sig, tex_escape

NOISIEST = 3  # jobs named in the abstract
REMEASURE = "make remeasure"
CLAIMS = {"speculative_best": "SelSpecFinding", "kv_best": "SelKvFinding",
          "spike_largest": "SelSpikeFinding"}
NOT_SELECTED = "not measured in this build"


def read(stats_dir: Path, name: str) -> pd.DataFrame:
    """A table of this module; no rows when the build predates it (absent, or empty as the
    merge writes a table that no host has)."""
    try:
        return tables.read(stats_dir, name)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


# -----------------------------------------------------------------------------
# the verdict

def noisiest(jobs: pd.DataFrame) -> list[str]:
    """The noisiest jobs (most unstable configurations, by share) as '\\texttt{job} (12 of 36)'."""
    if not len(jobs):
        return []
    worst = jobs[jobs["unstable"] > 0].sort_values(["unstable_share", "job"],
                                                   ascending=[False, True]).head(NOISIEST)
    return [f"\\texttt{{{tex_escape(j.job, breakable=True)}}} ({integer(j.unstable)} of "
            f"{integer(j.configurations)})" for j in worst.itertuples()]


def limits_text(words: str) -> str:
    return tex_escape(words).replace(r"\textless{}=", r"$\le$")


def judged_by(summary: pd.DataFrame, settings: dict) -> str:
    """The verdicts' limits in words: the build's own, else those the settings ask for."""
    if len(summary):
        return limits_text(summary["judged_by"].iloc[0])
    limits = settings.get("stats", {}).get("stability")
    return limits_text(stability.judged_by(Stability.from_spec(limits), True)) if limits else NONE


def verdict(summary: pd.DataFrame, jobs: pd.DataFrame) -> str:
    if not len(summary):
        return ("This build carries no stability verdict (its results predate them), so none of "
                "its numbers was judged against the load of the machine.")
    row = summary.iloc[0]
    total, stable = int(row["configurations"]), int(row["stable"])
    unstable = total - stable
    if not total:
        return "This build measured no configuration, so there was no load to judge."
    if not row["noisy"]:
        return (f"This build was quiet: {integer(stable)} of {integer(total)} measured "
                f"configurations were stable, judged by {limits_text(row['judged_by'])}.")
    return (f"\\textbf{{This build was noisy:}} {percent(unstable / total)} of its "
            f"{integer(total)} measured configurations ({integer(unstable)}) were unstable, "
            f"most in {human_list(noisiest(jobs))}; their numbers are reported below but never "
            f"as claims. \\cmd{{{REMEASURE}}} re-measures only the noisy jobs.")


# -----------------------------------------------------------------------------
# the bests

def finding(row: pd.Series | None) -> str:
    """One quoted best: its configuration, where it was chosen and measured, and its value."""
    if row is None:
        return NOT_SELECTED
    naive = f"the largest median over all processes, {sig(row['naive'])}\\x, is not a finding"
    if not finite(row["estimate"]):
        return (f"no configuration distinguishable from 1\\x{{}} "
                f"({tex_escape(row['reason'])}; {naive})")
    measured = (f"{tex_escape(row['label'])} (chosen on {tex_escape(row['selected_on'])}, "
                f"measured on {tex_escape(row['estimated_on'])}): {sig(row['estimate'])}\\x{{}} "
                f"{ci(row['ci_low'], row['ci_high'])}")
    if row["distinguishable"]:
        return measured
    return f"no configuration distinguishable from 1\\x{{}} (the best, {measured}; {naive})"


def measured_value(row: pd.Series | None) -> str:
    """An estimate with its interval, said not distinguishable from 1x when its interval
    includes 1; what was missing when nothing was estimated."""
    if row is None:
        return NOT_SELECTED
    if not finite(row["estimate"]):
        return f"not estimated ({tex_escape(row['reason'])})"
    value = f"{sig(row['estimate'])}\\x{{}} {ci(row['ci_low'], row['ci_high'])}"
    return value if row["distinguishable"] else f"{value}, not distinguishable from 1\\x{{}}"


def spike_found(rows: dict) -> bool:
    """Whether the largest excursion above the local trend, chosen on one half, stands above
    its trend on the other: only then is there a spike whose phases and KV speedup to quote."""
    spike = rows.get("spike_largest")
    return spike is not None and bool(spike["distinguishable"]) and spike["estimate"] > 1


def at_spike(rows: dict) -> str:
    spike = rows["spike_largest"]
    return (f"At the largest excursion above the local trend, {tex_escape(spike['label'])} "
            f"(chosen on {tex_escape(spike['selected_on'])}, measured on "
            f"{tex_escape(spike['estimated_on'])}: total latency {measured_value(spike)})")


def spike_phases(rows: dict) -> str:
    """Claim 4: each phase's ratio to its own trend at the chosen spike, on the other half."""
    if not spike_found(rows):
        return f"Not testable here, no spike to attribute: {finding(rows.get('spike_largest'))}."
    return (f"{at_spike(rows)}, each phase over its own local trend: the decode phase "
            f"{measured_value(rows.get('spike_decode'))}, the prefill phase "
            f"{measured_value(rows.get('spike_prefill'))}.")


def kv_at_spike(rows: dict) -> str:
    """Claim 6: the KV-cache speedup at the chosen spike, on the ablation's other half."""
    if not spike_found(rows):
        return f"Not testable here without a spike: {finding(rows.get('spike_largest'))}."
    kv = rows.get("kv_at_spike")
    where = f" (on {tex_escape(kv['estimated_on'])} of the ablation)" if (
        kv is not None and kv["estimated_on"]) else ""
    return f"{at_spike(rows)}, the KV-cache speedup is {measured_value(kv)}{where}"


def selection_macros(selection: pd.DataFrame) -> tuple[dict[str, str], dict[str, bool]]:
    """A finding per claim; with several hosts the local one's (the merge writes it first)."""
    first = selection.drop_duplicates("claim") if len(selection) else selection
    rows = {r["claim"]: r for _, r in first.iterrows()}
    return ({**{macro: finding(rows.get(claim)) for claim, macro in CLAIMS.items()},
             "SelSpikePhaseFinding": spike_phases(rows), "SelKvAtSpikeFinding": kv_at_spike(rows)},
            {"SelSpikeFound": spike_found(rows)})


def parts(stats_dir: Path, settings: dict) -> Section:
    summary, jobs, selection = (read(stats_dir, name)
                                for name in ("stability_summary", "stability", "selection"))
    macros, flags = selection_macros(selection)
    return Section({"NoiseVerdict": verdict(summary, jobs),
                    "NoiseJudgedBy": judged_by(summary, settings),
                    "SelMinPerHalf": str(MIN_PER_HALF), "SelMinProcesses": str(2 * MIN_PER_HALF),
                    **macros},
                   flags)
