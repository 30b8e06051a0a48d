"""The workflow for tests: a copy of it to run in, `snakemake` runs in that copy, configs written
beside it, the jobs a dry run plans, and the default DAG's end-to-end sizes."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import prewarmed
import yaml
from fixtures import host_dir

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PROFILES = [ROOT / "config.yaml", *sorted((ROOT / "config").glob("*.yaml"))]
WORKFLOW_FILES = ["Snakefile", "config.yaml", "config", "workflow", "paper", "profiles", "envs"]
HOST = "testhost"


def copy_workflow(dest: Path) -> Path:
    for name in WORKFLOW_FILES:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 1800
              ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = prewarmed.run([SNAKEMAKE, *args], workdir, env, timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def planned_jobs(dry_run_output: str) -> dict[str, int]:
    """Rule -> count from the 'Job stats' table of a dry run."""
    table = dry_run_output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def write_config(workdir: Path, base: dict | None = None, **changes) -> Path:
    config = (base or yaml.safe_load((ROOT / "config.yaml").read_text())) | changes
    path = workdir / "changed.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# The default DAG as the end-to-end test runs it: config.yaml, every rule and key, at a fraction of
# its sizes (fewer budgets, repeats, training steps and draws). `make reproduce` runs it whole,
# 13.5 minutes on this quiet 2-core VM, too long for CI beside the rest of the tests.
E2E_SIZES = {
    "models": {"target": {"steps": 300}, "draft": {"steps": 200}, "long-target": {"steps": 40}},
    "sweep": {"budgets": [8, 16, 32, 48, 64, 96], "repeats": 2},
    "speculative": {"ks": [1, 2, 4], "prompts": 2, "repeats": 2,
                    "parallelism": {"ks": [1, 4, 16], "inner": 2}},
    "long": {"kv_budgets": [32], "documents": 2,
             "verification": {"tokens": 256, "power_tokens": 256, "seeds": 2}},
    "batched": {"rounds": 1},
    "verification": {"seeds": 3, "exact": {"random_pairs": 50, "real_positions": 60},
                     "monte_carlo": {"draws": 2000, "block_draws": 1000},
                     "real": {"tokens": 2000, "prompts": 4, "power_tokens": 400,
                              "greedy_prompts": 8}},
}


def merged(base: dict, changes: dict) -> dict:
    return {**base, **{key: merged(base[key], value) if isinstance(value, dict) else value
                       for key, value in changes.items()}}


def e2e_config() -> dict:
    return merged(yaml.safe_load((ROOT / "config.yaml").read_text()), E2E_SIZES)


def e2e_configfile(workdir: Path) -> str:
    path = workdir / "e2e.yaml"
    path.write_text(yaml.safe_dump(e2e_config()))
    return str(path)


def other_host(root: Path) -> Path:
    return host_dir(root, backends=("mps",), pairs=("mps-mps",))
