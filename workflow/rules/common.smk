# Shared helpers: backends that run here and those skipped, job settings as CLI arguments, where
# and on what each job runs. The host and the names were checked before (names.smk); every check
# is decodelab.config.settings's, run through `checked`.
import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod

from decodelab.core import tables
from decodelab.config.settings import (
    QUANT_TYPES,
    check_changepoints,
    check_cluster_backends,
    check_local_images,
    check_batched,
    check_long,
    check_model_sizes,
    check_positions,
    check_quantized,
    export_preflight,
    plan_backends,
    quantized_plan,
    sweep_backends,
)
from decodelab.core.probe import backend_available, why_unavailable
from decodelab.core.sizes import export_limits

checked(check_cluster_backends, SETTINGS)
BACKENDS, SKIPPED = checked(plan_backends, SETTINGS, backend_available, why_unavailable)
for _b in SKIPPED:
    print(f"decodelab: skipping backend {_b!r} on {HOST}: {why_unavailable(_b)}", file=sys.stderr)

SWEEP = SETTINGS.sweep
MODELS = list(SWEEP.models)
EXPERIMENTS = ["sweep", "ablation"]
SPEC = SETTINGS.speculative
# The configurations whose two devices this host has.
PAIRS = {name: pair for name, pair in SPEC.pairs.items() if pair.devices <= set(BACKENDS)}


def teacher_dir(wildcards):
    teacher = SETTINGS.models[wildcards.model].get("teacher")
    return f"results/models/{teacher}" if teacher else []


POSITION_NEEDS = SETTINGS.position_needs()
checked(check_positions, SETTINGS, POSITION_NEEDS)
# Every model whose shape is known here fits config 'limits'; the jobs check the others (an hf
# model's config.json) against the same limits, from the environment.
checked(check_model_sizes, SETTINGS)
export_limits(vars(SETTINGS.limits))


def as_arg(obj):
    """A settings dict as one shell-quoted JSON argument."""
    return shlex.quote(json.dumps(obj, sort_keys=True))


checked(check_changepoints, SETTINGS)
export_preflight(SETTINGS)
SWEEP_BACKENDS = checked(sweep_backends, SETTINGS, BACKENDS, HOST)
ABLATION_MODELS = list(SWEEP.ablation)


def raw_runs(wildcards):
    return [
        f"results/{HOST}/{backend}/{experiment}/{model}/rep{repeat}.parquet"
        for backend in SWEEP_BACKENDS
        for experiment in EXPERIMENTS
        for model in (MODELS if experiment == "sweep" else ABLATION_MODELS)
        for repeat in range(SWEEP.repeats)
    ]


def parallelism_targets():
    """(backend, target model, dtype) for every configuration that runs here."""
    return sorted({(p.target_device, p.target, p.dtype) for p in PAIRS.values()})


def parallelism_spec(backend, model):
    dtype = next(d for b, m, d in parallelism_targets() if (b, m) == (backend, model))
    return SPEC.parallelism_spec(dtype)


def speculative_runs(wildcards):
    return expand(
        "results/{host}/speculative/{pair}/rep{repeat}.parquet",
        host=HOST,
        pair=list(PAIRS),
        repeat=range(SPEC.repeats),
    )


def parallelism_runs(wildcards):
    return [
        f"results/{HOST}/{backend}/parallelism/{model}/rep{r}.parquet"
        for backend, model, _ in parallelism_targets()
        for r in range(SPEC.repeats)
    ]


VERIFY = SETTINGS.verification
VERIFY_PAIRS = [p for p in VERIFY.pairs if p in PAIRS]
# The exact level reads real (p, q) rows from the first configuration's models.
VERIFY_MODELS = [SPEC.pairs[VERIFY.pairs[0]].target, SPEC.pairs[VERIFY.pairs[0]].draft]


def verification_reports(wildcards):
    return (
        [
            f"results/{HOST}/verification/exact.json",
            f"results/{HOST}/verification/monte_carlo.json",
        ]
        + [f"results/{HOST}/verification/real_{pair}.json" for pair in VERIFY_PAIRS]
        + long_verification_reports()
    )


def long_verification_reports():
    """The long-context pair's report (verify_long), where config 'long.verification' is
    given and this host has config 'long.device'."""
    if LONG is None or LONG.verification is None or LONG.device not in BACKENDS:
        return []
    return [f"results/{HOST}/verification/long_{LONG.device}.json"]


def long_verification_drafter():
    """The long-context pair's drafter directory: none where the target drafts for itself."""
    drafter = LONG.verification.drafter
    return [] if drafter == "self" else [f"results/models/{drafter}"]


# Where each job runs: its devices pick the Apptainer image (`--sdm apptainer`) and the conda
# environment (`--sdm conda`). MPS jobs get no image: Metal is unreachable from a Linux container.
USES_APPTAINER = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method


def job_devices(wildcards):
    """The devices a job runs on: its backend, its configuration's two devices, a train model's
    device, else the CPU."""
    names = wildcards.keys()
    if "backend" in names:
        return {wildcards.backend}
    if "pair" in names:
        return PAIRS[wildcards.pair].devices
    if "model" in names:  # prepare_model: a train model trains on its `device`
        return {SETTINGS.models[wildcards.model].get("device", "cpu")}
    return {"cpu"}


def job_backend(wildcards):
    devices = job_devices(wildcards)
    return next(b for b in ("mps", "cuda", "cpu") if b in devices)


def job_container(wildcards):
    backend = job_backend(wildcards)
    return None if backend == "mps" else SETTINGS.containers[backend]


def job_conda_env(wildcards):
    return f"../../envs/{job_backend(wildcards)}.yaml"


if USES_APPTAINER:
    checked(check_local_images, SETTINGS, BACKENDS)


def job_gpu_model(wildcards):
    """The GPU model a CUDA job asks the cluster for; empty (none asked) for every other job."""
    return (SETTINGS.gpu_model or "") if "cuda" in job_devices(wildcards) else ""


def uses(device):
    """A resource callable: one unit for a job that runs on `device`, else none."""
    return lambda wildcards: int(device in job_devices(wildcards))


def job_threads(wildcards):
    """A job on the CPU takes every core (nothing else runs beside a CPU benchmark); else one."""
    return workflow.cores if "cpu" in job_devices(wildcards) else 1


def verify_threads(wildcards):
    """Level 3 times nothing, and on a GPU its eager loop is bound by the host's launches: up to
    four processes share the device (`equivalence.in_spawned`)."""
    return workflow.cores if "cpu" in job_devices(wildcards) else min(workflow.cores, 4)


# A device job's resources: a unit of each accelerator it runs on and the GPU model a CUDA job
# asks a cluster for. A job that times nothing (verification) holds these alone.
DEVICE_RESOURCES = dict(
    gpu=uses("cuda"),
    gpu_model=job_gpu_model,
    mps=uses("mps"),
)
# A measuring job's resources: those, and `bench_cpu` on the CPU, which keeps two CPU
# benchmarks apart.
MEASURING_RESOURCES = dict(
    bench_cpu=uses("cpu"),
    **DEVICE_RESOURCES,
)


# On a cluster these run where snakemake runs: `all` does nothing and `paper` needs the host's TeX.
localrules:
    all,
    paper,


def imported_tables(wildcards):
    """The imported hosts' stats tables that exist: whatever their run produced."""
    return sorted(str(p) for host in IMPORTED for p in Path(f"results/{host}/stats").glob("*.csv"))


def reference_tables(wildcards):
    """Every reference's tables, its sub-studies' (results/reference/<name>/<study>/) too."""
    return sorted(str(p) for p in Path("results/reference").glob("**/stats/*.csv"))


def benchmark_file(output):
    return re.sub(r"\.(parquet|json)$", ".tsv", re.sub(r"^results/", "benchmarks/", output))


def measured_outputs(wildcards):
    return (
        raw_runs(wildcards)
        + speculative_runs(wildcards)
        + parallelism_runs(wildcards)
        + verify_cost_runs(wildcards)
        + peer_runs(wildcards)
        + verification_reports(wildcards)
        + long_runs(wildcards)
        + batched_runs(wildcards)
    )


def benchmark_files(wildcards):
    """Every measuring job's benchmark file: the raw outputs' paths under benchmarks/."""
    return [benchmark_file(p) for p in measured_outputs(wildcards)] + [
        f"benchmarks/prepare_model/{model}.tsv" for model in sorted(SETTINGS.models)
    ]


# The quantized backend (quantized.smk): the GGUF files live in results/gguf/<model>/, beside
# prepare_model's directory output, which may not contain another rule's output.
checked(check_quantized, SETTINGS)
QUANT = quantized_plan(SETTINGS, BACKENDS)
# A model of config 'quantized.models' that the converter cannot take: a skipped.csv row.
QUANT_SKIPPED = [{"backend": "llama.cpp", "reason": why} for _, why in QUANT["skipped"]]


def gguf_file(model, quant):
    return f"results/gguf/{model}/{quant}.gguf"


def pair_gguf(role):
    """An input function: the pair's GGUF for `role` where it runs in llama.cpp, else none."""

    def gguf(wildcards):
        pair = PAIRS[wildcards.pair]
        quant = pair.quant(role)
        return gguf_file(getattr(pair, role), quant) if quant else []

    return gguf


def sdp_arg(wildcards):
    """Level 3 on a pair meets attention as its speculative runs do."""
    allowed = SPEC.sdp_backends
    return f"--sdp-backends {as_arg(list(allowed))}" if allowed else ""


def gguf_args(wildcards, input):
    return " ".join(
        f"--{role}-gguf {input[f'{role}_gguf']}"
        for role in ("target", "draft")
        if input[f"{role}_gguf"]
    )


def verify_cost_runs(wildcards):
    return [
        f"results/{HOST}/llama.cpp-{quant}-{device}/parallelism/{model}/rep{r}.parquet"
        for model, quant, device in QUANT["verify"]
        for r in range(SPEC.repeats)
    ]


def peer_runs(wildcards):
    """llama.cpp's own speculative example on the pairs of config 'quantized.peer' (here)."""
    return [
        f"results/{HOST}/llama.cpp-peer/{name}/rep{r}.parquet"
        for name in SETTINGS.quantized.peer
        if name in PAIRS
        for r in range(SPEC.repeats)
    ]


def quantized_pair_runs(wildcards):
    return [
        f"results/{HOST}/speculative/{name}/rep{r}.parquet"
        for name, pair in PAIRS.items()
        if pair.quant("target") or pair.quant("draft")
        for r in range(SPEC.repeats)
    ]


# The long-context study (long.smk): one process per repeat on config 'long.device', where the
# config has a 'long' section and this host that device.
checked(check_long, SETTINGS)
LONG = SETTINGS.long


def long_runs(wildcards):
    if LONG is None or LONG.device not in BACKENDS:
        return []
    return [f"results/{HOST}/long/{LONG.device}/rep{r}.parquet" for r in range(LONG.repeats)]


def long_drafters():
    """The separate drafters' model names (`self` is the target)."""
    return [d for d in LONG.drafters if d != "self"]


# Batched speculation (batched.smk): like the long-context study, one process per repeat on
# config 'batched.device', where the config has a 'batched' section and this host that device.
checked(check_batched, SETTINGS)
BATCHED = SETTINGS.batched


def batched_runs(wildcards):
    if BATCHED is None or BATCHED.device not in BACKENDS:
        return []
    device = BATCHED.device
    return [f"results/{HOST}/batched/{device}/rep{r}.parquet" for r in range(BATCHED.repeats)]


def batched_costs(wildcards):
    return [p.replace(".parquet", "_costs.parquet") for p in batched_runs(wildcards)]


# The stability verdicts (stats.smk): each study judged once, in verdicts_<study>.csv.
def verification_parallelism_runs(wildcards):
    """PyTorch's parallelism runs and llama.cpp's verify cost: one study, judged alike."""
    return parallelism_runs(wildcards) + verify_cost_runs(wildcards)


STUDY_RUNS = {
    "sweep": raw_runs,
    "speculative": speculative_runs,
    "parallelism": verification_parallelism_runs,
}


def verdict_tables(*studies):
    return [f"results/{{host}}/stats/verdicts_{study}.csv" for study in studies]
