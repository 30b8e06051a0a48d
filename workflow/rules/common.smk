# Shared helpers: host, backends that run here and those skipped, job settings as CLI arguments.
import json
import os
import shlex
import socket
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from decodelab.devices import backend_available, why_unavailable
from decodelab.models import PRESETS, max_positions, preset_config


def this_host():
    name = config.get("host") or socket.gethostname().split(".")[0]
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in name)


HOST = this_host()
BACKENDS = [b for b in config["backends"] if backend_available(b)]
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

MODELS = list(config["models"])
SWEEP = config["sweep"]
EXPERIMENTS = ["sweep", "ablation"]


def check_positions():
    """Fail before any job when a budget would overrun a learned position table."""
    longest = max(SWEEP["budgets"]) + max(SWEEP["prompt_lengths"])
    for name, spec in config["models"].items():
        if spec["source"] != "init":
            continue
        if spec["preset"] not in PRESETS:
            raise WorkflowError(
                f"config 'models.{name}.preset': unknown preset {spec['preset']!r}; "
                f"known: {', '.join(PRESETS)}"
            )
        limit = max_positions(preset_config(spec["preset"]))
        if limit is not None and longest > limit:
            raise WorkflowError(
                f"config 'sweep': max budget + max prompt length = {longest} tokens, but model "
                f"{name!r} ({spec['preset']}) has {limit} positions"
            )


check_positions()


def as_arg(obj):
    """A settings dict as one shell-quoted JSON argument."""
    return shlex.quote(json.dumps(obj, sort_keys=True))


def sweep_spec():
    keys = ("budgets", "prompt_lengths", "dtype", "inner_repeats", "warmup")
    return {**{k: SWEEP[k] for k in keys}, "seed": config["seed"]}


def raw_runs(wildcards):
    return expand(
        "results/{host}/{backend}/{experiment}/{model}/rep{repeat}.parquet",
        host=HOST,
        backend=BACKENDS,
        experiment=EXPERIMENTS,
        model=MODELS,
        repeat=range(SWEEP["repeats"]),
    )


def paper_settings():
    return {
        "host": HOST,
        "backends": config["backends"],
        "models": config["models"],
        "shuffle_seed": config["seed"],
        **SWEEP,
        "regimes": config["regimes"],
        "stats": config["stats"],
    }
