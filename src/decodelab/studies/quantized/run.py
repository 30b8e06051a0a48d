"""The quantized study's jobs over llama.cpp (`decodelab.backends.llamacpp`): a model's GGUF of
one type, its verify cost (time on K+1 tokens over 1 at the same context: the speculative
study's `parallelism` measurement, so the rows sit beside the PyTorch backends'), and, after a
speculative process with a llama.cpp target, where its greedy output parts from that target's
own greedy decoding and at what logit margin."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.backends.devices import fingerprint
from decodelab.backends.llamacpp import Engine, backend_label, build_info, quantized_roles
from decodelab.backends.train import heldout_prompts
from decodelab.config.settings import ParallelismJob, SpeculativeJob
from decodelab.engines.decode import first_divergence, margin
from decodelab.studies.speculative import run as study


def verify_cost(engine: Engine, ks: list[int], context: int, inner: int, seed: int
                ) -> pd.DataFrame:
    """`study.parallelism` on the engine, labelled with its type, device and build."""
    return study.parallelism(engine, ks, context, inner, seed).assign(
        backend=backend_label(engine.dtype, engine.compute_device), quantization=engine.dtype,
        llama_device=engine.compute_device, **build_info())


def verify_cost_job(gguf: str | Path, model: str, device: str, spec: ParallelismJob,
                    repeat: int, threads: int = 0) -> pd.DataFrame:
    """One verify-cost process: its rows with the fingerprint of the device it ran on."""
    engine = Engine(gguf, threads=threads or None, device=device)
    df = verify_cost(engine, spec.ks, spec.context, spec.inner, spec.seed + repeat)
    return df.assign(model=model, repeat=repeat, **{
        k: v for k, v in fingerprint(device, spec.job_spec()).items() if k != "backend"})


def with_divergence(runs: pd.DataFrame, target: Engine, prompts: list[list[int]]
                    ) -> pd.DataFrame:
    """Every greedy speculative row with where it parts from the target's own greedy decoding
    (the process's autoregressive greedy row of the same prompt), NaN where they agree, and the
    target's top-2 logit margin there: batched verification rounding differently from the
    one-token pass (llama.cpp#25618) shows as a divergence at a small margin."""
    greedy = runs[runs["mode"] == "greedy"]
    own = greedy[greedy["method"] == "autoregressive"].set_index("prompt")["tokens"]
    at, gap = [], []
    for row in runs.itertuples():
        found = None
        if row.method == "speculative" and row.mode == "greedy":
            found = first_divergence(list(row.tokens), list(own[row.prompt]))
        at.append(float("nan") if found is None else found)
        gap.append(float("nan") if found is None else
                   margin(target, prompts[row.prompt] + list(own[row.prompt])[:found]))
    return runs.assign(diverges_at=at, divergence_margin=gap)


def with_target_divergence(runs: pd.DataFrame, pair: dict, target_dir: str | Path,
                           spec: SpeculativeJob) -> pd.DataFrame:
    """A speculative process's rows, with `with_divergence`'s columns where its target runs in
    llama.cpp (the same prompts, the target loaded afresh)."""
    if "target" not in quantized_roles(pair):
        return runs
    prompts = heldout_prompts(target_dir, spec.prompts, spec.prompt_len, spec.seed)
    return with_divergence(runs, Engine(pair["target_gguf"], device=pair["target_device"]),
                           prompts)
