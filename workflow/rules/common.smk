# Shared helpers: backends that run here and those skipped, position tables, job settings as CLI
# arguments. The host and the names were checked before (names.smk).
import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

from decodelab.devices import backend_available, why_unavailable
from decodelab.errors import DecodelabError
from decodelab.models import (
    PRESETS,
    declared_positions,
    max_positions,
    position_overrun,
    preset_config,
)


def check_cluster_backends():
    if config["cluster"] == "slurm" and "mps" in config["backends"]:
        raise WorkflowError(
            "config 'backends' lists 'mps', but the slurm profile (config 'cluster: slurm') runs "
            "jobs on cluster nodes and no SLURM cluster has Apple MPS: run the MPS rules on the "
            "Mac itself and pass backends='[cpu,cuda]' here (README: 'Containers, clusters and "
            "several hosts')"
        )


def planned_here(backend):
    """Plan a backend's jobs: present here, assumed by config, or on a cluster's nodes."""
    return (
        backend_available(backend)
        or backend in config["assume_available"]
        or config["cluster"] == "slurm"
    )


check_cluster_backends()
BACKENDS = [b for b in config["backends"] if planned_here(b)]
SKIPPED = [b for b in config["backends"] if b not in BACKENDS]
for _b in SKIPPED:
    if config["strict"]:
        raise WorkflowError(
            f"config 'backends' lists {_b!r}, which is not available on this host "
            f"({why_unavailable(_b)}); remove it or set strict: false"
        )
    print(f"decodelab: skipping backend {_b!r} on {HOST}: {why_unavailable(_b)}", file=sys.stderr)
if not BACKENDS:
    raise WorkflowError("none of the backends in config 'backends' is available on this host")

SWEEP = config["sweep"]
MODELS = SWEEP["models"]
EXPERIMENTS = ["sweep", "ablation"]
SPEC = config.get("speculative")
PAIRS = {}
SKIPPED_PAIRS = {}
if SPEC:
    for _name, _pair in SPEC["pairs"].items():
        _devices = {_pair["target_device"], _pair["draft_device"]}
        (PAIRS if _devices <= set(BACKENDS) else SKIPPED_PAIRS)[_name] = _pair


def teacher_dir(wildcards):
    teacher = config["models"][wildcards.model].get("teacher")
    return f"results/models/{teacher}" if teacher else []


def position_needs():
    """Model -> (tokens, why): the longest sequence any of its jobs builds."""
    needs = {}

    def need(model, tokens, why):
        if tokens > needs.get(model, (0, ""))[0]:
            needs[model] = (tokens, why)

    budget, prompt = max(SWEEP["budgets"]), max(SWEEP["prompt_lengths"])
    for name in MODELS:
        need(name, budget + prompt, f"config 'sweep' (budget {budget} + prompt length {prompt})")
    k, par = max(SPEC["ks"]), SPEC["parallelism"]
    spec_tokens = SPEC["prompt_len"] + SPEC["budget"] + k
    spec_why = (
        f"config 'speculative' (prompt_len {SPEC['prompt_len']} + budget "
        f"{SPEC['budget']} + K {k})"
    )
    par_k = max(par["ks"])
    par_why = f"config 'speculative.parallelism' (context {par['context']} + K {par_k} + 1)"
    for pair in SPEC["pairs"].values():
        need(pair["draft"], spec_tokens, spec_why)
        need(pair["target"], spec_tokens, spec_why)
        need(pair["target"], par["context"] + par_k + 1, par_why)  # only targets are timed
    return needs


def known_positions(name, spec):
    """A model's learned positions as far as the DAG can know them: None for `hf` (its job
    checks once downloaded) and for position schemes without a table (ALiBi)."""
    if spec["source"] == "init":
        if spec["preset"] not in PRESETS:
            raise WorkflowError(
                f"config 'models.{name}.preset': unknown preset "
                f"{spec['preset']!r}; known: {', '.join(PRESETS)}"
            )
        return max_positions(preset_config(spec["preset"]))
    if spec["source"] == "train":
        return spec["n_positions"]
    if spec["source"] == "local":
        config_json = Path(spec["path"]).expanduser() / "config.json"
        if not config_json.is_file():
            raise WorkflowError(
                f"config 'models.{name}.path': {spec['path']!r} has no "
                "config.json (expected a directory in Hugging Face format)"
            )
        try:
            return declared_positions(config_json)
        except DecodelabError as err:
            raise WorkflowError(f"config 'models.{name}.path': {err}") from None
    return None


def check_positions():
    """Fail before any job when a sequence would overrun a learned position table."""
    for name, spec in config["models"].items():
        positions = known_positions(name, spec)
        if name in POSITION_NEEDS:
            problem = position_overrun(name, positions, *POSITION_NEEDS[name])
            if problem:
                raise WorkflowError(problem)


POSITION_NEEDS = position_needs()
check_positions()


def as_arg(obj):
    """A settings dict as one shell-quoted JSON argument."""
    return shlex.quote(json.dumps(obj, sort_keys=True))


REGIME_RULE_KEYS = ("window", "threshold", "consistency", "alpha")
REGIME_DEPTH_TABLES = [
    "summary",
    "phases",
    "variance",
    "variance_summary",
    "memory",
    "changepoints",
    "changepoint_curves",
    "agreement",
    "kv_collapse",
    "onsets",
]


def regime_rule_spec():
    """The spike rule's settings only: a change-point setting does not rerun the rule."""
    return {k: config["regimes"][k] for k in REGIME_RULE_KEYS}


def check_changepoints():
    cp = config["regimes"]["changepoints"]
    if cp["model"] == "linear" and cp["min_size"] < 3:
        raise WorkflowError(
            "config 'regimes.changepoints.min_size': model 'linear' needs segments of at least 3"
            f" budgets (a line through 2 points has no residual), got {cp['min_size']}"
        )


check_changepoints()


def sweep_spec():
    keys = ("budgets", "prompt_lengths", "dtype", "inner_repeats", "warmup")
    optional = {k: SWEEP[k] for k in ("sdp_backends",) if k in SWEEP}  # old hashes stay valid
    return {**{k: SWEEP[k] for k in keys}, **optional, "seed": config["seed"]}


SWEEP_BACKENDS = [b for b in SWEEP.get("backends", BACKENDS) if b in BACKENDS]
if not SWEEP_BACKENDS:
    raise WorkflowError(
        f"none of config 'sweep.backends' ({', '.join(SWEEP['backends'])}) is "
        f"available on this host ({HOST})"
    )
ABLATION_MODELS = SWEEP.get("ablation_models", MODELS)


def raw_runs(wildcards):
    return [
        f"results/{HOST}/{backend}/{experiment}/{model}/rep{repeat}.parquet"
        for backend in SWEEP_BACKENDS
        for experiment in EXPERIMENTS
        for model in (MODELS if experiment == "sweep" else ABLATION_MODELS)
        for repeat in range(SWEEP["repeats"])
    ]


def paper_settings():
    return {
        "host": HOST,
        "backends": config["backends"],
        "shuffle_seed": config["seed"],
        **SWEEP,
        "models": {name: config["models"][name] for name in MODELS},  # the sweep's, with specs
        "regimes": config["regimes"],
        "stats": config["stats"],
        "speculative": SPEC,
        "verification": config["verification"],
    }


def speculative_spec():
    keys = (
        "ks",
        "modes",
        "temperature",
        "top_k",
        "top_p",
        "prompts",
        "prompt_len",
        "budget",
        "hf_assisted",
    )
    return {**{k: SPEC[k] for k in keys}, "seed": config["seed"]}


def pair_devices(wc):
    pair = PAIRS[wc.pair]
    return {pair["target_device"], pair["draft_device"]}


def parallelism_targets():
    """(backend, target model, dtype) for every configuration that runs here."""
    return sorted({(p["target_device"], p["target"], p["dtype"]) for p in PAIRS.values()})


def parallelism_spec(backend, model):
    dtype = next(d for b, m, d in parallelism_targets() if (b, m) == (backend, model))
    return {**SPEC["parallelism"], "dtype": dtype, "seed": config["seed"]}


def speculative_runs(wildcards):
    return expand(
        "results/{host}/speculative/{pair}/rep{repeat}.parquet",
        host=HOST,
        pair=list(PAIRS),
        repeat=range(SPEC["repeats"]),
    )


def parallelism_runs(wildcards):
    return [
        f"results/{HOST}/{backend}/parallelism/{model}/rep{r}.parquet"
        for backend, model, _ in parallelism_targets()
        for r in range(SPEC["repeats"])
    ]


VERIFY = config["verification"]
VERIFY_PAIRS = [p for p in VERIFY["pairs"] if p in PAIRS]
# The exact level reads real (p, q) rows from the first configuration's models.
VERIFY_MODELS = [SPEC["pairs"][VERIFY["pairs"][0]][role] for role in ("target", "draft")]


def verification_spec():
    return {**{k: v for k, v in VERIFY.items() if k != "pairs"}, "seed": config["seed"]}


def verification_reports(wildcards):
    return [
        f"results/{HOST}/verification/exact.json",
        f"results/{HOST}/verification/monte_carlo.json",
    ] + [f"results/{HOST}/verification/real_{pair}.json" for pair in VERIFY_PAIRS]


# Where each job runs: its devices pick the Apptainer image (`--sdm apptainer`) and the conda
# environment (`--sdm conda`). MPS jobs get no image: Metal is unreachable from a Linux container.
IMAGES = config["containers"]
USES_APPTAINER = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method


def job_devices(wildcards):
    """The devices a job runs on: its backend, its configuration's two devices, a train model's
    device, else the CPU."""
    names = wildcards.keys()
    if "backend" in names:
        return {wildcards.backend}
    if "pair" in names:
        return pair_devices(wildcards)
    if "model" in names:  # prepare_model: a train model trains on its `device`
        return {config["models"][wildcards.model].get("device", "cpu")}
    return {"cpu"}


def job_backend(wildcards):
    devices = job_devices(wildcards)
    return next(b for b in ("mps", "cuda", "cpu") if b in devices)


def job_container(wildcards):
    backend = job_backend(wildcards)
    return None if backend == "mps" else IMAGES[backend]


def job_conda_env(wildcards):
    return f"../../envs/{job_backend(wildcards)}.yaml"


def check_local_images():
    """Under --sdm apptainer, an image given as a file must exist before any job starts."""
    needed = {"cpu"} | ({"cuda"} & set(BACKENDS))
    for backend in sorted(needed):
        image = IMAGES[backend]
        if "://" not in image and not Path(image).exists():
            raise WorkflowError(
                f"config 'containers.{backend}': image {image!r} does not exist; build it "
                f"(envs/README.md) or run without --sdm apptainer"
            )


if USES_APPTAINER:
    check_local_images()


def job_gpu_model(wildcards):
    """The GPU model a CUDA job asks the cluster for; empty (none asked) for every other job."""
    return (config["gpu_model"] or "") if "cuda" in job_devices(wildcards) else ""


# On a cluster these run where snakemake runs: `all` does nothing and `paper` needs the host's TeX.
localrules:
    all,
    paper,


def imported_tables(wildcards):
    """The imported hosts' stats tables that exist: whatever their run produced."""
    return sorted(str(p) for host in IMPORTED for p in Path(f"results/{host}/stats").glob("*.csv"))


def reference_tables(wildcards):
    return sorted(str(p) for p in Path("results/reference").glob("*/stats/*.csv"))


def benchmark_file(output):
    return re.sub(r"\.(parquet|json)$", ".tsv", re.sub(r"^results/", "benchmarks/", output))


def measured_outputs(wildcards):
    return (
        raw_runs(wildcards)
        + speculative_runs(wildcards)
        + parallelism_runs(wildcards)
        + verification_reports(wildcards)
    )


def benchmark_files(wildcards):
    """Every measuring job's benchmark file: the raw outputs' paths under benchmarks/."""
    return [benchmark_file(p) for p in measured_outputs(wildcards)] + [
        f"benchmarks/prepare_model/{model}.tsv" for model in sorted(config["models"])
    ]


# Categories of the HTML report (`snakemake --report`) for the merged tables.
REPORT_CATEGORY = {
    "latency": "Decode regimes",
    "regimes": "Decode regimes",
    "kv_speedup": "KV cache",
    "models": "Speculative",
    "benchmarks": "Benchmarks",
    "environment": "Hosts and reference",
    "skipped": "Hosts and reference",
    "hosts": "Hosts and reference",
    "reference_comparison": "Hosts and reference",
}


def report_category(table):
    if table.startswith("speculative_"):
        return "Speculative"
    if table.startswith("verification_"):
        return "Verification"
    if table.startswith("regime_"):
        return "Decode regimes"
    return REPORT_CATEGORY.get(table, "Other tables")
