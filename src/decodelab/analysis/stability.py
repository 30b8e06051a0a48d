"""Stability verdicts: whether the machine was quiet enough while a configuration was measured
for its numbers to be claims, and which measuring jobs to redo when it was not.

A configuration (one row of the latency grid; one pair x method x mode x K of the speculative
study; one model x context x tokens of the parallelism runs) is `stable` unless one of these
crosses its limit in config `stats.stability`:

- cv between processes: standard deviation (n - 1) over mean of its per-process medians, judged
  by its lower confidence bound (`cv_lower_bound`, `cv_between_confidence`): see "Small samples";
- cv within a process: the same over one process's repeats of identical work (the inner repeats
  of a sweep, the inner passes of the parallelism runs), their standard deviation pooled over
  the processes (see `pooled_cv`), judged by its lower bound too (`cv_within_confidence`);
- max over median: its largest raw value over the median of its raw values, per unit of
  identical work (a speculative configuration's prompts differ in length of accepted runs, so
  each prompt is its own unit);
- background CPU: the share of the machine's CPU that other work used (`background_cpu_share`)
  plus the share a hypervisor stole (`steal_share`), the median over a process's rows of the
  configuration, the worst process (one row's share scatters by the kernel's 10 ms ticks).

pyperf warns at a standard deviation of 10% of the mean. The defaults are wider, fitted to the
default DAG run on a 2-core VM beside an idle pytest worker: over its quiet processes (background
3-4%) the cv between processes reached 17% at the 95th percentile (32% at most), the cv within a
process 31% (58%), max over median 1.33 (2.26); jobs that shared the machine with a running test
showed 44-60% background and the same spreads. So spread alone does not tell a busy machine
there, and the background share does the main work.

Small samples: a CV needs two values; with one process (or one inner repeat) that check is
skipped (NaN) and the configuration is judged on the others. From 2-3 values a CV is crude (its
own relative standard error is about 1 / sqrt(2 d), d its degrees of freedom, 50-70% at d =
1-2): three quiet processes (background 2-5%) of the default's millisecond decodes can differ
by 27-36%, so a point estimate against 25% would call a quiet build noisy and `make remeasure`
would not converge. So the cv between processes crosses its limit only when its one-sided lower
bound does: with d = n - 1 and (n - 1) s^2 / sigma^2 ~ chi-square(d) for normal medians, cv *
sqrt(d / chi2_q(d)), q the confidence (0.9: 0.61 x the cv at 2 processes, 0.66 x at 3, 0.74 x at
6). One process 3x slower than the others (cv 69-71%) still crosses 25% at 2 or 3 processes. The
within cv is pooled rather than the worst process's: from d = 1 at 2 inner repeats the worst
process's cv crosses 35% by chance in a few percent of a quiet run's configurations (inner
repeats scattered +-20%, their ratio 0.82-1.28 at the 10th-90th percentile), while pooled over
the processes (d = processes x (repeats - 1), 6 at the default's 3 x 3) it stays below 35% in
resamples of such a run, and a process whose repeats are disturbed still raises it. At 2 inner
repeats d is only 3, and quiet pooled cvs of 35-46% still occur, the same sampling error as
between processes: so the within cv is judged by its lower bound as well (0.69 x the cv at d =
3, 0.80 x at d = 9), and one process whose repeats scatter 3x still crosses it. The load average
is recorded, not judged: each CPU job's own threads keep it near the core count on a quiet
machine.

Raw files without the machine columns (older runs, results/reference/) have no background
(NaN): they are judged on spread alone and the summary says "background not recorded".
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import chi2

from decodelab.config.settings import Stability
from decodelab.core.errors import DecodelabError
from decodelab.core.hosts import MANIFEST

VERDICT = ["stable", "unstable_reason"]
# The checks: the spread column (named as its limit in Stability), its words, its format.
CHECKS = (("cv_between", "cv between processes", "percent"),
          ("cv_within", "cv within a process", "percent"),
          ("max_over_median", "max over median", "ratio"),
          ("background", "background CPU", "percent"))
NOT_RECORDED = "background not recorded"
JOB_COLUMNS = ["job", "experiment", "backend", "model", "configurations", "unstable",
               "unstable_share", "noisy", "load_max", "background_max", "governor", "reason"]
SUMMARY_COLUMNS = ["configurations", "stable", "stable_share", "noisy", "judged_by", "remeasure"]


@dataclass(frozen=True)
class Study:
    """How one kind of raw file makes configurations: `keys` name one, `value` is its time,
    `cell` tells apart different work inside one (the speculative study's prompts), `model`
    is the column of the job's model (or pair)."""

    name: str
    keys: tuple[str, ...]
    value: str
    cell: tuple[str, ...] = ()
    model: str = "model"


def cv(values) -> float:
    x = np.asarray(values, dtype=float)
    return float(np.std(x, ddof=1) / np.mean(x)) if len(x) >= 2 else math.nan


def cv_lower_bound(cvs: pd.Series, dof: pd.Series, confidence: float) -> pd.Series:
    """The one-sided lower confidence bound of each cv from its degrees of freedom (NaN below 1):
    cv * sqrt(d / chi2.ppf(confidence, d)), the normal-theory bound of a standard deviation."""
    d = dof.astype(float).where(dof >= 1)
    return cvs * np.sqrt(d / chi2.ppf(confidence, d))


def pooled_cv(data: pd.DataFrame, cells: list[str]) -> pd.DataFrame:
    """Per cell: `cv`, the pooled standard deviation of its inner repeats around each process's
    own mean (the within-group estimate of a one-way analysis of variance, sum over processes of
    (n - 1) variances over the sum of (n - 1)) over the cell's mean, NaN with no two repeats in
    any process; and `dof`, that sum of (n - 1)."""
    by = data.groupby([*cells, "repeat"])["_value"]
    groups = pd.DataFrame({"ss": by.var(ddof=1) * (by.size() - 1), "df": by.size() - 1,
                           "mean": by.mean()}).groupby(cells)
    dof = groups["df"].sum()
    pooled = groups["ss"].sum() / dof.replace(0, np.nan)
    return pd.DataFrame({"cv": np.sqrt(pooled) / groups["mean"].mean(), "dof": dof})


def peak(values) -> float:
    x = np.asarray(values, dtype=float)
    return float(np.max(x) / np.median(x))


def machine_column(runs: pd.DataFrame, name: str) -> pd.Series:
    """A machine column as floats; NaN where the raw file predates it."""
    return runs[name].astype(float) if name in runs else pd.Series(np.nan, index=runs.index)


def background(runs: pd.DataFrame) -> pd.Series:
    """Per row: the CPU share other work used or a hypervisor stole; NaN where not recorded."""
    steal = machine_column(runs, "steal_share").fillna(0.0)  # NaN: the kernel reports none
    return machine_column(runs, "background_cpu_share") + steal


def load(runs: pd.DataFrame) -> pd.Series:
    """Per row: the higher of its process's load averages at start and end."""
    return pd.concat([machine_column(runs, "load_start"), machine_column(runs, "load_end")],
                     axis=1).max(axis=1)


def with_machine(runs: pd.DataFrame, study: Study) -> pd.DataFrame:
    return runs.assign(_value=runs[study.value].astype(float), _background=background(runs),
                       _load=load(runs))


def spreads(runs: pd.DataFrame, study: Study, limits: Stability) -> pd.DataFrame:
    """Per configuration: processes, the four checked quantities (see the module), the lower
    bounds of the two cvs (the within one: its worst cell's) and load."""
    keys, cells = list(study.keys), [*study.keys, *study.cell]
    data = with_machine(runs, study)
    medians = data.groupby([*keys, "repeat"])["_value"].median()
    out = medians.groupby(keys).agg(processes="size", cv_between=cv)
    out["cv_between_low"] = cv_lower_bound(out["cv_between"], out["processes"] - 1,
                                           limits.cv_between_confidence)
    within = pooled_cv(data, cells)
    out["cv_within"] = within["cv"].groupby(keys).max()
    out["cv_within_low"] = cv_lower_bound(within["cv"], within["dof"],
                                          limits.cv_within_confidence).groupby(keys).max()
    out["max_over_median"] = data.groupby(cells)["_value"].agg(peak).groupby(keys).max()
    out["background"] = data.groupby([*keys, "repeat"])["_background"].median().groupby(keys).max()
    out["load_max"] = data.groupby(keys)["_load"].max()
    return out.reset_index()


def formatted(value: float, kind: str, digits: int = 0) -> str:
    return f"{value:.{digits}%}" if kind == "percent" else f"{value:.{digits + 2}f}"


def distinct(value: float, limit: float, kind: str) -> tuple[str, str]:
    """Both formatted, with a digit more where rounding would print them alike."""
    for digits in range(4):
        shown, limit_shown = formatted(value, kind, digits), formatted(limit, kind, digits)
        if shown != limit_shown:
            break
    return shown, limit_shown


def crossed(value: float, limit: float, kind: str) -> str:
    """"23% > 10%", with a digit more where rounding would print "10% > 10%"."""
    return " > ".join(distinct(value, limit, kind))


def reason(row, limits: Stability) -> str:
    """Each crossed limit with its value: "cv between processes 45% > 25% (lower 90% bound
    30%); background CPU 50% > 15%"; '' if none. A check with a `<column>_low` is judged by it,
    at its `<column>_confidence`."""
    found = []
    for column, words, kind in CHECKS:
        value, limit = row[column], getattr(limits, column)
        bounded = f"{column}_low" in row
        judged = row[f"{column}_low"] if bounded else value
        if judged > limit:  # NaN (not measurable, not recorded) crosses nothing
            confidence = getattr(limits, f"{column}_confidence", None)
            bound = (f" (lower {confidence:.0%} bound "
                     f"{distinct(judged, limit, kind)[0]})" if bounded else "")
            found.append(f"{words} {crossed(value, limit, kind)}{bound}")
    return "; ".join(found)


SPREADS = ["processes", *(column for column, _, _ in CHECKS), "cv_between_low", "cv_within_low",
           "load_max"]


def verdicts(runs: pd.DataFrame, study: Study, limits: Stability) -> pd.DataFrame:
    """spreads(...) with `stable` and `unstable_reason` per configuration: the table the
    `verdicts` rule writes once per study (stats/verdicts_<study>.csv) and every table with
    verdicts reads; no rows when the study measured nothing."""
    if not len(runs):
        return pd.DataFrame(columns=[*study.keys, *SPREADS, *VERDICT])
    out = spreads(runs, study, limits)
    out["unstable_reason"] = [reason(row, limits) for _, row in out.iterrows()]
    out["stable"] = out["unstable_reason"] == ""
    return out[[*study.keys, *SPREADS, *VERDICT]]


def with_verdicts(table: pd.DataFrame, verdict: pd.DataFrame, on: Iterable[str]
                  ) -> pd.DataFrame:
    """`table` with the verdict of the configuration each row is about."""
    on = list(on)
    if table.empty:
        return table.assign(stable=pd.Series(dtype=bool), unstable_reason=pd.Series(dtype=str))
    merged = table.merge(verdict[[*on, *VERDICT]], on=on, how="left", validate="many_to_one")
    missing = merged["stable"].isna()
    if missing.any():
        raise DecodelabError(f"no stability verdict for {missing.sum()} row(s) of a table keyed "
                             f"by {on} (first: {merged.loc[missing, on].iloc[0].to_dict()})")
    return merged.astype({"stable": bool})


def side(table: pd.DataFrame, verdict: pd.DataFrame, on: list[str], fixed: dict
         ) -> pd.DataFrame:
    """The verdict of one side of a ratio, row by row of `table`: the configuration that
    matches the row on `on` and has the `fixed` values."""
    chosen = verdict
    for column, value in fixed.items():
        chosen = chosen[chosen[column] == value]
    return with_verdicts(table[on], chosen, on)


def paired(table: pd.DataFrame, verdict: pd.DataFrame,
           sides: dict[str, tuple[list[str], dict]]) -> pd.DataFrame:
    """Rows that compare configurations (a speedup): stable only if every side is; the reason
    names the side ("cache off: cv between processes 23% > 10%")."""
    if table.empty:
        return with_verdicts(table, verdict, [])
    found = {name: side(table, verdict, on, fixed) for name, (on, fixed) in sides.items()}
    stable = np.logical_and.reduce([v["stable"].to_numpy() for v in found.values()])
    reasons = [
        "; ".join(f"{name}: {r}" for name, r in zip(found, row, strict=True) if r)
        for row in zip(*(v["unstable_reason"] for v in found.values()), strict=True)
    ]
    return table.assign(stable=stable, unstable_reason=reasons)


# --- per job, and the build's summary --------------------------------------------------------

def most_frequent_check(reasons: pd.Series) -> str:
    """The check that most of these reasons name ('' when none does)."""
    named = [words for text in reasons for words in (w for _, w, _ in CHECKS) if words in text]
    return pd.Series(named).mode().iloc[0] if named else ""


def governors(rows: pd.DataFrame) -> str:
    """The CPU governors a job's rows recorded."""
    found = rows["governor"].dropna().astype(str).unique() if "governor" in rows else []
    return " ".join(found) or "not recorded"


def job_rows(runs: pd.DataFrame, study: Study, verdict: pd.DataFrame, limits: Stability
             ) -> list[dict]:
    if "job" not in runs:
        raise DecodelabError(f"{study.name} runs without a `job` column (the raw file of each "
                             "row; collected by an older decodelab): snakemake --forcerun collect")
    keys = list(study.keys)
    data = with_machine(runs, study)
    rows = []
    for job, rows_of_job in data.groupby("job", sort=True):
        measured = rows_of_job[keys].drop_duplicates().merge(verdict, on=keys)
        unstable = measured[~measured["stable"]]
        first = rows_of_job.iloc[0]
        share = len(unstable) / len(measured) if len(measured) else math.nan
        rows.append({
            "job": job, "experiment": first.get("experiment", study.name),
            "backend": first.get("backend", ""), "model": first[study.model],
            "configurations": len(measured), "unstable": len(unstable),
            "unstable_share": share, "noisy": len(unstable) > 0 and share > limits.noisy_share,
            "load_max": rows_of_job["_load"].max(),
            "background_max": rows_of_job["_background"].max(),
            "governor": governors(rows_of_job),
            "reason": most_frequent_check(unstable["unstable_reason"])})
    return rows


def job_table(judged: Iterable[tuple[pd.DataFrame, Study, pd.DataFrame]], limits: Stability
              ) -> pd.DataFrame:
    """One row per measuring job (raw file, column `job` of the runs) from (runs, study,
    verdicts) triples; a job is `noisy` (to re-measure) when more than `noisy_share` of its
    configurations, and at least one, are unstable."""
    rows = [row for runs, study, verdict in judged for row in job_rows(runs, study, verdict,
                                                                          limits)]
    return pd.DataFrame(rows, columns=JOB_COLUMNS)


def noisy_jobs(jobs: pd.DataFrame) -> list[str]:
    if jobs.empty:
        return []
    return sorted(jobs.loc[jobs["noisy"].astype(str).str.lower() == "true", "job"].astype(str))


def judged_by(limits: Stability, recorded: bool) -> str:
    words = (f"cv between processes <= {formatted(limits.cv_between, 'percent')} (its lower "
             f"{formatted(limits.cv_between_confidence, 'percent')} bound), "
             f"cv within a process <= {formatted(limits.cv_within, 'percent')} (its lower "
             f"{formatted(limits.cv_within_confidence, 'percent')} bound), "
             f"max over median <= {formatted(limits.max_over_median, 'ratio')}, "
             f"background CPU <= {formatted(limits.background, 'percent')}")
    return words if recorded else f"{words} ({NOT_RECORDED}: judged on spread alone)"


def remeasure_command(files: list[str]) -> str:
    """The one command that re-measures `files` and rebuilds what depends on them."""
    return shlex.join(["snakemake", "--forcerun", *files]) if files else ""


def summary_table(verdict_tables: list[pd.DataFrame], jobs: pd.DataFrame,
                  limits: Stability) -> pd.DataFrame:
    """One row: configurations judged, how many stable, whether any job is noisy, the limits
    in words and the re-measure command ('' when quiet)."""
    all_verdicts = [v for v in verdict_tables if len(v)]
    total = sum(len(v) for v in all_verdicts)
    stable = sum(int(v["stable"].sum()) for v in all_verdicts)
    recorded = bool(all_verdicts) and all(v["background"].notna().all() for v in all_verdicts)
    files = noisy_jobs(jobs)
    return pd.DataFrame([{
        "configurations": total, "stable": stable,
        "stable_share": stable / total if total else math.nan, "noisy": bool(files),
        "judged_by": judged_by(limits, recorded), "remeasure": remeasure_command(files)}],
        columns=SUMMARY_COLUMNS)


def stability_tables(studies: Iterable[tuple[pd.DataFrame, Study, pd.DataFrame]],
                     limits: Stability) -> dict[str, pd.DataFrame]:
    """The `stability` group's tables (by their key) from each study's raw runs and verdicts."""
    judged = [(runs, study, verdict) for runs, study, verdict in studies if len(runs)]
    jobs = job_table(judged, limits)
    return {"stability": jobs,
            "stability_summary": summary_table([v for *_, v in judged], jobs, limits)}


# --- what the user reads: `decodelab remeasure` and the end of the Snakemake log -----------------

def imported(job: str) -> bool:
    """A raw file of a host imported here (results/<host>/IMPORTED.json): not re-measurable."""
    parts = Path(job).parts
    return len(parts) > 1 and (Path(*parts[:2]) / MANIFEST).is_file()


def files_to_remeasure(tables: Iterable[str | Path]) -> list[str]:
    """The noisy jobs of these stability tables that this host can re-measure, once each."""
    files: set[str] = set()
    for path in tables:
        try:
            jobs = pd.read_csv(path)
        except (OSError, pd.errors.EmptyDataError, pd.errors.ParserError) as err:
            raise DecodelabError(f"{path}: not a readable stability table ({err}); rerun the "
                                 "stability rule") from err
        missing = [c for c in ("job", "noisy") if c not in jobs]
        if missing:
            raise DecodelabError(f"{path}: no column(s) {missing}; not a stability table "
                                 "(rerun the stability rule)")
        files |= {job for job in noisy_jobs(jobs) if not imported(job)}
    return sorted(files)


def closing_note(stats_dir: str | Path, noisiest: int = 3) -> str | None:
    """The last line of a Snakemake run: whether the measurements were quiet, judged as the
    paper's abstract judges them (no job past the noisy share, so `make remeasure` has nothing
    to do); None without the stability tables (a dry run, a target short of them)."""
    stats_dir = Path(stats_dir)
    try:
        summary = pd.read_csv(stats_dir / "stability_summary.csv").iloc[0]
        jobs = pd.read_csv(stats_dir / "stability.csv")
    except (OSError, IndexError, KeyError, ValueError):  # absent, empty or not ours
        return None
    total, stable = int(summary["configurations"]), int(summary["stable"])
    if str(summary["noisy"]).lower() != "true":
        return (f"Measurements were quiet: {stable} of {total} configurations stable "
                f"(judged by {summary['judged_by']})")
    worst = jobs.sort_values(["unstable_share", "job"], ascending=[False, True]).head(noisiest)
    names = ", ".join(f"{j.job} ({j.unstable} of {j.configurations})"
                      for j in worst.itertuples() if j.unstable > 0)
    return (f"WARNING: {total - stable} of {total} configurations were unstable (noisiest jobs: "
            f"{names}); re-measure them with: make remeasure")
