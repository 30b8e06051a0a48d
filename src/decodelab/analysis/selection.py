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
5): the speculative best is taken over every process with an interval that holds for all its
configurations at once (`simultaneous_best`); the sweep's claims split inside every process,
over its cells of identical configuration (the inner repeats): the odd cells choose, the even
ones estimate, and the bootstrap resamples (process, cell) units. Its independence is
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
                   latency), spike_largest (cache-on total latency over its local trend), and at
                   that chosen spike spike_decode and spike_prefill (each phase over its own
                   trend) and kv_at_spike (the KV-cache speedup there, on the ablation's
                   estimating half)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats as st

from decodelab.analysis.regimes import repeat_ratios
from decodelab.analysis.stats import GRID, METRICS, bootstrap_ci, median_ratio, per_process
from decodelab.config.settings import Confidence, SpikeRule

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


def by_process(rows: pd.DataFrame, keys: list[str], value: str | list[str]) -> pd.DataFrame:
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


@dataclass(frozen=True)
class Choice:
    """The configuration chosen on one half (`best`), the other half's rows to estimate it on
    (`estimating`, with both halves in words), the naive top over every process and its value;
    `reason` says why nothing is estimated ('' when something is)."""
    best: tuple
    estimating: pd.DataFrame | None
    halves: tuple[str, str]
    naive_best: tuple
    naive: float
    reason: str = ""


def choice(values: Callable[[pd.DataFrame], pd.Series], rows: pd.DataFrame,
           unit: tuple[list[str], str | list[str], str]) -> Choice | None:
    """The configuration with the largest `values` on one half of `rows` (`split`); None when
    nothing was measured. `unit`: the configuration's keys, the value column(s) and what a cell
    is called."""
    keys, value, cell = unit
    everything = values(by_process(rows, keys, value)).dropna()
    if not len(everything):
        return None
    naive = (everything.idxmax(), float(everything.max()))
    found = split(rows, keys, value, cell)
    if isinstance(found, str):
        return Choice(naive[0], None, ("", ""), *naive, found)
    choosing_rows, estimating, *halves_words = found
    choosing = values(choosing_rows).dropna()
    if not len(choosing):
        return Choice(naive[0], None, ("", ""), *naive, "no value on the choosing half")
    return Choice(choosing.idxmax(), estimating, tuple(halves_words), *naive)


def estimate(claim: str, label: str, found: Choice, statistic: Callable,
             samples: tuple[np.ndarray, ...], naive: float, ci: Confidence) -> dict:
    """The row of `claim` at the chosen configuration: `statistic` of the estimating half's
    `samples`, or the naive value for contrast when nothing can be estimated."""
    if found.reason:
        return unsplit(claim, label, naive, found.reason)
    return selected(claim, label, statistic, samples, naive, found.halves, ci)


def choose(claim: str, values: Callable[[pd.DataFrame], pd.Series], label: Callable,
           samples: Callable, statistic: Callable, rows: pd.DataFrame, ci: Confidence,
           unit: tuple[list[str], str, str]) -> dict | None:
    """Choose the configuration with the largest `values` on one half of `rows` and estimate
    `statistic` of its `samples` on the other; None when nothing was measured."""
    found = choice(values, rows, unit)
    if found is None:
        return None
    drawn = samples(found.estimating, found.best) if found.estimating is not None else ()
    return estimate(claim, label(found.best), found, statistic, drawn, found.naive, ci)


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
    `stats.spec_per_process` gives them). With MIN_PER_HALF processes per half, chosen on one
    half and estimated on the other; with fewer, the best of every configuration with an interval
    that holds for all of them at once (`simultaneous_best`)."""
    if not len(proc):
        return None
    if too_few(*halves(proc["repeat"])):
        return simultaneous_best(proc, ci)
    return choose("speculative_best", best_spec, spec_label, spec_samples, median_ratio, proc,
                  ci, (SPEC_KEYS, "total_s", "prompt"))


# With fewer processes than a split needs, the best configuration's interval is one of a set that
# covers every configuration at once (Bonferroni over the configurations, Student's t over the
# paired units): whichever configuration wins, its interval keeps the family's coverage, so the
# winner's curse cannot narrow it. Its width is at most t / sqrt(n - 1) times the largest range
# of a configuration's unit log speedups (a sample's sd is at most half its range x
# sqrt(n / (n - 1))); above MAX_WIDTH_FACTOR no interval is printed: too few units to say
# anything.
MAX_WIDTH_FACTOR = 4.0


def paired_log_speedups(cells: pd.DataFrame) -> pd.DataFrame:
    """Units x configurations: the log of autoregressive over speculative time of (pair, mode, k),
    both from the same process and prompt (a unit), so a prompt's length and a process's state
    cancel. Per process where the rows have no prompt cell."""
    unit = ["repeat", "cell"] if "cell" in cells else ["repeat"]
    base = (cells[cells["method"] == "autoregressive"]
            .groupby(["pair", "mode", *unit])["total_s"].median().rename("base"))
    spec = cells[cells["method"] == "speculative"].join(base, on=["pair", "mode", *unit])
    logs = np.log(spec["base"] / spec["total_s"]).rename("log_speedup")
    table = spec.assign(log_speedup=logs).pivot_table(
        index=unit, columns=["pair", "mode", "k"], values="log_speedup", aggfunc="median")
    return table.dropna()


def simultaneous_best(cells: pd.DataFrame, ci: Confidence) -> dict:
    """The headline mode's best (pair, k) by its mean paired log speedup over every unit, with
    its Bonferroni-t interval over the mode's configurations; an interval only where the units
    allow one within MAX_WIDTH_FACTOR."""
    mode = headline_mode(spec_speedups(cells))
    logs = paired_log_speedups(cells[cells["mode"] == mode])
    naive = float(best_spec(cells).max()) if len(best_spec(cells)) else math.nan
    n, m = logs.shape
    what = "(process, prompt) units" if "cell" in cells else "processes"
    if n < 3 or m == 0:
        return unsplit("speculative_best", "", naive, f"{n} {what} measured every configuration, "
                       "too few for an interval")
    # a configuration's own sd, but never below the family's pooled one: the winner is not the
    # configuration whose few units happened to agree
    mean = logs.mean()
    sd = logs.std(ddof=1).clip(lower=math.sqrt((logs.var(ddof=1)).mean()))
    best = mean.idxmax()
    t = float(st.t.ppf(1 - (1 - ci.confidence) / (2 * m), n - 1))
    factor = t / math.sqrt(n - 1)
    label = spec_label((best[0], best[1], best[2]))
    if factor > MAX_WIDTH_FACTOR:
        return unsplit("speculative_best", label, naive,
                       f"{n} {what} for {m} configurations: too few for an interval")
    half = t * sd[best] / math.sqrt(n)
    low, high = math.exp(mean[best] - half), math.exp(mean[best] + half)
    apart = bool(low > 1 or high < 1)
    return {"claim": "speculative_best", "label": label,
            "selected_on": f"all {n} {what}",
            "estimated_on": f"the same, an interval over all {m} configurations at once",
            "estimate": math.exp(mean[best]), "ci_low": low, "ci_high": high, "n": n,
            "distinguishable": apart, "naive": naive,
            "reason": "" if apart else "interval includes 1"}


def spec_label(key: tuple) -> str:
    return f"{key[0]}, {key[1]}, K = {int(key[2])}"


def spec_key(label: str) -> tuple[str, str, int]:
    """(pair, mode, k) of a `speculative_best` row's label, as `spec_label` wrote it."""
    pair, mode, k = label.split(", ")
    return pair, mode, int(k.removeprefix("K = "))


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

RATIOS = {"total_s": "ratio", "decode_s": "decode_ratio", "prefill_s": "prefill_ratio"}


def trend_ratios(runs: pd.DataFrame, window: int, threshold: float) -> pd.DataFrame:
    """Per cache-on sweep configuration, budget and process: each latency over its local trend,
    as the spike rule computes it (`regimes.repeat_ratios`): `ratio` for total latency, a
    column per phase (RATIOS)."""
    on = sweep_cells(runs[(runs["experiment"] == "sweep") & runs["use_cache"]])
    keys = [*REGIME_BY, "budget", "repeat"]
    if not len(on):
        return pd.DataFrame(columns=[*keys, *RATIOS.values()])
    by = [*REGIME_BY, "cell"] if "cell" in on else REGIME_BY  # a curve per inner repeat
    keys = [*by, "budget", "repeat"]
    ratios = [repeat_ratios(on, metric, by, window=window, threshold=threshold)
              .rename(columns={"ratio": column})[[*keys, column]]
              for metric, column in RATIOS.items()]
    return ratios[0].merge(ratios[1], on=keys, how="left").merge(ratios[2], on=keys, how="left")


def median_ratios(ratios: pd.DataFrame, column: str = "ratio") -> pd.Series:
    return ratios.groupby([*REGIME_BY, "budget"])[column].median()


def ratio_samples(ratios: pd.DataFrame, key: tuple, column: str = "ratio") -> tuple[np.ndarray]:
    keys = [*REGIME_BY, "budget"]
    hit = np.logical_and.reduce([ratios[k] == v for k, v in zip(keys, key, strict=True)])
    return (ratios.loc[hit, column].dropna().to_numpy(float),)


def spike_label(key: tuple) -> str:
    values = dict(zip([*REGIME_BY, "budget"], key, strict=True))
    return (f"{values['backend']}, {values['model']}, {values['dtype']}, "
            f"prompt {int(values['prompt_len'])}, budget {int(values['budget'])}")


def kv_key(spike: tuple) -> tuple:
    """The KV-cache configuration (KV_KEYS) of a spike's configuration."""
    return tuple(dict(zip([*REGIME_BY, "budget"], spike, strict=True))[k] for k in KV_KEYS)


def kv_at(runs: pd.DataFrame, found: Choice, ci: Confidence) -> dict | None:
    """kv_at_spike: the KV-cache speedup at the chosen spike's configuration, on the estimating
    half of the ablation's own processes (or cells); the naive one over all of them at the
    naive top spike, for contrast."""
    ablation = sweep_cells(runs[runs["experiment"] == "ablation"])
    if not len(ablation):
        return None
    unit, label = [*KV_KEYS, "use_cache"], spike_label(found.best)
    speedups = kv_speedups(by_process(ablation, unit, "total_s"))
    naive = float(speedups.get(kv_key(found.naive_best), np.nan))
    if found.reason:
        return unsplit("kv_at_spike", label, naive, found.reason)
    if kv_key(found.best) not in speedups.index:
        return unsplit("kv_at_spike", label, naive, "the ablation did not measure it")
    halves = split(ablation, unit, "total_s", "inner repeat")
    if isinstance(halves, str):
        return unsplit("kv_at_spike", label, naive, halves)
    _, estimating, *words = halves
    return selected("kv_at_spike", label, median_ratio, kv_samples(estimating, kv_key(found.best)),
                    naive, tuple(words), ci)


def spike_claims(runs: pd.DataFrame, window: int, threshold: float, ci: Confidence
                 ) -> list[dict]:
    """The largest excursion above the local trend (spike_largest), chosen on total latency,
    and at that one configuration the phases' ratios to their trends (spike_decode,
    spike_prefill) and the KV-cache speedup (kv_at_spike), all estimated on the other half:
    the claims that the spikes come from the decode phase and that the cache's speedup
    collapses in them."""
    ratios = trend_ratios(runs, window, threshold).dropna(subset=["ratio"])
    found = choice(median_ratios, ratios, ([*REGIME_BY, "budget"], list(RATIOS.values()),
                                           "inner repeat"))
    if found is None:
        return []
    label, drawn = spike_label(found.best), found.estimating
    rows = []
    for claim, column in (("spike_largest", "ratio"), ("spike_decode", "decode_ratio"),
                          ("spike_prefill", "prefill_ratio")):
        naive = median_ratios(by_process(ratios, [*REGIME_BY, "budget"], column),
                              column).get(found.naive_best, np.nan)
        samples = ratio_samples(drawn, found.best, column) if drawn is not None else ()
        rows.append(estimate(claim, label, found, np.median, samples, float(naive), ci))
    return [*rows, kv_at(runs, found, ci)]


def selection_table(runs: pd.DataFrame, spec_proc: pd.DataFrame, rule: SpikeRule,
                    ci: Confidence) -> pd.DataFrame:
    """The quoted bests; a claim whose stage measured nothing has no row."""
    rows = [speculative_best(spec_proc, ci), kv_best(runs, ci),
            *spike_claims(runs, rule.window, rule.threshold, ci)]
    return pd.DataFrame([r for r in rows if r is not None], columns=COLUMNS)
