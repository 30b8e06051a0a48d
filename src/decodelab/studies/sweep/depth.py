"""The regime_depth rule's tables: the spike rule's verdicts taken further by the analysis
modules (spikes per family, prefill vs decode, variance between processes, memory correlation,
change points, KV-cache speedup at spikes, mid-run step-ups).

Its own module, above them: they import `regimes` for its helpers, so `regimes` cannot import
them back.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.analysis import changepoints, variance
from decodelab.analysis import regimes as rg
from decodelab.analysis.stability import VERDICT, with_verdicts
from decodelab.analysis.stats import GRID, METRICS
from decodelab.config.settings import Regimes
from decodelab.core.errors import DecodelabError
from decodelab.core.io import as_bool, read_table
from decodelab.studies.sweep import collapse, memory, onsets, phases


def read_inputs(runs_path: Path, regimes_path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The collected runs and the regimes table, refused naming the file when not theirs."""
    runs, table = read_table(runs_path), read_table(regimes_path)
    missing = [c for c in [*GRID, "repeat", *METRICS] if c not in runs.columns]
    if missing:
        raise DecodelabError(f"{runs_path}: no column(s) {missing}; rerun the collect rule")
    if not {"metric", "spike", "ratio_median", *VERDICT} <= set(table.columns):
        raise DecodelabError(f"{regimes_path}: not a regimes table of this version (no spike or "
                             "stability columns); rerun the regimes rule")
    for col in ("use_cache", "spike", "stable"):
        table[col] = as_bool(table[col])
    table["unstable_reason"] = table["unstable_reason"].astype("string").fillna("").astype(str)
    return runs, table


def with_stability(step_ups: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    """Each step-up with its configuration's stability verdict, as the regimes table has it."""
    cache_on = table[(table["metric"] == "total_s") & table["use_cache"]]
    return with_verdicts(step_ups, cache_on, [c for c in GRID if c != "use_cache"])


def depth_tables(runs_path: Path, regimes_path: Path, spec: Regimes) -> dict[str, pd.DataFrame]:
    """Every regime_depth table by its key in `decodelab.core.tables` (group regime_depth)."""
    runs, table = read_inputs(runs_path, regimes_path)
    mem = [c for c in memory.MEMORY if c in runs.columns]
    proc = runs.groupby(GRID + ["repeat"], as_index=False)[METRICS + mem].median()
    window, threshold, alpha = spec.window, spec.threshold, spec.alpha
    cp = spec.changepoints
    try:
        points, curves = changepoints.find_changepoints(
            proc, table, cp.model, cp.penalty, cp.min_size, cp.noise_floor)
    except ValueError as err:
        raise DecodelabError(f"regimes.changepoints: {err}") from err
    steps = spec.onsets
    try:
        step_ups = onsets.find_onsets(runs, steps.factor, steps.baseline, steps.run)
    except ValueError as err:
        raise DecodelabError(f"regimes.onsets: {err}") from err
    var = variance.decompose(runs)
    return {
        "summary": rg.spike_summary(table),
        "phases": phases.attribute_spikes(proc, table, window, threshold, alpha),
        "variance": var,
        "variance_summary": variance.summarize(var, alpha),
        "memory": memory.memory_correlation(proc, window, threshold),
        "changepoints": points,
        "changepoint_curves": curves,
        "agreement": changepoints.agreement(points),
        "kv_collapse": collapse.kv_collapse(proc, table, window, threshold, alpha),
        "onsets": with_stability(step_ups, table),
    }
