"""Containers, clusters and several hosts: which image, environment and cluster resources each job
gets, partial plans for one host's share, and a real CPU job inside the CPU image (Podman)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import prewarmed
import pyarrow.parquet as pq
import pytest
import yaml
from dag import PROFILES, ROOT, copy_workflow, planned_jobs, snakemake

IMAGES = {"cpu": "images/decodelab-cpu.sif", "cuda": "images/decodelab-cuda.sif"}
EVERY_BACKEND = "assume_available=[cpu,cuda,mps]"


def job_plan(workdir: Path, *config: str, configfile: Path | None = None,
             sdm: str | None = None) -> list[dict]:
    args = [str(ROOT / "tests/job_plan.py"), str(workdir)]
    args += ["--configfile", str(configfile)] if configfile else []
    args += ["--sdm", sdm] if sdm else []
    args += ["--config", *config] if config else []
    proc = prewarmed.run(args, Path.cwd(), dict(os.environ), timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def devices_of(job: dict, config: dict) -> set[str]:
    wildcards = job["wildcards"]
    if "backend" in wildcards:
        return {wildcards["backend"]}
    if "pair" in wildcards:
        pair = config["speculative"]["pairs"][wildcards["pair"]]
        return {pair["target_device"], pair["draft_device"]}
    if "model" in wildcards:
        return {config["models"][wildcards["model"]].get("device", "cpu")}
    return {"cpu"}


def expected_image(job: dict, config: dict) -> str | None:
    devices = devices_of(job, config)
    if job["rule"] in ("all", "paper") or "mps" in devices:
        return None
    return IMAGES["cuda" if "cuda" in devices else "cpu"]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_each_job_gets_the_image_of_its_devices_and_mps_none(workdir, profile):
    config = yaml.safe_load(profile.read_text())
    jobs = job_plan(workdir, EVERY_BACKEND, configfile=profile)
    planned = set().union(*(devices_of(j, config) for j in jobs))
    assert planned == set(config["backends"])
    for job in jobs:
        assert job["container"] == expected_image(job, config), job
        if job["rule"] in ("sweep", "parallelism", "speculative", "verify_real"):
            devices = devices_of(job, config)
            backend = next(b for b in ("mps", "cuda", "cpu") if b in devices)
            assert job["conda"] == f"{backend}.yaml", job


def test_without_apptainer_no_job_runs_in_a_container(workdir):
    jobs = job_plan(workdir, EVERY_BACKEND)
    assert any(j["container"] for j in jobs)
    assert not any(j["runs_in"] for j in jobs)
    (workdir / "images").mkdir()
    for image in IMAGES.values():
        (workdir / image).touch()
    inside = job_plan(workdir, EVERY_BACKEND, sdm="apptainer")
    assert [j["runs_in"] for j in inside] == [j["container"] for j in inside]


def test_a_missing_image_under_apptainer_is_named(workdir):
    out = snakemake(workdir, "-n", "--sdm", "apptainer", "--config", "backends=[cpu]",
                    check=False)
    said = out.stdout + out.stderr
    assert out.returncode != 0
    assert "containers.cpu" in said and "images/decodelab-cpu.sif" in said


def test_the_image_reference_comes_from_config(workdir):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["containers"] = {"cpu": "docker://example.org/decodelab-cpu:0.1.0",
                            "cuda": "oras://example.org/decodelab-cuda:0.1.0"}
    path = workdir / "registry.yaml"
    path.write_text(yaml.safe_dump(config))
    jobs = job_plan(workdir, EVERY_BACKEND, configfile=path)
    images = {j["container"] for j in jobs}
    assert images == {None, *config["containers"].values()}


def test_an_unknown_containers_key_is_rejected(workdir):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["containers"] = {"cpu": "a.sif", "rocm": "b.sif"}
    path = workdir / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    out = snakemake(workdir, "-n", "--configfile", str(path), check=False)
    assert out.returncode != 0 and "rocm" in out.stderr + out.stdout


@pytest.mark.parametrize("env_file", sorted((ROOT / "envs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_conda_env_gets_decodelab_after_creation(env_file):
    """Snakemake runs <env>.post-deploy.sh in a new environment; the rules need `decodelab`."""
    script = env_file.with_name(env_file.stem + ".post-deploy.sh")
    assert "pip install --quiet --no-deps -e ." in script.read_text()


# --- One host's share of the DAG ---------------------------------------------------------------

def test_backends_cpu_plans_only_cpu_jobs(workdir):
    jobs = job_plan(workdir, EVERY_BACKEND, "backends=[cpu]")
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert {"sweep", "speculative", "parallelism"} <= {j["rule"] for j in jobs}
    assert set().union(*(devices_of(j, config) for j in jobs)) == {"cpu"}


def test_a_named_host_writes_under_its_own_tree(workdir):
    jobs = job_plan(workdir, EVERY_BACKEND, "backends=[mps]", "host=mac-m2")
    hosts = {j["wildcards"]["host"] for j in jobs if "host" in j["wildcards"]}
    assert hosts == {"mac-m2", "combined"}  # combined: the merged tables and figures
    assert {j["wildcards"]["backend"] for j in jobs if j["rule"] == "sweep"} == {"mps"}


def test_omit_from_merge_hosts_stops_at_the_hosts_own_tables(workdir):
    out = snakemake(workdir, "-n", "--omit-from", "merge_hosts", "--config", "backends=[cpu]")
    jobs = planned_jobs(out.stdout)
    assert {"statistics", "regimes", "regime_depth", "speculative_stats", "figures"} <= set(jobs)
    assert not {"merge_hosts", "paper", "all"} & set(jobs)


def test_until_stops_at_the_named_rule(workdir):
    out = snakemake(workdir, "-n", "--until", "collect", "--config", "backends=[cpu]")
    assert set(planned_jobs(out.stdout)) == {"prepare_model", "sweep", "collect"}


def test_one_hosts_measurements_stop_before_statistics(workdir):
    """The README's command for a device host's share: measure and collect, nothing after."""
    out = snakemake(workdir, "-n", "--until", "collect", "speculative", "parallelism",
                    "verify_real", "--config", "host=mac", "backends=[mps,cpu]",
                    "assume_available=[mps]")
    assert set(planned_jobs(out.stdout)) == {"prepare_model", "sweep", "collect", "speculative",
                                             "parallelism", "verify_real"}
    assert "results/mac/mps/sweep/" in out.stdout


def test_a_backend_missing_here_is_planned_only_when_assumed(workdir):
    if sys.platform == "darwin":
        pytest.skip("needs a host without MPS")
    config = ("backends=[cpu,mps]",)
    assert not any(j["rule"] == "sweep" and j["wildcards"]["backend"] == "mps"
                   for j in job_plan(workdir, *config))
    assert any(j["rule"] == "sweep" and j["wildcards"]["backend"] == "mps"
               for j in job_plan(workdir, *config, "assume_available=[mps]"))


# --- SLURM ---------------------------------------------------------------------------------------

SLURM = ("--workflow-profile", "profiles/slurm")


def dry_run_jobs(output: str) -> list[dict]:
    """Rule, wildcards and resources of each job block of a dry run."""
    parts = re.split(r"^rule (\w+):$", output, flags=re.M)
    jobs = []
    for rule, block in zip(parts[1::2], parts[2::2], strict=True):
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, re.M))
        jobs.append({
            "rule": rule,
            "wildcards": dict(kv.split("=", 1) for kv in fields.get("wildcards", "").split(", ")
                              if kv),
            "resources": dict(kv.split("=", 1) for kv in fields.get("resources", "").split(", ")
                              if kv),
        })
    return jobs


def test_slurm_profile_asks_a_gpu_of_the_model_for_cuda_jobs_only(workdir):
    out = snakemake(workdir, "-n", *SLURM, "--config", "cluster=slurm", "backends=[cpu,cuda]",
                    "gpu_model=h100")
    jobs = dry_run_jobs(out.stdout)
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert {j["rule"] for j in jobs} >= {"sweep", "speculative", "verify_real", "paper"}
    for job in jobs:
        resources = job["resources"]
        assert int(resources["runtime"]) > 0 and int(resources["mem_mb"]) > 0
        cuda = "cuda" in devices_of(job, config)
        assert int(resources.get("gpu", 0)) == int(cuda), job
        assert resources.get("gpu_model", "") == ("h100" if cuda else ""), job


def test_slurm_partitions_send_gpu_jobs_to_gpu_and_cpu_jobs_to_cpu():
    from snakemake_executor_plugin_slurm.partitions import get_best_partition, read_partition_file

    class Job:
        def __init__(self, **resources):
            self.resources = resources
            self.threads = 1
            self.name = "job"

        def is_group(self):
            return False

    class Logger:
        def __getattr__(self, _):
            return lambda *a, **k: None

    partitions = read_partition_file(ROOT / "profiles/slurm/partitions.yaml")
    gpu_job = Job(gpu=1, gpu_model="h100", runtime=240, mem_mb=32000)
    cpu_job = Job(gpu=0, runtime=240, mem_mb=32000)
    assert get_best_partition(partitions, gpu_job, Logger()) == "gpu"
    assert get_best_partition(partitions, cpu_job, Logger()) == "cpu"


def test_mps_under_slurm_is_refused_with_a_clear_message(workdir):
    out = snakemake(workdir, "-n", *SLURM, "--config", "cluster=slurm", check=False)
    said = out.stdout + out.stderr
    assert out.returncode != 0
    assert "'mps'" in said and "no SLURM cluster has Apple MPS" in said
    assert "Job stats" not in out.stdout


def test_on_a_cluster_only_all_and_paper_stay_where_snakemake_runs(workdir):
    jobs = job_plan(workdir, "cluster=slurm", "backends=[cpu,cuda]")
    assert {j["rule"] for j in jobs if j["local_rule"]} == {"all", "paper"}


def test_slurm_profile_sets_cluster_and_the_executor():
    profile = yaml.safe_load((ROOT / "profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "slurm"
    assert "cluster=slurm" in profile["config"]
    assert (ROOT / profile["slurm-partition-config"]).is_file()


# --- A real CPU job inside the CPU image and the CUDA image (Podman) --------------------------

PODMAN_CONF = ROOT / "envs/podman/containers.conf"
LOCAL_IMAGE = "localhost/decodelab-cpu:local"
CUDA_IMAGE = "localhost/decodelab-cuda:local"
TINY_MODEL = {"source": "init", "preset": "gpt2-tiny", "seed": 1}
TINY_SWEEP = {"budgets": [4, 8], "prompt_lengths": [8], "dtype": "float32", "inner_repeats": 1,
              "warmup": 1, "seed": 1}


def podman_env() -> dict:
    return {**os.environ, "CONTAINERS_CONF": str(PODMAN_CONF)}


def why_no_podman() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (`make container-image` installs it with apt as root)"
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, env=podman_env())
    if info.returncode != 0:
        return f"podman does not work here: {info.stderr.strip()[-300:]}"
    if os.geteuid() != 0 and shutil.which("debootstrap") is None:
        return "building the local base needs root and debootstrap"
    return None


@pytest.fixture(scope="module")
def cpu_image() -> str:
    reason = why_no_podman()
    if reason:
        pytest.skip(reason)
    build = subprocess.run([str(ROOT / "envs/build-local.sh")], capture_output=True, text=True,
                           env={**podman_env(), "IMAGE": LOCAL_IMAGE}, timeout=1800)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return LOCAL_IMAGE


@pytest.fixture(scope="module")
def cuda_image() -> str:
    """Built only by `make cuda-image` (GBs of CUDA wheels): taken as it is, never built here."""
    reason = why_no_podman()
    if reason:
        pytest.skip(reason)
    exists = subprocess.run(["podman", "image", "exists", CUDA_IMAGE], env=podman_env())
    if exists.returncode != 0:
        pytest.skip(f"{CUDA_IMAGE} is not built (`make cuda-image` builds it)")
    stale = why_stale(CUDA_IMAGE)
    if stale:
        pytest.skip(f"{CUDA_IMAGE} {stale}: `make cuda-image` rebuilds it")
    return CUDA_IMAGE


def why_stale(image: str) -> str:
    """'' when the image was built from the source here (its DECODELAB_GIT_COMMIT, stamped by
    envs/build-local.sh), else why not: an image of other code would fail the schema test for
    a reason that is not the code under test."""
    env = subprocess.run(["podman", "image", "inspect", image, "--format",
                          "{{range .Config.Env}}{{println .}}{{end}}"], capture_output=True,
                         text=True, env=podman_env()).stdout
    commit = next((line.split("=", 1)[1] for line in env.splitlines()
                   if line.startswith("DECODELAB_GIT_COMMIT=")), "unknown")
    if commit == "unknown" or commit.endswith("-dirty"):
        return f"was built from an unknown or uncommitted source ({commit})"
    same = subprocess.run(["git", "diff", "--quiet", commit, "--", "src", "pyproject.toml",
                           "requirements.lock"], cwd=ROOT, capture_output=True)
    return "" if same.returncode == 0 else f"was built from commit {commit[:12]}, not this source"


def sweep_commands(models: str, out: str) -> list[list[str]]:
    return [
        ["decodelab", "prepare-model", "--spec", json.dumps(TINY_MODEL), "--threads", "1",
         "--out", f"{models}/gpt2-tiny"],
        ["decodelab", "sweep", "--model-dir", f"{models}/gpt2-tiny", "--model", "gpt2-tiny",
         "--backend", "cpu", "--experiment", "sweep", "--repeat", "0", "--threads", "1",
         "--spec", json.dumps(TINY_SWEEP), "--out", out],
    ]


@pytest.mark.container
@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_a_cpu_sweep_in_the_image_writes_the_hosts_schema(kind, request, tmp_path):
    image = request.getfixturevalue(f"{kind}_image")
    bindir = Path(sys.executable).parent
    for cmd in sweep_commands(str(tmp_path / "host-models"), str(tmp_path / "host.parquet")):
        subprocess.run([str(bindir / cmd[0]), *cmd[1:]], check=True, capture_output=True)
    for cmd in sweep_commands("models", "container.parquet"):
        run = subprocess.run(["podman", "run", "--rm", "--network", "none",
                              "-v", f"{tmp_path}:/work", "-w", "/work", image, *cmd],
                             capture_output=True, text=True, env=podman_env(), timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]

    host, inside = tmp_path / "host.parquet", tmp_path / "container.parquet"
    assert pq.read_schema(inside).equals(pq.read_schema(host), check_metadata=False)
    host_rows, inside_rows = pd.read_parquet(host), pd.read_parquet(inside)
    assert inside_rows.dtypes.to_dict() == host_rows.dtypes.to_dict()
    assert len(inside_rows) == len(host_rows) > 0
    same = ["transformers", "backend", "config_hash", "budget", "tokens_generated"]
    pd.testing.assert_frame_equal(inside_rows.sort_values("budget")[same].reset_index(drop=True),
                                  host_rows.sort_values("budget")[same].reset_index(drop=True))
    assert inside_rows["git_commit"].iloc[0] != "unknown"
    version, _, build = inside_rows["torch"].iloc[0].partition("+")  # 2.13.0+cpu, 2.13.0+cu130
    assert version == host_rows["torch"].iloc[0].partition("+")[0]
    assert build.startswith("cu" if kind == "cuda" else "cpu"), build


@pytest.mark.container
def test_snakemake_runs_the_cpu_rules_in_the_image_under_sdm_apptainer(cpu_image, tmp_path):
    """Snakemake's own apptainer path; `apptainer` is played by Podman (fake_apptainer.sh)."""
    workdir = copy_workflow(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").symlink_to(ROOT / "tests/fake_apptainer.sh")
    (workdir / "images").mkdir()
    (workdir / IMAGES["cpu"]).write_text(cpu_image)
    (workdir / IMAGES["cuda"]).write_text("unused")
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config |= {"host": "box", "backends": ["cpu"],
               "sweep": config["sweep"] | {k: v for k, v in TINY_SWEEP.items() if k != "seed"}
               | {"models": ["gpt2-tiny"], "repeats": 1}}
    (workdir / "tiny.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "apptainer.log"
    env = {**podman_env(), "FAKE_APPTAINER_LOG": str(log),
           "PATH": f"{bindir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
                   f"{os.environ['PATH']}"}
    target = "results/box/cpu/sweep/gpt2-tiny/rep0.parquet"
    run = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--sdm", "apptainer",
                          "--configfile", "tiny.yaml", "--cores", "2", target],
                         cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all(IMAGES["cpu"] in c and "--nv" in c for c in calls)
    assert "decodelab prepare-model" in calls[0] and "decodelab sweep" in calls[1]
    image_python = subprocess.run(
        ["podman", "run", "--rm", cpu_image, "python3", "-c",
         "import platform; print(platform.python_version())"],
        env=podman_env(), capture_output=True, text=True, check=True).stdout.strip()
    rows = pd.read_parquet(workdir / target)
    assert set(rows["python"]) == {image_python}
