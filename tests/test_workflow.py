"""The DAG: config validation, dry runs of every profile, and the default run end to end."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dag import (
    HOST,
    PROFILES,
    ROOT,
    copy_workflow,
    e2e_config,
    e2e_configfile,
    other_host,
    planned_jobs,
    snakemake,
    write_config,
)

from decodelab.core.probe import backend_available


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


def test_sweep_attention_backends_reach_the_sweep_jobs_and_bad_ones_are_rejected(workdir):
    sweep = yaml.safe_load((ROOT / "config.yaml").read_text())["sweep"]
    config = write_config(workdir, sweep=sweep | {"sdp_backends": ["flash", "math"]})
    out = snakemake(workdir, "-n", "-p", "--configfile", str(config))
    assert '"sdp_backends": ["flash", "math"]' in out.stdout
    config = write_config(workdir, sweep=sweep | {"sdp_backends": ["cudnnn"]})
    out = snakemake(workdir, "-n", "--configfile", str(config), check=False)
    assert out.returncode != 0 and "cudnnn" in out.stderr + out.stdout


def test_speculative_attention_backends_reach_level_three(workdir):
    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    out = snakemake(workdir, "-n", "-p", "--configfile", str(write_config(workdir)))
    assert "decodelab verify --level real" in out.stdout and "--sdp-backends" not in out.stdout
    speculative = base["speculative"] | {"sdp_backends": ["flash", "math"]}
    out = snakemake(workdir, "-n", "-p", "--configfile",
                    str(write_config(workdir, speculative=speculative)))
    real = [line for line in out.stdout.splitlines() if "verify --level real" in line]
    assert real and all("""--sdp-backends '["flash", "math"]'""" in line for line in real)


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
def test_default_dag_runs_to_the_pdf_and_reruns_only_what_changed(default_dag, default_report):
    workdir = default_dag
    pdf = workdir / "results/paper/paper.pdf"
    assert pdf.stat().st_size > 20_000
    log = (workdir / "results/paper/build/paper.log").read_text(errors="replace")
    included = set(re.findall(r"<figures/(\w+)\.pdf", log))
    assert included == {"latency", "kv_speedup", "acceptance", "speedup", "parallelism", "theory",
                        "verification_tokens", "verification_pvalues", "regime_depth",
                        "changepoints", "long_acceptance", "long_speedup", "long_cost",
                        "batched_speedup", "batched_overhead"}

    e2e = e2e_configfile(workdir)
    again = snakemake(workdir, "-n", "--configfile", e2e)
    assert "Nothing to be done" in again.stdout + again.stderr

    base = e2e_config()
    stats = base["stats"] | {"confidence": 0.9}
    changed = snakemake(workdir, "-n", "--configfile",
                        str(write_config(workdir, base, stats=stats)))
    rerun = set(planned_jobs(changed.stdout))
    assert {"statistics", "speculative_stats", "paper"} <= rerun
    assert rerun <= {"statistics", "speculative_stats", "selection", "figures",
                     "speculative_figures", "verification_figures", "reference_comparison",
                     "quantized_stats", "quantized_figures", "long_stats", "long_figures",
                     "batched_stats", "batched_figures", "merge_hosts", "settings", "paper",
                     "all"}

    added = set(re.findall(r"Adding (\S+) \(", default_report.stderr + default_report.stdout))
    assert {f"{fig}.png" for fig in included} | {"paper.pdf", "benchmarks.csv"} <= added
    bench = (workdir / "results/combined/stats/benchmarks.csv").read_text()
    assert re.search(r"^prepare_model,6,6,", bench, re.M)  # every measuring rule benchmarked

    regimes = base["regimes"]
    regimes["changepoints"] = {**regimes["changepoints"], "penalty": 8.0}
    changed = snakemake(workdir, "-n", "--configfile",
                        str(write_config(workdir, base, regimes=regimes)))
    rerun = set(planned_jobs(changed.stdout))
    assert "regime_depth" in rerun and "regimes" not in rerun  # the spike rule stays
    assert rerun <= {"regime_depth", "merge_hosts", "figures", "speculative_figures",
                     "verification_figures", "quantized_figures", "long_figures",
                     "batched_figures", "settings", "paper", "all"}  # nothing measured


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


# -----------------------------------------------------------------------------
# a finished tree (every output present and up to date, files empty): what runs next

DOWNSTREAM = {"merge_hosts", "figures", "speculative_figures", "verification_figures",
              "quantized_figures", "long_figures", "batched_figures", "paper", "all"}
MEASURING = {"prepare_model", "sweep", "speculative", "parallelism", "verify_cost", "gguf", "long",
             "batched", "verify_exact", "verify_monte_carlo", "verify_real", "verify_long",
             "model_table"}
FIGURES = ["latency", "kv_speedup", "acceptance", "speedup", "parallelism", "theory",
           "verification_tokens", "verification_pvalues", "regime_depth", "changepoints"]


def all_outputs(workdir: Path, config: Path) -> list[tuple[str, str]]:
    """(path, rule) of every output of the DAG, from `snakemake --summary`."""
    out = snakemake(workdir, "--summary", "--configfile", str(config)).stdout
    rows = [line.split("\t") for line in out.splitlines()[1:] if "\t" in line]
    return [(r[0], r[2]) for r in rows]


@pytest.fixture(scope="module")
def finished_tree(tmp_path_factory) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("finished"))
    config = write_config(root, host=HOST)
    for path, rule in all_outputs(root, config):
        target = root / path
        if rule == "prepare_model":
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
    snakemake(root, "--touch", "--configfile", str(config))
    assert "Nothing to be done" in snakemake(root, "-n", "--configfile", str(config)).stdout
    return root


@pytest.fixture
def finished(finished_tree, tmp_path) -> Path:
    dest = tmp_path / "tree"
    shutil.copytree(finished_tree, dest, symlinks=True)
    return dest


def decodelab(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("decodelab"))
    proc = subprocess.run([exe, *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return proc


def test_importing_a_host_plans_only_downstream_rules(finished, tmp_path):
    decodelab("import", "--from", str(other_host(tmp_path / "mac")), "--host", "mac",
              "--results", str(finished / "results"))
    config = write_config(finished, host=HOST, hosts=["mac"])
    jobs = planned_jobs(snakemake(finished, "-n", "--configfile", str(config)).stdout)
    assert "merge_hosts" in jobs and "paper" in jobs
    assert set(jobs) <= DOWNSTREAM, set(jobs) - DOWNSTREAM
    assert jobs["figures"] == 1  # the merged figures only; this host's stay as they are


def test_a_listed_host_that_was_not_imported_is_an_error(finished):
    config = write_config(finished, host=HOST, hosts=["mac"])
    out = snakemake(finished, "-n", "--configfile", str(config), check=False)
    assert out.returncode != 0
    assert "results/mac/stats/environment.csv" in out.stderr + out.stdout
    assert "decodelab import" in out.stderr + out.stdout


def paper_rules() -> list[str]:
    makefile = (ROOT / "Makefile").read_text()
    rules = re.search(r"^PAPER_RULES := (.*?)(?<!\\)\n", makefile, re.M | re.S).group(1)
    return rules.replace("\\\n", " ").split()


def test_make_paper_never_measures_even_without_models(finished):
    assert not set(paper_rules()) & MEASURING
    shutil.rmtree(finished / "results/models")
    config = write_config(finished, host=HOST)
    (finished / f"results/{HOST}/runs.parquet").write_text("x")  # the statistics are stale
    out = snakemake(finished, "-n", "--configfile", str(config), "--allowed-rules",
                    *paper_rules())
    jobs = planned_jobs(out.stdout)
    assert {"statistics", "regimes", "paper"} <= set(jobs)
    assert set(jobs) <= set(paper_rules()) - MEASURING

    raw = finished / f"results/{HOST}/cpu/sweep/gpt2-tiny/rep0.parquet"
    raw.unlink()  # a measurement is missing: recollecting would train and measure again
    again = ("-n", "--configfile", str(config), "--forcerun", "collect")
    plain = planned_jobs(snakemake(finished, *again).stdout)
    assert "prepare_model" in plain and "sweep" in plain
    paper = snakemake(finished, *again, "--allowed-rules", *paper_rules(), check=False)
    if paper.returncode == 0:  # the missing file is taken as given, nothing is measured
        assert set(planned_jobs(paper.stdout)) <= set(paper_rules()) - MEASURING
    else:  # or refused, naming it
        assert "rep0.parquet" in paper.stdout + paper.stderr


def test_report_has_every_figure_and_table_by_category(finished):
    config = write_config(finished, host=HOST)
    out = snakemake(finished, "--report", "report.html", "--configfile", str(config))
    added = set(re.findall(r"Adding (\S+) \(", out.stderr + out.stdout))
    assert {f"{fig}.png" for fig in FIGURES} <= added
    assert {"paper.pdf", "latency.csv", "reference_comparison.csv", "benchmarks.csv",
            "hosts.csv", "verification_levels.csv", "speculative_speedup.csv"} <= added
    html = (finished / "report.html").read_text()
    for category in ("Decode regimes", "KV cache", "Speculative", "Verification", "Paper",
                     "Benchmarks"):
        assert category in html, category
