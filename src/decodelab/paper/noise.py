r"""Whether the machine was quiet, said first, and every quoted best without the winner's curse.

From the stability verdicts (stability_summary, stability: `decodelab.stability`) and the
selection table (`decodelab.selection`):

    \NoiseVerdict    the abstract's first sentences and the first claim: a noisy build names
                     the share of unstable configurations, its noisiest jobs and `make
                     remeasure`; a quiet one says so and how it was judged
    \NoiseJudgedBy   the limits of the verdicts, in words (the statistics section)
    \Sel...Finding   each quoted best (speculative, KV cache, largest ratio to the trend), as
                     chosen on one half of the processes and estimated on the other; one whose
                     interval includes 1 reads "no configuration distinguishable from 1x"

Results from before the verdicts (results/reference/, older imports) have neither table: the
text says the build carries no verdict and quotes no best.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import stability, tables
from ..config import Stability
from ..selection import MIN_PER_HALF
from .section import Section
from .tex import NONE, ci, finite, human_list, integer, percent, sig, tex_escape

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


def selection_macros(selection: pd.DataFrame) -> dict[str, str]:
    """A finding per claim; with several hosts the local one's (the merge writes it first)."""
    first = selection.drop_duplicates("claim") if len(selection) else selection
    rows = {r["claim"]: r for _, r in first.iterrows()}
    return {macro: finding(rows.get(claim)) for claim, macro in CLAIMS.items()}


def parts(stats_dir: Path, settings: dict) -> Section:
    summary, jobs, selection = (read(stats_dir, name)
                                for name in ("stability_summary", "stability", "selection"))
    return Section({"NoiseVerdict": verdict(summary, jobs),
                    "NoiseJudgedBy": judged_by(summary, settings),
                    "SelMinPerHalf": str(MIN_PER_HALF), "SelMinProcesses": str(2 * MIN_PER_HALF),
                    **selection_macros(selection)},
                   {})
