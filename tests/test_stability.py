"""decodelab.analysis.stability: a verdict per configuration and per job from synthetic raw runs,
the
re-measure command, `make remeasure` and the last line of the Snakemake log."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from decodelab import cli
from decodelab.analysis import stability, stats
from decodelab.analysis.regimes import spike_table
from decodelab.config.settings import Confidence, SpikeRule, Stability, load_settings
from decodelab.core import tables
from decodelab.core.errors import DecodelabError
from decodelab.core.io import write_raw, write_table
from decodelab.studies.speculative import tables as speculative_tables
from decodelab.studies.sweep import tables as sweep_study
from decodelab.studies.sweep.depth import with_stability

ROOT = Path(__file__).resolve().parents[1]
DECODELAB = Path(sys.executable).parent / "decodelab"  # the CLI of the running environment
LIMITS = Stability(cv_between=0.10, cv_within=0.10, max_over_median=1.5, background=0.10,
                   noisy_share=0.0)  # pyperf's limits: the tests are about the mechanism
CI = Confidence(0.95, 200, 0)
BUDGETS = (8, 16, 32)


def raw_runs(n_proc: int = 3, noise: float = 0.01, slow: dict | None = None,
             busy: dict | None = None, machine: bool = True, seed: int = 0, inner: int = 2,
             budgets=BUDGETS) -> pd.DataFrame:
    """Sweep and ablation rows of one model, as the sweep jobs write them: `noise` the sd of
    each value's log, `slow` maps a repeat to the factor its whole process ran slower by,
    `busy` a repeat to the background CPU share recorded on its rows; `machine=False` leaves
    out the machine columns (older raw files)."""
    slow, busy, rng = slow or {}, busy or {}, np.random.default_rng(seed)
    rows = []
    for experiment, caches in (("sweep", (True,)), ("ablation", (True, False))):
        for repeat in range(n_proc):
            job = f"results/h/cpu/{experiment}/m/rep{repeat}.parquet"
            for use_cache in caches:
                for budget in budgets:
                    for index in range(inner):
                        base = 0.001 * budget * (1 if use_cache else 3)
                        total = base * slow.get(repeat, 1.0) * rng.lognormal(0, noise)
                        row = {"experiment": experiment, "backend": "cpu", "model": "m",
                               "family": "gpt2", "dtype": "float32", "prompt_len": 8,
                               "use_cache": use_cache, "budget": budget, "repeat": repeat,
                               "inner": index, "prefill_s": total / 4,
                               "decode_s": 3 * total / 4, "total_s": total,
                               "decode_per_token_s": 3 * total / 4 / budget, "job": job}
                        if machine:
                            row |= {"background_cpu_share": busy.get(repeat, 0.01),
                                    "steal_share": np.nan, "load_start": 2.0, "load_end": 2.1,
                                    "governor": "performance"}
                        rows.append(row)
    return pd.DataFrame(rows)


def judged(runs: pd.DataFrame, limits: Stability = LIMITS) -> pd.DataFrame:
    return stability.verdicts(runs, stats.SWEEP, limits)


def sweep_tables(runs: pd.DataFrame, limits: Stability = LIMITS) -> dict[str, pd.DataFrame]:
    return stability.stability_tables([(runs, stats.SWEEP, judged(runs, limits))], limits)


# -----------------------------------------------------------------------------
# a verdict per configuration

def test_quiet_runs_are_stable():  # the negative control of the next two
    verdict = judged(raw_runs())
    assert len(verdict) == 3 * 3 and verdict["stable"].all()
    assert (verdict["unstable_reason"] == "").all()
    assert (verdict["processes"] == 3).all() and (verdict["cv_between"] < 0.05).all()


def test_one_process_three_times_slower_is_unstable_by_the_cv_between_processes():
    verdict = judged(raw_runs(slow={2: 3.0}))
    assert not verdict["stable"].any()
    for text in verdict["unstable_reason"]:
        value = float(text.split("cv between processes ")[1].split("%")[0])
        assert 65 < value < 75, text  # std of (1, 1, 3) over their mean: 69%
        assert "> 10%" in text
    assert (verdict["background"] < LIMITS.background).all()  # the machine looked quiet


def test_rows_with_half_the_cpu_taken_are_unstable_by_the_background():
    verdict = judged(raw_runs(busy={1: 0.5}))
    assert not verdict["stable"].any()
    assert verdict["unstable_reason"].str.fullmatch(r"background CPU 50% > 10%").all()


def test_steal_counts_as_background():
    runs = raw_runs().assign(background_cpu_share=0.02, steal_share=0.2)
    assert judged(runs)["unstable_reason"].str.fullmatch(r"background CPU 22% > 10%").all()


def test_spread_within_a_process_and_an_outlier_value():
    runs = raw_runs()
    first = (runs["inner"] == 0) & (runs["repeat"] == 0)
    runs.loc[first, "total_s"] *= 1.6  # one process's first repeats: pooled cv 22-23%
    verdict = judged(runs)
    assert verdict["unstable_reason"].str.contains(
        r"cv within a process 2\d% > 10% \(lower 90% bound 1\d%\)").all()
    assert verdict["stable"].sum() == 0
    runs = raw_runs(n_proc=5)
    one = (runs["inner"] == 0) & (runs["repeat"] == 0)
    runs.loc[one, "total_s"] *= 2.0  # 1 raw value in 10 doubled
    for text in judged(runs)["unstable_reason"]:
        assert 1.9 < float(text.split("max over median ")[1].split(" ")[0]) < 2.1, text
        assert "> 1.50" in text


# The quiet default run's scatter (commit 513a3a3, nothing else on the machine): the ratio of a
# configuration's first to second inner repeat had its 10th-90th percentiles at 0.82-1.28, a
# log-normal sd of 0.174 / sqrt(2) per value.
QUIET_SCATTER = 0.123


def default_build(seed: int, busy: float = 0.01, noise: float = QUIET_SCATTER) -> pd.DataFrame:
    """The default config's sweep jobs of one model, in synthetic rows: its processes, inner
    repeats and budgets, every process's background CPU share at `busy`."""
    settings = load_settings(ROOT / "config.yaml")
    sweep = settings.sweep
    runs = raw_runs(n_proc=sweep.repeats, inner=sweep.inner_repeats, budgets=sweep.budgets,
                    noise=noise, busy=dict.fromkeys(range(sweep.repeats), busy), seed=seed)
    return sweep_tables(runs, settings.stability)["stability"]


@pytest.mark.slow  # 100 quiet builds: fewer would loosen its false-alarm bound
def test_a_quiet_scatter_of_20_percent_passes_at_the_defaults_repeats_and_a_load_fails():
    first, second = (raw_runs(noise=QUIET_SCATTER, budgets=range(1, 200)).query(f"inner == {i}")
                     ["total_s"].to_numpy() for i in (0, 1))
    assert np.percentile(first / second, [10, 90]) == pytest.approx([0.82, 1.28], abs=0.04)
    quiet = [default_build(seed) for seed in range(100)]
    assert sum(jobs["noisy"].any() for jobs in quiet) <= 5  # of 100 quiet builds
    assert np.mean([jobs["unstable_share"].mean() for jobs in quiet]) < 0.02
    loaded = default_build(0, busy=0.45)  # the shares measured beside a running test: 44-60%
    assert loaded["noisy"].all() and (loaded["unstable_share"] == 1).all()
    assert (loaded["reason"] == "background CPU").all()
    # Without the machine's columns, a load that triples the scatter still shows in the spread:
    # in most jobs (66% at the default's 7 budgets, 75% at 9), where quiet ones show in none.
    disturbed = [default_build(seed, busy=np.nan, noise=3 * QUIET_SCATTER)["noisy"].mean()
                 for seed in range(40)]
    assert np.mean(disturbed) >= 0.6


def within_scatter(factor: float, processes: int = 3) -> pd.DataFrame:
    """The default's sweep rows of one model with every process's first inner repeat `factor`
    times its second: the pooled cv within a process is then the same at every budget."""
    settings = load_settings(ROOT / "config.yaml")
    runs = raw_runs(n_proc=processes, inner=settings.sweep.inner_repeats, noise=0.0)
    runs.loc[runs["inner"] == 0, "total_s"] *= factor
    return stability.verdicts(runs, stats.SWEEP, settings.stability)


def test_a_within_cv_past_its_limit_by_sampling_error_alone_is_judged_by_its_bound():
    quiet = within_scatter(1.8)  # pooled cv 40% from 3 x 1 degrees of freedom: bound 28%
    assert (quiet["cv_within"] > 0.35).all() and (quiet["cv_within_low"] < 0.35).all()
    assert quiet["stable"].all()
    disturbed = within_scatter(3.0)  # repeats 3x apart in every process: pooled cv 71%
    assert (disturbed["cv_within_low"] > 0.35).all() and not disturbed["stable"].any()
    assert disturbed["unstable_reason"].str.contains("cv within a process .* bound").all()


def test_the_within_bound_counts_the_pooled_degrees_of_freedom():
    three, nine = (v["cv_within_low"].iloc[0] / v["cv_within"].iloc[0]
                   for v in (within_scatter(1.8, n) for n in (3, 9)))
    assert three == pytest.approx(np.sqrt(3 / stability.chi2.ppf(0.9, 3)), rel=0.02)
    assert nine == pytest.approx(np.sqrt(9 / stability.chi2.ppf(0.9, 9)), rel=0.02)


def test_a_reason_never_reads_as_its_limit():
    assert stability.crossed(0.103, 0.10, "percent") == "10.3% > 10.0%"
    assert stability.crossed(0.23, 0.10, "percent") == "23% > 10%"
    assert stability.crossed(1.5004, 1.5, "ratio") == "1.5004 > 1.5000"


def test_limits_come_from_the_config():
    runs = raw_runs(busy={1: 0.5})
    assert judged(runs, Stability(background=0.6))["stable"].all()


def test_one_process_has_no_cv_between_processes_and_is_judged_on_the_rest():
    verdict = judged(raw_runs(n_proc=1))
    assert verdict["cv_between"].isna().all() and verdict["stable"].all()
    assert not judged(raw_runs(n_proc=1, busy={0: 0.5}))["stable"].any()


DEFAULT = Stability()  # config.yaml's: cv between processes 25%, judged by its lower 90% bound


@pytest.mark.parametrize("factors", [(1.0, 1.45), (1.0, 1.35, 0.75), (1.0, 1.45, 0.72)])
def test_quiet_processes_a_third_apart_are_stable_by_the_bound_not_the_estimate(factors):
    # The quiet 2-core VM: three quiet processes 27-36% apart, two 26-34% (stop 16, 2026-12-02).
    verdict = judged(raw_runs(n_proc=len(factors), slow=dict(enumerate(factors))), DEFAULT)
    assert (verdict["cv_between"] > DEFAULT.cv_between).all()  # the point estimate crosses
    assert (verdict["cv_between_low"] < DEFAULT.cv_between).all() and verdict["stable"].all()


@pytest.mark.parametrize("n_proc", [2, 3])
def test_one_process_three_times_slower_still_crosses_the_bound(n_proc):
    verdict = judged(raw_runs(n_proc=n_proc, slow={n_proc - 1: 3.0}), DEFAULT)
    assert not verdict["stable"].any()
    assert verdict["unstable_reason"].str.match(
        r"cv between processes (6[89]|7\d)% > 25% \(lower 90% bound [45]\d%\)").all()


def test_the_bound_is_the_chi_square_bound_and_tightens_with_processes():
    cvs, dof = pd.Series([0.3, 0.3, 0.3]), pd.Series([1, 2, 30])
    low = stability.cv_lower_bound(cvs, dof, 0.9)
    assert np.allclose(low, 0.3 * np.sqrt(dof / np.array([2.7055, 4.6052, 40.256])), rtol=1e-3)
    assert low.is_monotonic_increasing and low.iloc[-1] < 0.3
    assert stability.cv_lower_bound(pd.Series([0.3]), pd.Series([0]), 0.9).isna().all()


def test_the_bound_flags_a_true_spread_past_the_limit_and_spares_one_below_it():
    """Processes whose medians scatter log-normally with a true cv of 10% (below 25%) are flagged
    in under 5% of 400 seeds at 3 processes; a true cv of 60% in most of them (the bound's power),
    and a true 35% more often with 8 processes than with 3 (it tightens with more)."""
    def flagged(true_cv: float, n_proc: int) -> float:
        rng = np.random.default_rng(int(true_cv * 100) + n_proc)
        sigma = np.sqrt(np.log1p(true_cv ** 2))
        medians = pd.DataFrame(rng.lognormal(0, sigma, (400, n_proc)))
        cvs = medians.std(axis=1, ddof=1) / medians.mean(axis=1)
        low = stability.cv_lower_bound(cvs, pd.Series(n_proc - 1, index=cvs.index), 0.9)
        return float((low > DEFAULT.cv_between).mean())

    assert flagged(0.10, 3) < 0.05
    assert flagged(0.60, 3) > 0.5
    assert flagged(0.35, 8) > flagged(0.35, 3)


def test_old_raw_runs_without_machine_columns_are_judged_on_spread_alone():
    quiet, slow = judged(raw_runs(machine=False)), judged(raw_runs(machine=False, slow={0: 3.0}))
    assert quiet["background"].isna().all() and quiet["stable"].all()
    assert not slow["stable"].any()
    for machine in (False, True):
        frames = sweep_tables(raw_runs(machine=machine), LIMITS)
        judged_by = frames["stability_summary"]["judged_by"].iloc[0]
        assert (stability.NOT_RECORDED in judged_by) == (not machine)


# -----------------------------------------------------------------------------
# the tables that carry the verdicts

def test_latency_rows_carry_their_configurations_verdict():
    runs = raw_runs(busy={0: 0.5})
    runs.loc[runs["budget"] != 32, "background_cpu_share"] = 0.0
    table = sweep_study.latency_table(runs, CI, judged(runs))
    assert len(table) == 9 * len(stats.METRICS)
    assert set(table.loc[~table["stable"], "budget"]) == {32}
    assert (table.loc[table["stable"], "unstable_reason"] == "").all()


def test_the_verdicts_are_written_once_and_every_table_with_verdicts_reads_them(tmp_path):
    runs = raw_runs(busy={0: 0.5})
    runs.loc[runs["budget"] != 32, "background_cpu_share"] = 0.0
    files = []
    for job, rows in runs.groupby("job"):  # the raw files, as the sweep jobs write them
        path = tmp_path / job
        path.parent.mkdir(parents=True, exist_ok=True)
        files.append(str(write_raw(rows.drop(columns="job"), path, len(rows), "synthetic")))
    verdicts = tmp_path / "verdicts_sweep.csv"
    assert cli.main(["verdicts", "--study", "sweep", "--spec", json.dumps(LIMITS.job_spec()),
                     "--out", str(verdicts), *files]) == 0
    write_table(runs, tmp_path / "runs.parquet")
    assert cli.main(["stats", "--runs", str(tmp_path / "runs.parquet"), "--spec",
                     json.dumps(CI.job_spec()), "--verdicts", str(verdicts), "--latency",
                     str(tmp_path / "latency.csv"), "--kv", str(tmp_path / "kv.csv")]) == 0
    latency = tables.read(tmp_path, "latency")
    assert set(latency.loc[~latency["stable"], "budget"]) == {32}  # as judged in memory
    assert list(pd.read_csv(verdicts).columns) == [*stats.GRID, *stability.SPREADS,
                                                    *stability.VERDICT]
    assert stability.SPREADS == list(tables.SPREADS)  # the registry declares the same columns
    assert cli.main(["stats", "--runs", str(tmp_path / "runs.parquet"), "--spec",
                     json.dumps(CI.job_spec()), "--verdicts", str(tmp_path / "none.csv"),
                     "--latency", str(tmp_path / "l.csv"), "--kv", str(tmp_path / "k.csv")]) == 2


def test_a_kv_ratio_is_unstable_when_either_side_is():
    runs = raw_runs()
    off = (runs["experiment"] == "ablation") & ~runs["use_cache"] & (runs["budget"] == 16)
    runs.loc[off & (runs["repeat"] == 1), "total_s"] *= 3
    table = sweep_study.kv_speedup_table(runs, CI, judged(runs))
    assert set(table.loc[~table["stable"], "budget"]) == {16}
    assert table.loc[~table["stable"], "unstable_reason"].str.startswith(
        "cache off: cv between processes").all()


def test_a_speculative_speedup_is_unstable_when_either_method_is():
    rng = np.random.default_rng(1)
    rows = [{"pair": "p", "mode": "greedy", "method": method, "k": k, "prompt": prompt,
             "repeat": repeat, "total_s": t * rng.lognormal(0, 0.01) * (3 if slow else 1),
             "job": f"results/h/speculative/p/rep{repeat}.parquet"}
            for repeat in range(3) for prompt in range(2)
            for method, k, t in (("autoregressive", 0, 1.0), ("speculative", 2, 0.7),
                                 ("speculative", 4, 0.6))
            for slow in [repeat == 2 and k == 4]]
    runs = pd.DataFrame(rows)
    verdict = stability.verdicts(runs, stats.SPECULATIVE, LIMITS)
    table = speculative_tables.speedup_table(speculative_tables.spec_per_process(runs), CI, verdict)
    assert table.set_index("k")["stable"].to_dict() == {2: True, 4: False}
    assert table.loc[table["k"] == 4, "unstable_reason"].iloc[0].startswith(
        "speculative: cv between processes")
    slow_base = runs.assign(total_s=np.where(runs["method"] == "autoregressive",
                                             runs["total_s"] * (1 + 2 * (runs["repeat"] == 0)),
                                             runs["total_s"]))
    verdict = stability.verdicts(slow_base, stats.SPECULATIVE, LIMITS)
    per_process = speculative_tables.spec_per_process(slow_base)
    table = speculative_tables.speedup_table(per_process, CI, verdict)
    assert not table["stable"].any()
    assert table["unstable_reason"].str.contains("autoregressive: cv between").all()


def test_spikes_and_step_ups_carry_the_verdict():
    runs = raw_runs(busy={0: 0.5})
    runs.loc[runs["budget"] == 8, "background_cpu_share"] = 0.0
    spec = SpikeRule(window=2, threshold=1.5, consistency=1.0, alpha=0.05)
    found = spike_table(stats.per_process(runs), spec, judged(runs))
    assert set(found["metric"]) == {"total_s", "prefill_s", "decode_s"}
    assert found.set_index("budget")["stable"].groupby(level=0).all().to_dict() == {
        8: True, 16: False, 32: False}
    steps = pd.DataFrame([{"experiment": "sweep", "backend": "cpu", "model": "m",
                           "family": "gpt2", "dtype": "float32", "prompt_len": 8, "budget": b,
                           "repeat": 0, "inner": 0, "onset": -1} for b in (8, 32)])
    assert with_stability(steps, found)["stable"].tolist() == [True, False]


def test_tables_without_verdicts_read_as_not_judged(tmp_path):
    pd.DataFrame([{"experiment": "sweep", "metric": "total_s", "median": 1.0, "stable": True},
                  {"experiment": "sweep", "metric": "total_s", "median": 1.0}]
                 ).to_csv(tmp_path / "latency.csv", index=False)
    latency = tables.read(tmp_path, "latency")
    assert latency["stable"].tolist() == [True, False]
    assert latency["unstable_reason"].tolist() == ["", tables.NOT_JUDGED]
    pd.DataFrame([{"experiment": "sweep", "metric": "total_s", "median": 1.0}]).to_csv(
        tmp_path / "latency.csv", index=False)  # a host from before the verdicts
    assert not tables.read(tmp_path, "latency")["stable"].any()


# -----------------------------------------------------------------------------
# per job, the summary and the re-measure command

def test_the_job_table_names_every_job_and_its_unstable_share():
    runs = raw_runs(busy={1: 0.5})
    quiet_ablation = runs["experiment"] == "ablation"
    runs.loc[quiet_ablation, "background_cpu_share"] = 0.0
    frames = sweep_tables(runs, LIMITS)
    jobs = frames["stability"].set_index("job")
    assert list(frames["stability"].columns) == stability.JOB_COLUMNS
    assert len(jobs) == 6 and (jobs["configurations"] == [6, 6, 6, 3, 3, 3]).all()
    sweep = jobs[jobs["experiment"] == "sweep"]
    # a configuration is judged across its processes: all three sweep jobs measured it
    assert (sweep["unstable"] == 3).all() and sweep["noisy"].all()
    assert sweep["reason"].eq("background CPU").all()
    assert sweep["background_max"].to_dict() == {
        f"results/h/cpu/sweep/m/rep{r}.parquet": 0.5 if r == 1 else 0.01 for r in range(3)}
    ablation = jobs[jobs["experiment"] == "ablation"]
    assert (ablation["unstable"] == 0).all() and not ablation["noisy"].any()
    assert (ablation["governor"] == "performance").all() and (jobs["load_max"] == 2.1).all()
    summary = frames["stability_summary"].iloc[0]
    assert list(frames["stability_summary"].columns) == stability.SUMMARY_COLUMNS
    assert (summary["configurations"], summary["stable"]) == (9, 6) and summary["noisy"]
    assert summary["remeasure"] == "snakemake --forcerun " + " ".join(
        f"results/h/cpu/sweep/m/rep{r}.parquet" for r in range(3))


def test_runs_collected_before_the_job_column_are_refused_with_the_fix():
    with pytest.raises(DecodelabError, match=r"`job` column.*snakemake --forcerun collect"):
        sweep_tables(raw_runs().drop(columns="job"), LIMITS)


def test_a_share_threshold_keeps_jobs_with_few_unstable_configurations():
    runs = raw_runs()
    busy = (runs["experiment"] == "sweep") & (runs["budget"] == 8) & (runs["repeat"] == 0)
    runs.loc[busy, "background_cpu_share"] = 0.5
    for share, noisy in ((0.2, True), (0.5, False)):
        jobs = sweep_tables(runs, Stability(noisy_share=share))
        sweep = jobs["stability"].set_index("experiment").loc["sweep"]
        assert (sweep["unstable_share"] == 1 / 3).all() and (sweep["noisy"] == noisy).all()
        assert jobs["stability_summary"]["noisy"].iloc[0] == noisy


def test_a_quiet_build_has_nothing_to_remeasure():
    frames = sweep_tables(raw_runs(), LIMITS)
    summary = frames["stability_summary"].iloc[0]
    assert summary["stable"] == summary["configurations"] == 9 and not summary["noisy"]
    assert summary["remeasure"] == "" and not frames["stability"]["noisy"].any()


def stability_table(path: Path, noisy: set[str], host: str = "h") -> Path:
    jobs = [f"results/{host}/cpu/sweep/m{i}/rep0.parquet" for i in range(4)]
    pd.DataFrame([{"job": j, "unstable": int(j in noisy), "unstable_share": 0.5 * (j in noisy),
                   "noisy": j in noisy} for j in jobs]).to_csv(path, index=False)
    return path


def remeasure_output(capsys, *tables_) -> list[str]:
    assert cli.main(["remeasure", "--stability", *map(str, tables_)]) == 0
    return capsys.readouterr().out.split()


def test_remeasure_prints_exactly_the_noisy_jobs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    two = {"results/h/cpu/sweep/m1/rep0.parquet", "results/h/cpu/sweep/m3/rep0.parquet"}
    assert remeasure_output(capsys, stability_table(tmp_path / "a.csv", two)) == sorted(two)
    assert remeasure_output(capsys, stability_table(tmp_path / "b.csv", set())) == []
    # the merged copy repeats this host's jobs; an imported host's cannot be re-measured here
    other = stability_table(tmp_path / "c.csv", {"results/o/cpu/sweep/m0/rep0.parquet"}, "o")
    (tmp_path / "results/o").mkdir(parents=True)
    (tmp_path / "results/o/IMPORTED.json").write_text("{}")
    assert remeasure_output(capsys, tmp_path / "a.csv", tmp_path / "a.csv", other) == sorted(two)
    (tmp_path / "bad.csv").write_text("job\nx\n")
    assert cli.main(["remeasure", "--stability", str(tmp_path / "bad.csv")]) == 2
    assert "bad.csv: no column(s) ['noisy']" in capsys.readouterr().err


def make_remeasure(tmp_path: Path, noisy: set[str]) -> subprocess.CompletedProcess:
    """`make remeasure` in a copy of the Makefile, with the real decodelab and a snakemake that
    writes down its arguments."""
    tmp_path.mkdir()
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    bin_dir = tmp_path / ".venv/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "decodelab").symlink_to(DECODELAB)
    (bin_dir / "snakemake").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/snakemake.args\n')
    (bin_dir / "snakemake").chmod(0o755)
    (tmp_path / "results/h/stats").mkdir(parents=True)
    stability_table(tmp_path / "results/h/stats/stability.csv", noisy)
    return subprocess.run(["make", "-s", "-o", "setup", "remeasure"], cwd=tmp_path,
                          capture_output=True, text=True, check=True)


@pytest.mark.skipif(not shutil.which("make") or not DECODELAB.exists(),
                    reason="no make, or no decodelab script beside this Python")
def test_make_remeasure_forces_only_the_noisy_jobs(tmp_path):
    two = {"results/h/cpu/sweep/m0/rep0.parquet", "results/h/cpu/sweep/m2/rep0.parquet"}
    make_remeasure(tmp_path / "noisy", two)
    args = (tmp_path / "noisy/snakemake.args").read_text().split()
    assert args == ["--forcerun", *sorted(two)]
    quiet = make_remeasure(tmp_path / "quiet", set())
    assert not (tmp_path / "quiet/snakemake.args").exists()
    assert "nothing to re-measure" in quiet.stdout


# -----------------------------------------------------------------------------
# the end of the Snakemake log

def test_the_closing_note_says_quiet_or_names_the_noisiest_jobs(tmp_path):
    assert stability.closing_note(tmp_path) is None  # a dry run, a partial target
    quiet = sweep_tables(raw_runs(), LIMITS)
    tables.write_group(tmp_path / "quiet", "stability", quiet)
    note = stability.closing_note(tmp_path / "quiet")
    assert note.startswith("Measurements were quiet: 9 of 9 configurations stable (judged by "
                           "cv between processes <= 10%")
    noisy = sweep_tables(raw_runs(slow={0: 3.0}), LIMITS)
    tables.write_group(tmp_path / "noisy", "stability", noisy)
    note = stability.closing_note(tmp_path / "noisy")
    assert note.startswith("WARNING: 9 of 9 configurations were unstable (noisiest jobs: "
                           "results/h/cpu/ablation/m/rep0.parquet (6 of 6), ")
    assert note.endswith("re-measure them with: make remeasure")
    (tmp_path / "noisy/stability_summary.csv").write_text("")
    assert stability.closing_note(tmp_path / "noisy") is None


def test_the_closing_note_agrees_with_the_abstract_when_no_job_is_noisy(tmp_path):
    """An unstable configuration below the noisy share: the abstract reads quiet and `make
    remeasure` has nothing to redo, so the log must not tell the user to run it."""
    quiet = sweep_tables(raw_runs(), LIMITS)
    quiet["stability_summary"] = quiet["stability_summary"].assign(stable=8)
    tables.write_group(tmp_path, "stability", quiet)
    assert stability.closing_note(tmp_path).startswith("Measurements were quiet: 8 of 9 ")
