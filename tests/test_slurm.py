"""The DAG on a real one-node SLURM cluster (tests/slurm_cluster.py), through profiles/slurm.

A tiny DAG (one `init` model swept at two budgets, a tiny trained pair for the speculative and
verification stages at their smallest) runs once locally and once with
`snakemake --executor slurm --workflow-profile profiles/slurm`. During the SLURM run the sweep
job is cancelled with `scancel` while it measures; the run fails, and the same command run again
finishes it. Skipped, with the reason, where SLURM, munge, MariaDB or root is missing.
"""

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from dag import ROOT, SNAKEMAKE, copy_workflow
from slurm_cluster import slurm_cluster  # noqa: F401 (the session fixture)

pytestmark = pytest.mark.slurm

HOST = "slurmtest"
CORES = str(os.cpu_count())  # threads of a CPU benchmark job: the whole (only) node
TINY_TRAIN = {"source": "train", "n_layer": 1, "n_embd": 32, "n_head": 2, "n_positions": 128,
              "vocab_size": 512, "corpus_mb": 0.3, "seq_len": 32, "batch_size": 4, "steps": 10,
              "lr": 0.003, "seed": 1}
CONFIG = {
    "host": HOST,
    "backends": ["cpu"],
    "seed": 1,
    "models": {"gpt2-tiny": {"source": "init", "preset": "gpt2-tiny", "seed": 1},
               "tiny": TINY_TRAIN},
    "sweep": {"models": ["gpt2-tiny"], "budgets": [4, 8], "prompt_lengths": [8], "repeats": 1,
              "inner_repeats": 1, "warmup": 1},
    # held-out prompts need a `train` target; the draft is the target itself (smallest)
    "speculative": {"pairs": {"cpu-cpu": {"target": "tiny", "draft": "tiny",
                                          "target_device": "cpu", "draft_device": "cpu"}},
                    "ks": [1], "modes": ["greedy"], "prompts": 1, "prompt_len": 8, "budget": 4,
                    "repeats": 1, "hf_assisted": False,
                    "parallelism": {"ks": [1], "context": 8, "inner": 1}},
    "verification": {"pairs": ["cpu-cpu"], "k": 1, "seeds": 2,
                     "exact": {"random_pairs": 1, "vocab_sizes": [2], "concentrations": [1.0],
                               "real_positions": 1, "block_vocab": 2, "block_ks": [1]},
                     "monte_carlo": {"draws": 100, "vocab": 2, "block_draws": 100},
                     "real": {"tokens": 100, "budget": 2, "top": 1, "prompts": 1,
                              "power_tokens": 100, "greedy_prompts": 1}},
}
SWEEP_OUT = f"results/{HOST}/cpu/sweep/gpt2-tiny/rep0.parquet"
SWEEP_LOG = f"logs/{HOST}/cpu/sweep/gpt2-tiny/rep0.log"
SWEEP_JOB = f"rule_sweep_wildcards_{HOST}_cpu_sweep_gpt2-tiny_0"  # the plugin's --comment
# every measuring output of the tiny DAG, and `collect`'s table (a rule that only reads)
TARGETS = [SWEEP_OUT, f"results/{HOST}/cpu/ablation/gpt2-tiny/rep0.parquet",
           f"results/{HOST}/speculative/cpu-cpu/rep0.parquet",
           f"results/{HOST}/cpu/parallelism/tiny/rep0.parquet",
           f"results/{HOST}/verification/exact.json",
           f"results/{HOST}/verification/monte_carlo.json",
           f"results/{HOST}/verification/real_cpu-cpu.json", f"results/{HOST}/runs.parquet"]
JOBS = {"prepare_model": 2, "sweep": 2, "speculative": 1, "parallelism": 1, "verify_exact": 1,
        "verify_monte_carlo": 1, "verify_real": 1, "collect": 1}
WHOLE_NODE = {"sweep", "speculative", "parallelism", "verify_real"}  # threads: workflow.cores
NOTICE_S = 400  # the plugin's status checks come at most 180 s apart
SLURM = ["--executor", "slurm", "--workflow-profile", "profiles/slurm",
         # the plugin waits 40 s before its first status check by default, and 10 s more after
         # each check that finds no job finished
         "--slurm-init-seconds-before-status-checks", "1"]


def workflow_copy(root: Path) -> Path:
    workdir = copy_workflow(root)
    (workdir / "tiny.yaml").write_text(yaml.safe_dump(CONFIG))
    return workdir


def command(*args: str) -> list[str]:
    return [SNAKEMAKE, "--configfile", "tiny.yaml", "--cores", CORES, *args, *TARGETS]


def env() -> dict:
    # Passive OpenMP waits: on a loaded machine a spinning thread starves the one it waits for,
    # and a two-thread job of this DAG took minutes instead of seconds. Timing only; jobs get it
    # through sbatch --export=ALL.
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def run(workdir: Path, cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=workdir, env=env(), capture_output=True, text=True,
                          timeout=1200)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The local run, started before the SLURM run so that it goes on while SLURM jobs wait:
    (its workflow copy, its process)."""
    workdir = workflow_copy(tmp_path_factory.mktemp("local"))
    with open(workdir / "local.log", "w") as out:
        proc = subprocess.Popen(command(), cwd=workdir, env=env(), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        yield workdir, proc
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def local_tree(local_run) -> Path:
    workdir, proc = local_run
    assert proc.wait(timeout=1200) == 0, (workdir / "local.log").read_text()[-6000:]
    return workdir


@dataclass
class SlurmRun:
    workdir: Path
    first: str  # the run whose sweep job was cancelled: its output
    first_rc: int
    cancelled: str  # the SLURM job id of that sweep job
    sweep_dir_after_cancel: list[str]
    planned_after_cancel: str  # `snakemake -n` then
    rerun: subprocess.CompletedProcess
    job_ids: list[str]  # every job both runs submitted, from their output


def cancel_when_measuring(cluster, workdir: Path, proc: subprocess.Popen) -> str:
    """scancel the sweep job once it is RUNNING and its `decodelab sweep` has started."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        for line in cluster.run("squeue", "-h", "-o", "%i|%T|%k").splitlines():
            job, state, comment = line.split("|")
            if state == "RUNNING" and comment == SWEEP_JOB and (workdir / SWEEP_LOG).exists():
                cluster.run("scancel", job)
                return job
        time.sleep(0.5)
    raise AssertionError(f"the sweep job was never seen running (snakemake rc {proc.poll()})")


@pytest.fixture(scope="module")
def slurm_run(slurm_cluster, local_run, tmp_path_factory) -> SlurmRun:  # noqa: F811
    workdir = workflow_copy(tmp_path_factory.mktemp("slurm"))
    log = workdir / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command(*SLURM), cwd=workdir, env=env(), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        try:
            cancelled = cancel_when_measuring(slurm_cluster, workdir, proc)
            proc.wait(timeout=NOTICE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"snakemake did not notice in {NOTICE_S} s that SLURM cancelled job "
                        f"{cancelled} (the plugin's sacct status 'CANCELLED by <uid>' is never "
                        "taken for failed: profiles/slurm sets slurm-status-command: squeue)")
        finally:
            if proc.poll() is None:
                proc.kill()
    first = log.read_text()
    sweep_dir = (workdir / SWEEP_OUT).parent
    left = sorted(p.name for p in sweep_dir.iterdir()) if sweep_dir.exists() else []
    planned = run(workdir, command(*SLURM, "-n")).stdout
    rerun = run(workdir, command(*SLURM))
    ids = re.findall(r"submitted with SLURM jobid (\d+)", first + rerun.stdout + rerun.stderr)
    return SlurmRun(workdir, first, proc.returncode, cancelled, left, planned, rerun, ids)


def rule_of(comment: str) -> str:
    return re.match(r"rule_(\w+?)(_wildcards_|$)", comment)[1]


def profile_resources(rule: str) -> dict:
    profile = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    default = dict(r.split("=") for r in profile["default-resources"])
    return {k: int(v) for k, v in (default | profile["set-resources"].get(rule, {})).items()}


def finished_rows(cluster, ids: list[str]) -> list[dict]:
    """sacct's rows of the jobs, once slurmdbd has every one in a final state."""
    for _ in range(60):
        rows = cluster.sacct(*ids)
        if len(rows) == len(ids) and all(r["State"] not in ("PENDING", "RUNNING") for r in rows):
            return rows
        time.sleep(0.5)
    raise AssertionError(f"sacct has not every job finished: {rows}")


def test_every_job_ran_through_sbatch_on_the_cpu_partition_as_the_profile_asks(
        slurm_run, slurm_cluster):  # noqa: F811
    assert slurm_run.rerun.returncode == 0, slurm_run.rerun.stderr[-3000:]
    rows = finished_rows(slurm_cluster, slurm_run.job_ids)
    done = [r for r in rows if r["JobID"] != slurm_run.cancelled]
    assert all(r["State"] == "COMPLETED" and r["ExitCode"] == "0:0" for r in done), done
    counts = {}
    for r in done:
        counts[rule_of(r["Comment"])] = counts.get(rule_of(r["Comment"]), 0) + 1
    assert counts == JOBS
    for r in rows:
        rule = rule_of(r["Comment"])
        asked = profile_resources(rule)
        trains = r["Comment"] == "rule_prepare_model_wildcards_tiny"
        threads = CORES if rule in WHOLE_NODE or trains else "1"
        assert r["Partition"] == "cpu", r  # the plugin's choice from partitions.yaml
        assert r["ReqMem"] == f"{asked['mem_mb']}M", r
        assert r["TimelimitRaw"] == str(asked["runtime"]), r
        assert r["AllocCPUS"] == threads, r
    print("SLURM jobs (sacct):", *(" ".join(r.values()) for r in rows), sep="\n  ")


def tree(root: Path) -> dict[str, object]:
    """Every file under results/ with its row count (tables) or list lengths (JSON reports)."""
    files = {}
    for path in sorted((root / "results").rglob("*")):
        if path.is_dir():
            continue
        key = str(path.relative_to(root))
        if path.suffix == ".parquet":
            files[key] = pq.ParquetFile(path).metadata.num_rows
        elif path.suffix == ".csv":
            files[key] = len(path.read_text().splitlines())
        elif path.suffix == ".json" and "verification" in key:
            report = json.loads(path.read_text())
            files[key] = {k: len(v) for k, v in report.items() if isinstance(v, list)}
        else:
            files[key] = None
    return files


def test_the_results_tree_equals_that_of_the_local_run(slurm_run, local_tree):
    assert slurm_run.rerun.returncode == 0, slurm_run.rerun.stderr[-3000:]
    local, cluster = tree(local_tree), tree(slurm_run.workdir)
    assert local == cluster
    assert local[SWEEP_OUT] > 0 and local[f"results/{HOST}/runs.parquet"] > 0


def test_a_job_cancelled_by_slurm_leaves_nothing_a_rerun_takes_for_finished(slurm_run,
                                                                            slurm_cluster):  # noqa: F811
    (row,) = slurm_cluster.sacct(slurm_run.cancelled)
    assert row["State"].startswith("CANCELLED") and row["Comment"] == SWEEP_JOB
    assert slurm_run.first_rc != 0
    assert f"SLURM-job '{slurm_run.cancelled}' failed" in slurm_run.first
    assert slurm_run.sweep_dir_after_cancel == []  # no output, no partial file
    assert SWEEP_OUT in slurm_run.planned_after_cancel  # the dry run plans it again
    assert slurm_run.rerun.returncode == 0, slurm_run.rerun.stderr[-3000:]
    assert (slurm_run.workdir / SWEEP_OUT).is_file()
