r"""Batched speculation without a shared schedule: per backend, batch size and context, the
throughput of every mode over batched autoregressive decoding, the verification overhead, and
the scheduler alone in the simulator, with intervals over runs (prompt sets x processes).

    generated/tab_batched.tex  per backend, context and batch size: autoregressive tokens/s,
                               each mode over it, non-synchronized over synchronized
                               self-speculation, refreshed over non-synchronized, the overhead,
                               the ceiling, the simulator's gain

The stage is optional: without rows in batched_throughput.csv \BatchedReady is false and the
macros read '--'. ASPIRE's own numbers are quoted (`seed.batched_claims`), never matched.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.core import tables
from decodelab.report import seed
from decodelab.report.section import Section, placeholders, stage
from decodelab.report.settings import confidence
from decodelab.report.tex import NONE, budget_list, ci, human_list, integer, label, sig, tabular

UNSYNC, SELF_SYNC, REFRESHED = "unsynchronized", "self_synchronized", "refreshed"
MODE_NAMES = {"self_synchronized": "synchronized self-speculation",
              "synchronized": "synchronized speculation with a draft model",
              "unsynchronized": "the non-synchronized batch",
              "refreshed": "the non-synchronized batch with a refresh layer"}


def span(x: pd.Series) -> str:
    return f"{sig(x.min())} to {sig(x.max())}" if len(x) else NONE


TIE = 1e-9  # a ratio of equal throughputs can land a rounding error above or below 1


def above(rows: pd.DataFrame, low: str = "ci_low") -> str:
    return f"{int((rows[low] > 1 + TIE).sum())} of {len(rows)}"


def below(rows: pd.DataFrame, high: str = "ci_high") -> str:
    return f"{int((rows[high] < 1 - TIE).sum())} of {len(rows)}"


def unsync_sentence(throughput: pd.DataFrame) -> str:
    rows = throughput[throughput["mode"] == UNSYNC]
    return (f"{span(rows['over_synchronized'])} times the throughput of synchronized "
            f"self-speculation at the same $K$ budget, its interval above 1 in "
            f"{above(rows, 'sync_ci_low')} cells")


def refresh_sentence(throughput: pd.DataFrame) -> str:
    rows = throughput[throughput["mode"] == REFRESHED]
    if not len(rows):
        return "no refresh layer was configured (config \\cmd{batched.refresh\\_layer})"
    plain = throughput[throughput["mode"] == UNSYNC]
    return (f"with a refresh layer (layer {integer(rows['refresh_layer'].max())}) the batch "
            f"reaches {span(rows['over_unsynchronized'])} times its throughput without one, "
            f"the interval above 1 in {above(rows, 'unsync_ci_low')} cells and below 1 in "
            f"{below(rows, 'unsync_ci_high')}; its drafts are accepted at "
            f"{span(rows['acceptance'])} against {span(plain['acceptance'])}")


def autoregressive_sentence(throughput: pd.DataFrame) -> str:
    parts = []
    for mode, name in MODE_NAMES.items():
        rows = throughput[throughput["mode"] == mode]
        if len(rows):
            parts.append(f"{name} {span(rows['speedup'])} (above 1 in {above(rows)} cells)")
    return human_list(parts, empty=NONE)


def overhead_sentence(costs: pd.DataFrame) -> str:
    """Per context: the overhead and ceiling at the smallest and the largest batch."""
    parts = []
    for context, g in costs.groupby("context"):
        small, large = g.loc[g["batch"].idxmin()], g.loc[g["batch"].idxmax()]
        parts.append(f"at $L={integer(context)}$ the overhead is {sig(small.overhead)} at "
                     f"$B={integer(small.batch)}$ and {sig(large.overhead)} at "
                     f"$B={integer(large.batch)}$, the ceiling {sig(small.ceiling)} and "
                     f"{sig(large.ceiling)}")
    return human_list(parts, empty=NONE)


def simulator_sentence(simulator: pd.DataFrame) -> str:
    by = {name: g for name, g in simulator.groupby("scenario")}
    if not {"mixed", "alike"} <= set(by):
        return NONE
    text = (f"with acceptances that differ across requests the scheduler's gain over the best "
            f"fixed $K$ is {span(by['mixed']['gain'])} (interval above 1 in "
            f"{above(by['mixed'])} cells); with every request alike, the negative control, "
            f"{span(by['alike']['gain'])}")
    if "switching" in by:
        text += (f"; for requests whose acceptance switches, {span(by['switching']['gain'])} "
                 f"(its posterior never forgets)")
    return text


def batched_table(throughput: pd.DataFrame, costs: pd.DataFrame, simulator: pd.DataFrame,
                  level: str) -> str:
    spec = "@{}lrrrrrrlrrrr@{}"
    header = [r"Backend & $L$ & $B$ & AR tok/s & self-sync & sync & non-sync & "
              rf"non-sync / self-sync ({level} CI) & refresh & overhead & ceiling & "
              r"sim. gain \\"]
    if not len(throughput):
        return tabular(spec, header, [], "no batched runs in this build")
    keys = ["backend", "context", "batch"]
    by_mode = {mode: g.set_index(keys) for mode, g in throughput.groupby("mode")}
    cost = costs.set_index(keys)
    mixed = simulator[simulator["scenario"] == "mixed"].set_index(keys)
    rows = []

    def mode(name, key, column="speedup"):
        return sig(by_mode[name].loc[key, column]) if name in by_mode else NONE

    for key in sorted(by_mode.get("autoregressive", pd.DataFrame()).index):
        unsync = by_mode.get(UNSYNC)
        over = (f"{sig(unsync.loc[key, 'over_synchronized'])} "
                f"{ci(unsync.loc[key, 'sync_ci_low'], unsync.loc[key, 'sync_ci_high'])}"
                if unsync is not None else NONE)
        rows.append([label(key[0]), integer(key[1]), integer(key[2]),
                     sig(by_mode["autoregressive"].loc[key, "tokens_per_s"]),
                     mode(SELF_SYNC, key), mode("synchronized", key), mode(UNSYNC, key), over,
                     mode(REFRESHED, key, "over_unsynchronized"),
                     sig(cost.loc[key, "overhead"]) if key in cost.index else NONE,
                     sig(cost.loc[key, "ceiling"]) if key in cost.index else NONE,
                     sig(mixed.loc[key, "gain"]) if key in mixed.index else NONE])
    return tabular(spec, header, rows, "no batched runs in this build")


def built(throughput: pd.DataFrame, costs: pd.DataFrame, simulator: pd.DataFrame,
          settings: dict) -> Section:
    ran = bool(len(throughput))
    macros = {
        "BatchedBackends": human_list([label(b) for b in sorted(set(throughput["backend"]))])
        if ran else NONE,
        "BatchedBatches": budget_list(throughput["batch"].unique()) if ran else NONE,
        "BatchedContexts": budget_list(throughput["context"].unique()) if ran else NONE,
        "BatchedK": integer(throughput["k"].max()) if ran else NONE,
        "BatchedRuns": integer(throughput["n"].max()) if ran else NONE,
        "BatchedUnsyncSentence": unsync_sentence(throughput) if ran else NONE,
        "BatchedArSentence": autoregressive_sentence(throughput) if ran else NONE,
        "BatchedRefreshSentence": refresh_sentence(throughput) if ran else NONE,
        "BatchedOverheadSentence": overhead_sentence(costs) if len(costs) else NONE,
        "BatchedSimulatorSentence": simulator_sentence(simulator) if len(simulator) else NONE,
    }
    return Section(macros, {}, {"tab_batched.tex": batched_table(
        throughput, costs, simulator, confidence(settings))})


def parts(stats_dir: Path, settings: dict) -> Section:
    t = tables.read_group(stats_dir, "batched")
    ran = bool(len(t["throughput"]))
    section = built(t["throughput"], t["costs"], t["simulator"], settings)
    shown = section if ran else placeholders(section)
    return stage("BatchedReady", ran, Section({**shown.macros, **seed.batched_claims()},
                                              shown.flags, shown.files))
