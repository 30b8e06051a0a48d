"""End to end through Snakemake and the CLI: a tiny sweep measured under a planted CPU load is
judged unstable, the paper's abstract says so first and names `make remeasure`, and the log
ends with the same warning; the same sweep on a quiet machine is stable and the abstract says the
build was quiet (the negative control).

`make remeasure` then measures the noisy jobs again, which come back stable.

Marked `serial`: the quiet control needs the machine to itself, so `make test` runs it alone
after the parallel pass (`pytest -m serial`); under an xdist worker it would share the CPU with
the other worker and is skipped as such."""

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from dag import ROOT, copy_workflow, snakemake
from load import planted_load

from decodelab.analysis import stability
from decodelab.backends import machine
from decodelab.report import noise

pytestmark = pytest.mark.serial

# One tiny init model, both experiments, two processes each: 4 measuring jobs of a few seconds.
# Budgets from 64 and three warm-up runs: shorter decodes (16-48 tokens, about 1 ms each) and one
# warm-up left cache-on configurations with 45-77% cv within a process on a quiet 2-core VM; ten
# budgets so that one or two configurations of a job judged unstable by chance (two processes
# give a rough cv between them) do not make it noisy.
SWEEP = {"models": ["gpt2-tiny"], "budgets": list(range(64, 209, 16)), "prompt_lengths": [8],
         "repeats": 2, "inner_repeats": 3, "warmup": 3}


# Other work's share of the CPU above which the stability rule calls a row unstable
QUIET_BACKGROUND = yaml.safe_load((ROOT / "config.yaml").read_text())["stats"]["stability"][
    "background"]


def configure(workdir: Path, host: str) -> Path:
    """The default config cut to the tiny sweep on the CPU (no speculative pair runs here)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    cuda_only = {"cuda-cuda": config["speculative"]["pairs"]["cuda-cuda"]}
    config |= {"host": host, "backends": ["cpu"], "sweep": config["sweep"] | SWEEP,
               "speculative": config["speculative"] | {"pairs": cuda_only},
               "verification": config["verification"] | {"pairs": ["cuda-cuda"]}}
    path = workdir / f"{host}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def raw_files(host: str) -> list[str]:
    return [f"results/{host}/cpu/{experiment}/gpt2-tiny/rep{r}.parquet"
            for experiment in ("sweep", "ablation") for r in range(SWEEP["repeats"])]


def judged(workdir: Path, host: str) -> tuple[pd.DataFrame, str, str]:
    """The stability rule on this host's raw files: (its summary, the abstract's verdict, the
    Snakemake log's last line)."""
    targets = [f"results/{host}/stats/{t}.csv" for t in ("stability", "stability_summary")]
    log = snakemake(workdir, *targets, "--cores", "1", "--configfile",
                    str(workdir / f"{host}.yaml")).stderr
    stats_dir = workdir / "results" / host / "stats"
    verdict = noise.parts(stats_dir, {}).macros["NoiseVerdict"]
    return pd.read_csv(stats_dir / "stability_summary.csv").iloc[0], verdict, log


def last_word(log: str) -> str:
    """The workflow's last line: the one before Snakemake's own (its log's path, the time)."""
    lines = [line for line in log.splitlines() if line.strip()]
    while lines and lines[-1].startswith(("Complete log", "Elapsed time")):
        lines.pop()
    return lines[-1]


def measure(workdir: Path, host: str) -> None:
    snakemake(workdir, *raw_files(host), "--cores", "1", "--configfile",
              str(configure(workdir, host)))


def remeasure(workdir: Path, host: str) -> list[str]:
    """`make remeasure` on this host: its noisy jobs measured again (their files)."""
    files = stability.files_to_remeasure([workdir / f"results/{host}/stats/stability.csv"])
    if files:
        snakemake(workdir, *files, "--forcerun", *files, "--cores", "1", "--configfile",
                  str(workdir / f"{host}.yaml"))
    return files


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("needs the machine to itself: `make test` runs it after the parallel pass "
                    "(pytest -m serial)")
    return copy_workflow(tmp_path_factory.mktemp("planted"))


def busy_jobs(workdir: Path, host: str) -> list[str]:
    """The noisy jobs whose verdict blames other work on the machine (background CPU), each with
    the largest background share of its rows."""
    jobs = pd.read_csv(workdir / f"results/{host}/stats/stability.csv")
    noisy = jobs[jobs["noisy"].astype(str).str.lower() == "true"]
    return [f"{job} (background up to {share:.0%})"
            for job, share, why in zip(noisy["job"], noisy["background_max"],
                                       noisy["reason"].fillna(""), strict=True)
            if "background" in why]


def skip_unless_quiet(workdir: Path, host: str) -> None:
    if busy := busy_jobs(workdir, host):
        pytest.skip(f"the machine was not quiet: other work took the CPU in {', '.join(busy)}; "
                    "the quiet control can only judge a quiet machine")


def test_a_quiet_machine_gives_a_stable_sweep_and_a_quiet_abstract(workdir):
    """Quiet after at most one `make remeasure`, the artifact's remedy: on a shared 2-core VM one
    job in a few builds crosses the noisy share by chance (24 of 30 configurations stable). The
    control judges the verdict only on a quiet machine: it measures the background before the
    run, and the jobs record it while they run; where other work took more of the CPU than the
    stability rule allows, it is skipped with the measured share, never failed."""
    before = machine.sampled_background(2.0)
    if before > QUIET_BACKGROUND:
        pytest.skip(f"the machine was not quiet: other work took {before:.0%} of the CPU over 2 s "
                    f"before the run (the stability rule allows {QUIET_BACKGROUND:.0%})")
    measure(workdir, "quiet")  # first: the model is prepared on a quiet machine too
    summary, verdict, log = judged(workdir, "quiet")
    if summary["noisy"]:
        skip_unless_quiet(workdir, "quiet")
        assert remeasure(workdir, "quiet")
        summary, verdict, log = judged(workdir, "quiet")
        if summary["noisy"]:
            skip_unless_quiet(workdir, "quiet")
    assert not summary["noisy"] and summary["stable_share"] >= 0.8, summary.to_dict()
    assert verdict.startswith(f"This build was quiet: {summary['stable']} of "
                              f"{summary['configurations']} measured configurations were stable")
    assert "remeasure" not in verdict and last_word(log).startswith("Measurements were quiet")


def test_a_planted_load_makes_the_sweep_unstable_and_the_abstract_warn(workdir):
    with planted_load(processes=os.cpu_count()) as loops:  # one per core: the sweep still runs
        measure(workdir, "loaded")
        assert all(loop.poll() is None for loop in loops), "the load ended before the sweep"
    summary, verdict, log = judged(workdir, "loaded")
    # 0-17% seen in five runs: the background share catches nearly every configuration; every
    # job noisy and named (below) is the stronger check
    assert summary["noisy"] and summary["stable_share"] <= 0.3, summary.to_dict()
    assert verdict.startswith(r"\textbf{This build was noisy:}")
    assert r"\cmd{make remeasure} re-measures only the noisy jobs" in verdict
    jobs = stability.files_to_remeasure([workdir / "results/loaded/stats/stability.csv"])
    assert jobs == sorted(raw_files("loaded"))  # every job measured under the load, no other
    last = last_word(log)
    assert "WARNING" in last and last.endswith("re-measure them with: make remeasure")


def test_make_remeasure_measures_the_noisy_jobs_again_and_they_come_back_stable(workdir):
    """After the load (the test before), `make remeasure` re-runs exactly the jobs judged noisy,
    and on the quiet machine most of their configurations are now stable."""
    assert remeasure(workdir, "loaded") == sorted(raw_files("loaded"))
    summary, _, _ = judged(workdir, "loaded")
    assert summary["stable_share"] >= 0.6, summary.to_dict()  # <= 0.3 under the load
