"""The best configuration without the winner's curse: chosen on one half of the processes and
estimated on the other.

The largest of many noisy medians overstates its configuration: with twenty configurations that
are all 1x, the best median speedup is above one in most builds. So the processes (the `repeat`
index of the raw runs, one OS process each) are split: the odd repeats choose the best, the even
repeats (the larger half) estimate it, with a percentile bootstrap over their processes,
expanded for their small number (`expanded`). The noise that made a configuration win is not in
the processes that measure it, so the estimate is unbiased and its interval keeps its coverage.
A best is `distinguishable` when its interval excludes 1.

Few processes (fewer than MIN_PER_HALF per half: the default config's 3, the paper profile's
5): the split is made inside every process instead, over its cells of identical configuration
(the prompts of the speculative study, the inner repeats of a sweep): the odd cells choose,
the even ones estimate, and the bootstrap resamples (process, cell) units. Its independence is
weaker, and the row says which split it used: cells of one process share that process's state,
so a configuration that ran slow all through one process is slow in both halves. What makes a
winner among configurations of equal truth is mostly noise of each measurement (a prompt's
acceptance luck, a hiccup during one decode), which the halves do not share; the synthetic
tests (tests/test_selection.py) plant a per-process factor as well, and the null still gives
"not distinguishable" in 95% of builds. The alternative, raising the default's processes to 8,
costs 5 more jobs of every sweep and of the speculative study. Fewer estimating units than
MIN_PER_HALF estimate nothing: the row says so and is not distinguishable.

    selection.csv  one row per quoted best: speculative_best (pair and K in the headline mode,
                   speedup over autoregressive decoding), kv_best (cache-off over cache-on total
                   latency), spike_largest (cache-on total latency over its local trend)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy import stats as st

from .config import Confidence
from .regimes import repeat_ratios
from .stats import GRID, METRICS, bootstrap_ci, median_ratio, per_process

# Processes per half, at least. A ratio of medians of three processes against three cannot be
# told from 1 at 95%: even the whole range of its bootstrap excludes 1 when every process of one
# arm is faster than every one of the other, 2 of the 20 orderings (10%) when nothing differs.
# Four against four: 2 of 70 (3%).
MIN_PER_HALF = 4
COLUMNS = ["claim", "label", "selected_on", "estimated_on", "estimate", "ci_low", "ci_high", "n",
           "distinguishable", "naive", "reason"]
KV_KEYS = ["backend", "model", "dtype", "prompt_len", "budget"]
REGIME_BY = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "use_cache"]


# -----------------------------------------------------------------------------
# the split and the estimate

def halves(repeats) -> tuple[list[int], list[int]]:
    """(choosing, estimating) repeats: the odd ones choose, the even ones (as many, or one more)
    estimate."""
    present = sorted({int(r) for r in repeats})
    return [r for r in present if r % 2], [r for r in present if r % 2 == 0]


def words(repeats: list[int]) -> str:
    return f"processes {', '.join(map(str, repeats))}" if repeats else "no process"


def cell_words(cells: list[int], cell: str, processes: int) -> str:
    return f"{cell}s {', '.join(map(str, cells))} of each of {processes} processes"


def by_process(rows: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """One row per process and configuration (the median over its cells)."""
    if "cell" not in rows:
        return rows
    return rows.groupby([*keys, "repeat"], as_index=False)[value].median()


def split(rows: pd.DataFrame, keys: list[str], value: str, cell: str
          ) -> tuple[pd.DataFrame, pd.DataFrame, str, str] | str:
    """(choosing rows, estimating rows, their words): odd and even processes when both halves
    have MIN_PER_HALF, else odd and even cells of every process (the module says why); a
    reason when neither can estimate."""
    choosing, estimating = halves(rows["repeat"])
    if not too_few(choosing, estimating):
        per = by_process(rows, keys, value)
        return (per[per["repeat"].isin(choosing)], per[per["repeat"].isin(estimating)],
                words(choosing), words(estimating))
    if "cell" in rows:
        odd, even = halves(rows["cell"])
        processes = rows["repeat"].nunique()
        if odd and processes * len(even) >= MIN_PER_HALF:
            return (rows[rows["cell"].isin(odd)], rows[rows["cell"].isin(even)],
                    cell_words(odd, cell, processes), cell_words(even, cell, processes))
    return too_few(choosing, estimating)


def too_few(choosing: list[int], estimating: list[int]) -> str:
    """Why this split estimates nothing, '' when both halves are large enough."""
    if min(len(choosing), len(estimating)) >= MIN_PER_HALF:
        return ""
    return (f"{len(choosing) + len(estimating)} processes per configuration, fewer than the "
            f"{2 * MIN_PER_HALF} needed to choose on one half and estimate on the other")


def expanded(ci: Confidence, n: int) -> Confidence:
    """The confidence at which a percentile bootstrap over `n` processes covers as an interval
    at `ci.confidence` should: Hesterberg's expanded percentile interval (z at the new level =
    sqrt(n / (n - 1)) t at the old, n - 1 degrees of freedom). With few processes the plain
    percentile interval is too narrow: it misses the truth more often than it should."""
    tail = (1 - ci.confidence) / 2
    z = math.sqrt(n / (n - 1)) * st.t.ppf(1 - tail, n - 1)
    return replace(ci, confidence=float(1 - 2 * st.norm.sf(z)))


def selected(claim: str, label: str, statistic: Callable, samples: tuple[np.ndarray, ...],
             naive: float, halves_words: tuple[str, str], ci: Confidence) -> dict:
    """The row of a best chosen on one half: `statistic` of the samples of the other."""
    n = min(len(s) for s in samples)
    if n < MIN_PER_HALF:
        return unsplit(claim, label, naive, f"{n} of the estimating units measured the "
                       f"chosen configuration, fewer than {MIN_PER_HALF}")
    low, high = bootstrap_ci(statistic, samples, expanded(ci, n))
    apart = bool(low > 1 or high < 1)
    return {"claim": claim, "label": label, "selected_on": halves_words[0],
            "estimated_on": halves_words[1], "estimate": float(statistic(*samples)),
            "ci_low": low, "ci_high": high, "n": n, "distinguishable": apart, "naive": naive,
            "reason": "" if apart else "interval includes 1"}


def unsplit(claim: str, label: str, naive: float, reason: str) -> dict:
    """The row of a claim whose processes cannot be split: the naive best, for contrast only."""
    return {"claim": claim, "label": label, "selected_on": "", "estimated_on": "",
            "estimate": np.nan, "ci_low": np.nan, "ci_high": np.nan, "n": 0,
            "distinguishable": False, "naive": naive, "reason": reason}


def choose(claim: str, values: Callable[[pd.DataFrame], pd.Series], label: Callable,
           samples: Callable, statistic: Callable, rows: pd.DataFrame, ci: Confidence,
           unit: tuple[list[str], str, str]) -> dict | None:
    """Choose the configuration with the largest `values` on one half of `rows` and estimate
    `statistic` of its `samples` on the other (`split`); None when nothing was measured.
    `unit`: the configuration's keys, the value column and what a cell is called."""
    keys, value, cell = unit
    everything = values(by_process(rows, keys, value)).dropna()
    if not len(everything):
        return None
    naive = float(everything.max())
    found = split(rows, keys, value, cell)
    if isinstance(found, str):
        return unsplit(claim, label(everything.idxmax()), naive, found)
    choosing_rows, estimating, *halves_words = found
    choosing = values(choosing_rows).dropna()
    if not len(choosing):
        return unsplit(claim, label(everything.idxmax()), naive, "no value on the choosing half")
    best = choosing.idxmax()
    return selected(claim, label(best), statistic, samples(estimating, best), naive,
                    tuple(halves_words), ci)


# -----------------------------------------------------------------------------
# speculative decoding: the pair and K of the headline mode

def headline_mode(speedup: pd.DataFrame) -> str:
    """The mode the abstract quotes: sampled when it ran, else greedy, else the first by name."""
    modes = set(speedup["mode"]) if len(speedup) and "mode" in speedup else set()
    return next((m for m in ("sampled", "greedy") if m in modes), min(modes, default="sampled"))


def best_per_pair_mode(speedup: pd.DataFrame) -> pd.DataFrame:
    """The row with the largest median speedup for every (pair, mode)."""
    rows = speedup.dropna(subset=["speedup"]) if len(speedup) else speedup
    if not len(rows):
        return rows
    return rows.loc[rows.groupby(["pair", "mode"])["speedup"].idxmax()]


def best_pair(speedup: pd.DataFrame) -> str | None:
    """The pair with the largest speedup in the headline mode (sampled when it was run)."""
    best = best_per_pair_mode(speedup)
    best = best[best["mode"] == headline_mode(speedup)] if len(best) else best
    if not len(best):
        return None
    top = best.sort_values(["speedup", "pair"], ascending=[False, True]).iloc[0]
    return str(top["pair"])


def spec_speedups(proc: pd.DataFrame) -> pd.DataFrame:
    """pair, mode, k, speedup: median autoregressive over median speculative time, the point
    value of `stats.speedup_table` without its interval."""
    med = proc.groupby(["pair", "mode", "method", "k"], as_index=False)["total_s"].median()
    base = med[med["method"] == "autoregressive"][["pair", "mode", "total_s"]]
    spec = med[med["method"] == "speculative"]
    out = spec.merge(base, on=["pair", "mode"], suffixes=("", "_base"))
    return out.assign(speedup=out["total_s_base"] / out["total_s"])[["pair", "mode", "k",
                                                                    "speedup"]]


def best_spec(proc: pd.DataFrame) -> pd.Series:
    """The speedup of the best pair's best K (as `best_pair` picks them), indexed by (pair,
    mode, k): one value, the configuration the abstract quotes."""
    speedup = spec_speedups(proc)
    pair, mode = best_pair(speedup), headline_mode(speedup)
    best = best_per_pair_mode(speedup)
    best = best[(best["pair"] == pair) & (best["mode"] == mode)] if len(best) else best
    return best.set_index(["pair", "mode", "k"])["speedup"]


def spec_samples(proc: pd.DataFrame, key: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(autoregressive, speculative) per-process times of (pair, mode, k)."""
    pair, mode, k = key
    rows = proc[(proc["pair"] == pair) & (proc["mode"] == mode)]
    return (rows.loc[rows["method"] == "autoregressive", "total_s"].to_numpy(float),
            rows.loc[(rows["method"] == "speculative") & (rows["k"] == k), "total_s"]
            .to_numpy(float))


SPEC_KEYS = ["pair", "method", "mode", "k"]


def spec_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """The speculative raw runs as one total time per process, configuration and prompt
    (`cell`)."""
    return (runs.groupby([*SPEC_KEYS, "repeat", "prompt"], as_index=False)["total_s"].median()
            .rename(columns={"prompt": "cell"}))


def speculative_best(proc: pd.DataFrame, ci: Confidence) -> dict | None:
    """`proc`: `spec_cells` of the speculative raw runs (or per-process times, as
    `stats.spec_per_process` gives them)."""
    if not len(proc):
        return None
    return choose("speculative_best", best_spec,
                  lambda key: f"{key[0]}, {key[1]}, K = {int(key[2])}", spec_samples,
                  median_ratio, proc, ci, (SPEC_KEYS, "total_s", "prompt"))


# -----------------------------------------------------------------------------
# the KV cache: cache-off over cache-on total latency, in the same processes

def kv_speedups(proc: pd.DataFrame) -> pd.Series:
    """Median cache-off over median cache-on total latency per configuration (KV_KEYS), the
    point value of `stats.kv_speedup_table`."""
    med = proc.groupby([*KV_KEYS, "use_cache"])["total_s"].median().unstack("use_cache")
    if not {True, False} <= set(med.columns):
        return pd.Series(dtype=float)
    return med[False] / med[True]


def kv_samples(proc: pd.DataFrame, key: tuple) -> tuple[np.ndarray, np.ndarray]:
    rows = proc[np.logical_and.reduce([proc[k] == v for k, v in zip(KV_KEYS, key, strict=True)])]
    return (rows.loc[~rows["use_cache"], "total_s"].to_numpy(float),
            rows.loc[rows["use_cache"], "total_s"].to_numpy(float))


def kv_label(key: tuple) -> str:
    backend, model, dtype, prompt_len, budget = key
    return f"{backend}, {model}, {dtype}, prompt {int(prompt_len)}, budget {int(budget)}"


def sweep_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per process, configuration and inner repeat (`cell`); per process where the
    rows do not say their inner repeat."""
    if "inner" not in runs:
        return per_process(runs)
    return (runs.groupby([*GRID, "repeat", "inner"], as_index=False)[METRICS].median()
            .rename(columns={"inner": "cell"}))


def kv_best(runs: pd.DataFrame, ci: Confidence) -> dict | None:
    """`runs` is the collected sweep rows (runs.parquet)."""
    ablation = sweep_cells(runs[runs["experiment"] == "ablation"])
    if not len(ablation):
        return None
    return choose("kv_best", kv_speedups, kv_label, kv_samples, median_ratio, ablation, ci,
                  ([*KV_KEYS, "use_cache"], "total_s", "inner repeat"))


# -----------------------------------------------------------------------------
# the largest excursion above the local trend (the spike rule's ratio, per process)

def trend_ratios(runs: pd.DataFrame, window: int, threshold: float) -> pd.DataFrame:
    """Per cache-on sweep configuration, budget and process: total latency over its local
    trend, as the spike rule computes it (`regimes.repeat_ratios`)."""
    on = sweep_cells(runs[(runs["experiment"] == "sweep") & runs["use_cache"]])
    if not len(on):
        return pd.DataFrame(columns=[*REGIME_BY, "budget", "repeat", "ratio"])
    by = [*REGIME_BY, "cell"] if "cell" in on else REGIME_BY  # a curve per inner repeat
    return repeat_ratios(on, "total_s", by, window=window, threshold=threshold)


def median_ratios(ratios: pd.DataFrame) -> pd.Series:
    return ratios.groupby([*REGIME_BY, "budget"])["ratio"].median()


def ratio_samples(ratios: pd.DataFrame, key: tuple) -> tuple[np.ndarray]:
    keys = [*REGIME_BY, "budget"]
    hit = np.logical_and.reduce([ratios[k] == v for k, v in zip(keys, key, strict=True)])
    return (ratios.loc[hit, "ratio"].dropna().to_numpy(float),)


def spike_label(key: tuple) -> str:
    values = dict(zip([*REGIME_BY, "budget"], key, strict=True))
    return (f"{values['backend']}, {values['model']}, {values['dtype']}, "
            f"prompt {int(values['prompt_len'])}, budget {int(values['budget'])}")


def spike_largest(runs: pd.DataFrame, window: int, threshold: float, ci: Confidence
                  ) -> dict | None:
    ratios = trend_ratios(runs, window, threshold)
    if not len(ratios):
        return None
    return choose("spike_largest", median_ratios, spike_label, ratio_samples, np.median,
                  ratios.dropna(subset=["ratio"]), ci,
                  ([*REGIME_BY, "budget"], "ratio", "inner repeat"))


def selection_table(runs: pd.DataFrame, spec_proc: pd.DataFrame, regimes: dict,
                    ci: Confidence) -> pd.DataFrame:
    """The three quoted bests; a claim whose stage measured nothing has no row."""
    rows = [speculative_best(spec_proc, ci), kv_best(runs, ci),
            spike_largest(runs, regimes["window"], regimes["threshold"], ci)]
    return pd.DataFrame([r for r in rows if r is not None], columns=COLUMNS)
