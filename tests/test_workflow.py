"""The DAG: config validation, dry runs of every profile, and the default run end to end."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from decodelab.devices import backend_available

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PROFILES = [ROOT / "config.yaml", *sorted((ROOT / "config").glob("*.yaml"))]
WORKFLOW_FILES = ["Snakefile", "config.yaml", "config", "workflow", "paper", "profiles", "envs"]


def copy_workflow(dest: Path) -> Path:
    for name in WORKFLOW_FILES:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([SNAKEMAKE, *args], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=1800)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def planned_jobs(dry_run_output: str) -> dict[str, int]:
    """Rule -> count from the 'Job stats' table of a dry run."""
    table = dry_run_output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


@pytest.fixture
def workdir(tmp_path):
    return copy_workflow(tmp_path)


def write_config(workdir: Path, **changes) -> Path:
    config = yaml.safe_load((ROOT / "config.yaml").read_text()) | changes
    path = workdir / "changed.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def swept_backends(profile: Path) -> list[str]:
    config = yaml.safe_load(profile.read_text())
    return config["sweep"].get("backends", config["backends"])


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_profile_dry_runs(workdir, profile):
    out = snakemake(workdir, "-n", "--configfile", str(profile), check=False)
    if not any(backend_available(b) for b in swept_backends(profile)):
        assert out.returncode != 0 and "config 'sweep.backends'" in out.stderr + out.stdout
        return
    assert out.returncode == 0, out.stderr
    jobs = planned_jobs(out.stdout)
    assert jobs["paper"] == 1 and jobs["sweep"] > 0


def test_ablation_models_limit_the_cache_off_jobs(workdir):
    sweep = yaml.safe_load((ROOT / "config.yaml").read_text())["sweep"]
    config = write_config(workdir, sweep=sweep | {"ablation_models": ["opt-tiny"], "repeats": 2})
    jobs = planned_jobs(snakemake(workdir, "-n", "--configfile", str(config)).stdout)
    assert jobs["sweep"] == 2 * len(sweep["models"]) + 2
    config = write_config(workdir, sweep=sweep | {"ablation_models": ["target"]})
    out = snakemake(workdir, "-n", "--configfile", str(config), check=False)
    assert out.returncode != 0 and "'sweep.ablation_models'" in out.stderr + out.stdout


def test_unknown_key_is_rejected_before_any_job_naming_the_key(workdir):
    config = write_config(workdir, budgetz=[8])
    out = snakemake(workdir, "-n", "--configfile", str(config), check=False)
    assert out.returncode != 0
    assert "budgetz" in out.stderr + out.stdout
    assert "Job stats" not in out.stdout


def test_bad_value_is_rejected_naming_the_value(workdir):
    config = write_config(workdir, backends=["cpu", "tpu"])
    out = snakemake(workdir, "-n", "--configfile", str(config), check=False)
    assert out.returncode != 0 and "tpu" in out.stderr + out.stdout


def test_budget_past_the_position_table_is_rejected_before_any_job(workdir):
    sweep = yaml.safe_load((ROOT / "config.yaml").read_text())["sweep"] | {"budgets": [8, 1020]}
    out = snakemake(workdir, "-n", "--configfile", str(write_config(workdir, sweep=sweep)),
                    check=False)
    assert out.returncode != 0 and "positions" in out.stderr + out.stdout


def test_missing_backend_is_skipped_or_an_error_with_strict(workdir):
    if sys.platform == "darwin":
        pytest.skip("needs a host without MPS")
    lenient = snakemake(workdir, "-n", "--configfile",
                        str(write_config(workdir, backends=["cpu", "mps"])))
    assert "skipping backend 'mps'" in lenient.stderr
    strict = snakemake(workdir, "-n", "--configfile",
                       str(write_config(workdir, backends=["cpu", "mps"], strict=True)),
                       check=False)
    assert strict.returncode != 0 and "'mps'" in strict.stderr + strict.stdout


@pytest.mark.e2e
def test_default_dag_runs_to_the_pdf_and_reruns_only_what_changed(workdir):
    snakemake(workdir)
    pdf = workdir / "results/paper/paper.pdf"
    assert pdf.stat().st_size > 20_000
    log = (workdir / "results/paper/build/paper.log").read_text(errors="replace")
    included = set(re.findall(r"<figures/(\w+)\.pdf", log))
    assert included == {"latency", "kv_speedup", "acceptance", "speedup", "parallelism", "theory",
                        "verification_tokens", "verification_pvalues", "regime_depth",
                        "changepoints"}

    again = snakemake(workdir, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr

    stats = yaml.safe_load((ROOT / "config.yaml").read_text())["stats"] | {"confidence": 0.9}
    changed = snakemake(workdir, "-n", "--configfile", str(write_config(workdir, stats=stats)))
    rerun = set(planned_jobs(changed.stdout))
    assert {"statistics", "speculative_stats", "paper"} <= rerun
    assert rerun <= {"statistics", "speculative_stats", "figures", "speculative_figures",
                     "settings", "paper", "all"}

    regimes = yaml.safe_load((ROOT / "config.yaml").read_text())["regimes"]
    regimes["changepoints"] = {**regimes["changepoints"], "penalty": 8.0}
    changed = snakemake(workdir, "-n", "--configfile", str(write_config(workdir, regimes=regimes)))
    rerun = set(planned_jobs(changed.stdout))
    assert "regime_depth" in rerun and "regimes" not in rerun  # the spike rule stays
    assert rerun <= {"regime_depth", "figures", "settings", "paper", "all"}


def test_changepoint_segments_too_short_for_a_line_are_refused(workdir):
    regimes = yaml.safe_load((ROOT / "config.yaml").read_text())["regimes"]
    regimes["changepoints"] = {**regimes["changepoints"], "model": "linear", "min_size": 2}
    out = snakemake(workdir, "-n", "--configfile", str(write_config(workdir, regimes=regimes)),
                    check=False)
    assert out.returncode != 0 and "regimes.changepoints.min_size" in out.stderr + out.stdout


@pytest.mark.parametrize("env_file", sorted((ROOT / "envs").glob("*.yaml")), ids=lambda p: p.name)
def test_conda_env_pins_equal_requirements_lock(env_file):
    env = yaml.safe_load(env_file.read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    pins = [line for line in pip if not line.startswith("--")]  # index options are not pins
    lock = [line for line in (ROOT / "requirements.lock").read_text().splitlines() if line]
    assert pins == lock
