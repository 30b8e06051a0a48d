"""Step-ups inside one run: a cache-on decode whose per-token step time rises part-way through
and stays up.

The budget-level rule (`regimes`) compares whole runs across budgets. Inside one cache-on run a
step costs about the same from start to end, so a run whose steps, from some step on, stay above
`factor` times the median of its first `baseline` steps for at least `run` steps in a row has
changed regime mid-decode. Cache-off runs are left out: their steps grow with the sequence by
design.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from decodelab.core.io import as_bool

KEYS = ["experiment", "backend", "model", "family", "dtype", "prompt_len", "budget", "repeat",
        "inner"]
COLUMNS = [*KEYS, "steps", "onset", "step_up", "launch_up", "launch_cpu_up"]


def check_settings(factor: float, baseline: int, run: int) -> None:
    if not factor > 1:
        raise ValueError(f"factor must be above 1, got {factor}")
    if baseline < 2 or run < 1:
        raise ValueError(f"baseline must be at least 2 and run at least 1, got {baseline}, {run}")


def onset(steps, factor: float, baseline: int, run: int) -> int:
    """The first step (0-based) of the first stretch of `run` or more steps above `factor` times
    the median of the first `baseline` steps that reaches past them; -1 where there is none or
    the run is too short to tell."""
    s = np.asarray(steps, dtype=float)
    if len(s) < baseline + run:
        return -1
    slow = s > factor * np.median(s[:baseline])
    sustained = np.lib.stride_tricks.sliding_window_view(slow, run).all(axis=1)[baseline:]
    hits = np.flatnonzero(sustained)
    if not len(hits):
        return -1
    start = int(hits[0]) + baseline
    while start > 0 and slow[start - 1]:  # the stretch may begin inside the baseline
        start -= 1
    return start


def ratio_after(values, at: int, baseline: int) -> float:
    """Median after step `at` over the median of the first `baseline`; NaN without values (rows
    from before the harness recorded them)."""
    v = np.asarray(values if values is not None else [], dtype=float)
    if at < 0 or len(v) <= at:
        return float("nan")
    return float(np.median(v[at:]) / np.median(v[:baseline]))


def find_onsets(runs: pd.DataFrame, factor: float, baseline: int, run: int) -> pd.DataFrame:
    """One row per cache-on run long enough to test: its onset (-1: none) and the step-up, the
    median step after the onset over the median of the first `baseline` steps; the same ratio
    for the host's launch wall time and launch CPU time (`decode.Decoded`) says where the added
    time went."""
    check_settings(factor, baseline, run)
    rows = []
    for _, r in runs[as_bool(runs["use_cache"])].iterrows():
        s = np.asarray(r["step_s"], dtype=float)
        if len(s) < baseline + run:
            continue
        at = onset(s, factor, baseline, run)
        rows.append({**{k: r.get(k) for k in KEYS}, "steps": len(s), "onset": at,
                     "step_up": ratio_after(s, at, baseline),
                     "launch_up": ratio_after(r.get("step_launch_s"), at, baseline),
                     "launch_cpu_up": ratio_after(r.get("step_launch_cpu_s"), at, baseline)})
    return pd.DataFrame(rows, columns=COLUMNS)
