"""Budget sweeps and the KV-cache ablation: one process measures a shuffled grid of
(prompt length, budget, cache) configurations on one backend and model."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable
from dataclasses import replace

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from decodelab.backends import machine, models
from decodelab.backends.devices import (
    fingerprint,
    memory_snapshot,
    reset_peak_memory,
    set_sdp_backends,
    sm_clock_probe,
)
from decodelab.config.settings import SweepJob
from decodelab.core.errors import DecodelabError
from decodelab.core.shapes import max_positions
from decodelab.engines.cuda import graphs
from decodelab.engines.decode import decode


def make_grid(budgets: Iterable[int], prompt_lengths: Iterable[int], caches: Iterable[bool],
              inner_repeats: int) -> list[dict]:
    return [
        {"prompt_len": p, "budget": b, "use_cache": c, "inner": i}
        for p, b, c, i in itertools.product(prompt_lengths, budgets, caches, range(inner_repeats))
    ]


def shuffled(grid: list[dict], seed: int) -> list[dict]:
    order = list(grid)
    random.Random(seed).shuffle(order)
    return order


def make_prompt(vocab_size: int, length: int, seed: int, device: str) -> torch.Tensor:
    """The same random prompt for a given (seed, length) in every process and on every device."""
    gen = torch.Generator().manual_seed(seed * 100_003 + length)
    return torch.randint(0, vocab_size, (1, length), generator=gen).to(device)


def check_positions(config, budgets: Iterable[int], prompt_lengths: Iterable[int], name: str):
    limit = max_positions(config)
    longest = max(budgets) + max(prompt_lengths)
    if limit is not None and longest > limit:
        raise DecodelabError(
            f"model {name!r}: budget + prompt length reaches {longest} tokens but the "
            f"{config.model_type} position table has {limit} rows; lower sweep.budgets or "
            "sweep.prompt_lengths")


def warm_up(model, prompts: dict[int, torch.Tensor], caches: Iterable[bool], budget: int,
            times: int) -> None:
    for _, prompt in sorted(prompts.items()):
        for use_cache in caches:
            for _ in range(times):
                decode(model, prompt, budget, use_cache=use_cache)


def measure(model, prompt: torch.Tensor, cfg: dict, device: str, probe=None) -> dict:
    reset_peak_memory(device)
    out = decode(model, prompt, cfg["budget"], use_cache=cfg["use_cache"],
                 probe=probe)  # ends synchronized
    steps = np.asarray(out.step_s) if out.step_s else np.asarray([np.nan])
    clocks = np.asarray(out.probed) if out.probed else np.asarray([np.nan])
    return {
        **cfg,
        "prefill_s": out.prefill_s,
        "decode_s": out.decode_s,
        "total_s": out.prefill_s + out.decode_s,
        "decode_per_token_s": out.decode_s / max(len(out.step_s), 1),
        "step_median_s": float(np.median(steps)),
        "step_max_s": float(np.max(steps)),
        "step_s": [float(s) for s in out.step_s],
        "step_launch_s": [float(s) for s in out.launch_s],
        "step_launch_cpu_s": [float(s) for s in out.launch_cpu_s],
        # The GPU's SM clock after each step (CUDA with NVML): tells a step slowed by the GPU's
        # power management from one slow at full clock.
        "step_sm_clock_mhz": [float(c) for c in out.probed],
        "sm_clock_median_mhz": float(np.median(clocks)),
        "sm_clock_min_mhz": float(np.min(clocks)),
        "tokens_generated": len(out.tokens),
        **memory_snapshot(device),
    }


def caches_of(experiment: str) -> list[bool]:
    return [True, False] if experiment == "ablation" else [True]


def expected_rows(spec: SweepJob, experiment: str) -> tuple[int, str]:
    """How many rows one process writes, and what they are made of: its raw file's stamp."""
    sizes = {"budget": len(spec.budgets), "prompt length": len(spec.prompt_lengths),
             "dtype": len(spec.dtypes), "cache setting": len(caches_of(experiment)),
             "inner repeat": spec.inner_repeats}
    made_of = " x ".join(f"{n} {name}{'s' * (n != 1)}" for name, n in sizes.items())
    return math.prod(sizes.values()), f"{experiment}: {made_of}"


def run(model_dir: str, model_name: str, backend: str, spec: SweepJob, repeat: int,
        experiment: str, progress: bool = True) -> pd.DataFrame:
    """Measure the whole grid of `spec` once per dtype, in this process; one row per
    configuration."""
    check_positions(models.check_model_dir(model_dir, f"model {model_name!r}"), spec.budgets,
                    spec.prompt_lengths, model_name)
    set_sdp_backends(spec.sdp_backends)
    job = machine.Job()
    df = pd.concat([run_dtype(model_dir, model_name, backend, replace(spec, dtype=dtype), repeat,
                              experiment, index, progress)
                    for index, dtype in enumerate(spec.dtypes)], ignore_index=True)
    return df.assign(**job.columns())


def run_dtype(model_dir: str, model_name: str, backend: str, spec: SweepJob, repeat: int,
              experiment: str, index: int, progress: bool) -> pd.DataFrame:
    caches = caches_of(experiment)
    manifest = models.read_manifest(model_dir)
    model = graphs.engine(models.load(model_dir, backend, spec.dtype),
                          spec.engine or "eager", "sweep.engine")
    vocab = model.config.vocab_size
    prompts = {p: make_prompt(vocab, p, spec.seed, backend) for p in spec.prompt_lengths}
    shuffle_seed = spec.seed + 7919 * repeat + 104_729 * index
    grid = shuffled(make_grid(spec.budgets, spec.prompt_lengths, caches, spec.inner_repeats),
                    shuffle_seed)
    warm_up(model, prompts, caches, min(spec.budgets), spec.warmup)
    rows = []
    label = f"{experiment} {backend}/{model_name} {spec.dtype} rep{repeat}"
    probe = sm_clock_probe(backend)
    for order, cfg in enumerate(tqdm(grid, desc=label, disable=not progress, mininterval=1)):
        with machine.watched() as load:
            row = measure(model, prompts[cfg["prompt_len"]], cfg, backend, probe)
        rows.append({"order": order, **row, **load})
    meta = {
        "experiment": experiment,
        "model": model_name,
        "family": models.family_of(model.config),
        "source": manifest.get("source", "unknown"),
        "parameters": models.count_parameters(model),
        "dtype": spec.dtype,
        "repeat": repeat,
        "shuffle_seed": shuffle_seed,
        "seed": spec.seed,
        **fingerprint(backend, spec.job_spec()),
    }
    return pd.DataFrame([{**meta, **row} for row in rows])
