"""The GPU pair study on one CUDA host without Snakemake (scripts/gpu_pair.sh runs it): train
config/gpu.yaml's `target` and `draft`, time the speculative study on pair `cuda-cuda` in the
eager and the graph engine, graph-mode decoding of gpt2-xl against the bandwidth floor, and the
pipelined loop's own overhead with its verdict compiled and not.

Writes under --out: models/<name>/ (manifests and configs), raw/speculative/<pair>/rep0.parquet
(the study's own rows), stats/pair.csv (c, alpha, speedups, measured / predicted per engine, mode
and K), stats/divergence.csv (greedy tokens of the graph engine against the eager one) and
stats/bandwidth.csv (gpt2-xl and gpt2, float16: each engine's step against the floor, and where the
step's device time goes, kernel by kind, and where its greedy tokens first part from the eager
model's, with the eager model's top-2 gap there), stats/tuned.csv (the launch configurations
Inductor tuned for each compiled engine's kernels), stats/after_profiler.csv (the first engine
timed again once every engine's step is profiled) and stats/verdict.csv (the overhead, per
run). Every step checks the deadline first and is skipped, said so, past it.
`--smoke` shrinks everything to a CPU-sized check of this script's logic (nothing captured).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

from decodelab.analysis import stability, stats
from decodelab.backends import sources, train
from decodelab.config.settings import (
    GREEDY,
    Confidence,
    Sampling,
    SpeculativeJob,
    Stability,
    load_settings,
)
from decodelab.core.io import write_raw
from decodelab.engines import speculative
from decodelab.engines.cuda import attention, fused, graphs
from decodelab.engines.cuda.floor import copy_bandwidth
from decodelab.engines.cuda.floor import weight_bytes as parameter_bytes
from decodelab.engines.decode import decode, first_divergence, margin
from decodelab.studies.speculative import run as study
from decodelab.studies.speculative import tables as speculative_tables

# Peak memory bandwidth per card (bytes/s), by a part of its CUDA name: the H200's the figure the
# floor is stated against (its datasheet says 4.8 TB/s), the H100 SXM's (HBM3) the datasheet's.
# Another card's floor is NaN; `over_measured_floor`, on the copy bandwidth measured in the
# process, holds for any.
PEAK_BANDWIDTH = {"H200": 4.3e12, "H100 80GB HBM3": 3.35e12}
# The floor's engines: graphs.ENGINES' own (`fused` is gpt-fast's recipe with decodelab's kernels,
# decodelab.engines.cuda.fused), and ablations of `fused`, each taking one of its parts away:
# `reductions`, its Linear layout and coordinate-descent tuning with attention on SDPA's math
# backend (a bmm, a softmax and a bmm, which Inductor fuses) while it compiles;
# `reductions+attend`, that with decodelab's attention kernel (`fused` without the matvec kernel:
# its GEMVs Inductor's tuned reductions); `linear+attend`, the Linear layout and the attention
# kernel with Inductor's defaults (its GEMVs cuBLAS's on contiguous rows); `+attend`, an engine
# with the attention kernel alone; `layered`, `fused` without decodelab.engines.cuda.static_cache
# and attention.causal_ends: over transformers' StaticCache (each layer writes its keys, writes
# its values and advances its own position) with a boolean [T, L] mask for the attention kernel;
# `fused-deterministic`, `fused` under Inductor's deterministic mode (below); `folded`, `fused`
# with GPT-2's layer norms and residual adds inside the matvec kernels (fused.fold_norms);
# `unwritten`, `fused` with a cache-write kernel per layer beside the attention kernel
# (fused.prepare(write=False)). Older reference runs name `unwritten` `fused`, and today's `fused`
# (each one-token attention writing its own cache slot) `written`. Every engine is timed before
# any is profiled: an engine timed after another's profile runs slower (time_floors).
ATTEND = "+attend"
# Inductor's deterministic mode: no reduction tuned in the process (its block sizes and warps fix
# the order of a sum, and tuning picked them anew in each process), only what leaves numerics be.
DETERMINISTIC = "-deterministic"
FLOOR_ENGINES = tuple(e for e in graphs.ENGINES if e != "pipelined") + (
    "reductions", "reductions" + ATTEND, "graph" + ATTEND, "compiled" + ATTEND, "linear" + ATTEND,
    "layered", "fused" + DETERMINISTIC, "folded", "unwritten")
# The floor engines that are `fused.prepare`'s model, by its arguments
PREPARED = {"fused": {}, "layered": {"ends": False, "write": False}, "folded": {"fold": True},
            "unwritten": {"write": False}}
FLOOR_COMPILE = (graphs.COMPILE_OPTIONS | {"reductions": fused.COMPILE, "linear": {}}
                 | dict.fromkeys(PREPARED, fused.COMPILE))
# Where a step's device time goes: kernel names by kind, first match wins (Inductor's own
# kernels, reductions apart from pointwise ones; attention, whose kernels may be CUTLASS ones;
# cuBLAS and CUTLASS GEMM/GEMV kernels; copies and indexing; the rest).
KERNEL_KINDS = (("triton_reduction", r"^triton_(red|per)_"), ("triton_pointwise", r"^triton_"),
                ("attention", r"attention|attend|fmha|flash|softmax"),
                ("matmul", r"gemm|gemv|matvec|nvjet|cutlass|xmma|cublas|aten::(add)?mm"),
                ("copy", r"copy|memcpy|memset|index|cat|scatter|gather"))
TOP_KERNELS = 8  # named per engine, with their calls and time per step
SMOKE_MODEL = {"n_layer": 2, "n_embd": 64, "n_head": 2, "corpus_mb": 0.5, "seq_len": 64,
               "batch_size": 4, "steps": 20, "vocab_size": 512, "device": "cpu"}


def peak_bandwidth(device: str) -> float:
    """The datasheet bandwidth of this CUDA card (PEAK_BANDWIDTH), NaN for another or a CPU."""
    name = torch.cuda.get_device_name() if device == "cuda" else device
    return next((b for part, b in PEAK_BANDWIDTH.items() if part in name), float("nan"))


@contextlib.contextmanager
def math_attention(on: bool):
    """SDPA's flash and memory-efficient backends off (cuDNN is off for the whole script), so
    attention traced meanwhile is the math backend's."""
    cuda = torch.backends.cuda
    flash, efficient = cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled()
    if on:
        cuda.enable_flash_sdp(False)
        cuda.enable_mem_efficient_sdp(False)
    try:
        yield
    finally:
        cuda.enable_flash_sdp(flash)
        cuda.enable_mem_efficient_sdp(efficient)


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if re.search(pattern, name, re.I)),
                "other")


def device_time(engine, prompt: torch.Tensor, budget: int, cuda: bool) -> dict[str, tuple]:
    """Per kernel name (per aten op off CUDA): calls and self time in seconds, over one
    `decode` of `budget` tokens under the profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        decode(engine, prompt, budget)
    if cuda:
        return {e.key: (e.count, e.self_device_time_total / 1e6) for e in prof.key_averages()
                if e.device_type == DeviceType.CUDA}
    return {e.key: (e.count, e.self_cpu_time_total / 1e6) for e in prof.key_averages()
            if e.key.startswith("aten::") and e.self_cpu_time_total > 0}


def step_kernels(engine, prompt: torch.Tensor, steps: int, cuda: bool) -> dict[str, float]:
    """A decoding step's kernels: how many, their device time, and both by kind (KERNEL_KINDS:
    `{kind}_s`, `{kind}_kernels`), from two profiled decodes that differ by `steps` tokens (so
    the prompt's pass and the first steps cancel out), after one that is not counted (the first
    under the profiler recompiles an uncaptured compiled engine). `top` names the costliest
    kernels."""
    _, short, long = (device_time(engine, prompt, n, cuda) for n in (2, 2, 2 + steps))
    kinds = [kind for kind, _ in KERNEL_KINDS] + ["other"]
    out = {"kernels_per_step": 0.0, "kernel_s": 0.0} | {f"{kind}_s": 0.0 for kind in kinds} | {
        f"{kind}_kernels": 0.0 for kind in kinds}
    per_kernel = {}
    for name, (calls, seconds) in long.items():
        calls0, seconds0 = short.get(name, (0, 0.0))
        per_kernel[name] = ((calls - calls0) / steps, (seconds - seconds0) / steps)
        kind = kernel_kind(name)
        out["kernels_per_step"] += per_kernel[name][0]
        out[f"{kind}_kernels"] += per_kernel[name][0]
        out["kernel_s"] += per_kernel[name][1]
        out[f"{kind}_s"] += per_kernel[name][1]
    costliest = sorted(per_kernel.items(), key=lambda item: -item[1][1])[:TOP_KERNELS]
    out["top"] = "; ".join(f"{name[:80]} x{calls:g} {s * 1e6:.1f} us"
                           for name, (calls, s) in costliest)
    return out


def log(*parts) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, step: str, needs: float) -> bool:
        if self.left() >= needs:
            return True
        log(f"SKIPPED {step}: {self.left():.0f} s left, it needs about {needs:.0f} s")
        return False


def model_spec(settings, name: str, smoke: bool) -> dict:
    spec = dict(settings.models[name])
    return spec | SMOKE_MODEL if smoke else spec


def train_pair(settings, out: Path, work: Path, smoke: bool) -> dict[str, Path]:
    """Target, then its distilled draft; TF32 matmuls on CUDA (training speed only: the timed
    runs are bfloat16)."""
    torch.backends.cuda.matmul.allow_tf32 = True
    dirs = {}
    for name in ("target", "draft"):
        spec = model_spec(settings, name, smoke)
        dirs[name] = work / name
        log(f"training {name}: {json.dumps(spec)}")
        sources.prepare(spec, dirs[name], teacher_dir=dirs.get(spec.get("teacher")))
        manifest = json.loads((dirs[name] / "decodelab.json").read_text())
        log(f"{name}: {manifest['parameters']} parameters, held-out loss "
            f"{manifest['heldout_loss']:.3f}, {manifest['train_seconds']} s training"
            + (f", greedy agreement {manifest['greedy_agreement']:.3f}" if name == "draft"
               else ""))
        keep = out / "models" / name
        keep.mkdir(parents=True, exist_ok=True)
        for f in ("decodelab.json", "config.json"):
            shutil.copy(dirs[name] / f, keep / f)
    return dirs


def study_spec(settings, smoke: bool, engine: str) -> SpeculativeJob:
    spec = settings.speculative.job()
    if smoke:
        spec = dataclasses.replace(spec, ks=(1, 3), prompts=2, budget=16, prompt_len=8)
    # HF assisted generation runs its own (eager) loop: once, beside the eager engine.
    return dataclasses.replace(spec, hf_assisted=spec.hf_assisted and engine == "eager")


def run_study(settings, dirs, out: Path, pair_name: str, smoke: bool) -> pd.DataFrame:
    pair = settings.speculative.pairs[pair_name]
    if smoke:
        pair = dataclasses.replace(pair, target_device="cpu", draft_device="cpu",
                                   dtype="float32")
    pair = pair.job_spec()
    spec = study_spec(settings, smoke, pair.get("engine", "eager"))
    start = time.perf_counter()
    df = study.run(str(dirs["target"]), str(dirs["draft"]), pair_name, pair, spec, 0,
                   progress=False)
    write_raw(df, out / "raw/speculative" / pair_name / "rep0.parquet",
              *study.expected_rows(spec, pair))
    log(f"study {pair_name}: {len(df)} rows in {time.perf_counter() - start:.0f} s")
    return df.assign(engine=pair.get("engine", "eager"))


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per engine, mode and K: the DAG's own speculative statistics (`decodelab spec-stats`:
    speedup over the fair and the stepped baseline, host overhead, alpha, c, Leviathan's
    prediction and the one that prices verification as measured), with the per-prompt range of
    the speedup and, in greedy mode, ours over HF assisted generation."""
    ci = Confidence(0.95, 1000, 0)  # one process here: the intervals collapse to the estimate
    proc = speculative_tables.spec_per_process(df)
    acceptance = speculative_tables.acceptance_table(proc, ci)
    speedup = speculative_tables.speedup_table(proc, ci, stability.verdicts(df, stats.SPECULATIVE,
                                                               Stability()))
    theory = speculative_tables.theory_table(proc, speedup, acceptance)
    hf = speculative_tables.hf_table(proc, df, ci)[["pair", "k", "ours_over_hf"]]
    out = (theory.merge(speedup[["pair", "mode", "k", "speedup_stepped", "overhead_share"]],
                        on=speculative_tables.SPEC_KEYS)
           .merge(acceptance[["pair", "mode", "k", "proposal_acceptance", "tokens_per_call"]],
                  on=speculative_tables.SPEC_KEYS)
           .merge(prompt_range(df), on=speculative_tables.SPEC_KEYS)
           .merge(hf.assign(mode="greedy"), on=speculative_tables.SPEC_KEYS, how="left"))
    engines = df.drop_duplicates("pair").set_index("pair")["engine"]
    return out.assign(engine=out["pair"].map(engines),
                      measured_over_predicted=out["measured"] / out["predicted"])


def prompt_range(df: pd.DataFrame) -> pd.DataFrame:
    """Per pair, mode and K: the fair baseline's median time over the slowest and the fastest
    prompt's speculative time."""
    fair = df[df.method == "autoregressive"].groupby(["pair", "mode"]).total_s.median()
    spec = df[df.method == "speculative"].groupby(speculative_tables.SPEC_KEYS).total_s
    times = spec.agg(["min", "max"]).reset_index()
    base = [fair[(r.pair, r.mode)] for r in times.itertuples()]
    return times.assign(speedup_min=base / times["max"], speedup_max=base / times["min"])[
        [*speculative_tables.SPEC_KEYS, "speedup_min", "speedup_max"]]


def divergence(df: pd.DataFrame) -> pd.DataFrame:
    """Greedy tokens of each graph run against the eager run of the same method, K and prompt:
    where they first differ (bfloat16 attention over a static cache rounds differently)."""
    greedy = df[df["mode"] == "greedy"].set_index(["engine", "method", "k", "prompt"]).tokens
    rows = []
    for (engine, method, k, prompt), tokens in greedy.items():
        if engine != "graph" or ("eager", method, k, prompt) not in greedy.index:
            continue
        eager = greedy["eager", method, k, prompt]
        differ = [i for i, (a, b) in enumerate(zip(tokens, eager, strict=True)) if a != b]
        first = differ[0] if differ else None
        rows.append({"method": method, "k": k, "prompt": prompt, "equal": first is None,
                     "first_difference": first, "length": len(tokens)})
    return pd.DataFrame(rows)


def base_engine(name: str) -> str:
    return name.removesuffix(ATTEND).removesuffix(DETERMINISTIC)


def compile_options(name: str) -> dict | None:
    """Inductor's options for floor engine `name` (None: not compiled)."""
    options = FLOOR_COMPILE.get(base_engine(name))
    return options | {"deterministic": True} if name.endswith(DETERMINISTIC) else options


def floor_engine(model, name: str, max_len: int, cuda: bool):
    """`model` as floor engine `name` runs it, on a copy of it: dynamo would reuse a compilation
    of the same model, traced on other backends."""
    base = base_engine(name)
    if base == "eager":
        return model
    variant = copy.deepcopy(model)
    if base in PREPARED:
        fused.prepare(variant, **PREPARED[base])
    elif base in ("reductions", "linear"):
        fused.as_linears(variant)
    if name.endswith(ATTEND):
        attention.use(variant)
    return graphs.Engine(variant, capture=cuda, max_len=max_len, paired=base != "layered",
                         compile=compile_options(name) if cuda else None)


def parting(model, prompt: torch.Tensor, tokens: list[int], eager: list[int]):
    """Where an engine's greedy `tokens` first differ from the eager model's (-1: nowhere), and
    the eager model's top-2 logit gap there: a float16 near tie, or a wrong step."""
    at = first_divergence(tokens, eager)
    if at is None:
        return -1, None
    return at, margin(model, prompt[0].tolist() + eager[:at])


@dataclasses.dataclass
class FloorModel:
    """An init model set against its bandwidth floors: parameter bytes over the card's peak
    (PEAK_BANDWIDTH) and over the copy bandwidth measured here; every engine's greedy tokens
    are checked against its eager ones."""
    preset: str
    dtype: torch.dtype
    device: str
    model: torch.nn.Module
    prompt: torch.Tensor
    eager_tokens: list[int]
    weight_bytes: int
    floor: float
    measured: float


@torch.inference_mode()
def floor_model(preset: str, dtype: torch.dtype, budget: int, device: str) -> FloorModel:
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(sources.preset_config(preset), dtype=dtype)
    model.eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 32), device=device)
    weight_bytes = parameter_bytes(model)
    return FloorModel(preset, dtype, device, model, prompt, decode(model, prompt, budget).tokens,
                      weight_bytes, weight_bytes / peak_bandwidth(device), copy_bandwidth(device))


def runs_here(name: str, cuda: bool) -> bool:
    """Off CUDA (--smoke) nothing is compiled: `reductions`, `fused` and `linear` run there as
    their model's changes, and the engines that only compile are left out."""
    return cuda or base_engine(name) in ("eager", "graph", "reductions", "linear", *PREPARED)


@torch.inference_mode()
def time_engine(f: FloorModel, name: str, budget: int, repeats: int) -> tuple[list[dict], object]:
    """`f`'s model on floor engine `name`, warmed up (the graphs' capture, the compilation) and
    timed (`time_decodes`); the rows and the engine. Off CUDA the graph engine runs uncaptured."""
    engine = floor_engine(f.model, name, f.prompt.shape[1] + budget, f.device == "cuda")
    start = time.perf_counter()
    with math_attention(base_engine(name) == "reductions"):
        decode(engine, f.prompt, 16)
    log(f"{f.preset} {name}: warm-up {time.perf_counter() - start:.1f} s")
    return time_decodes(f, name, engine, budget, repeats), engine


@torch.inference_mode()
def time_decodes(f: FloorModel, name: str, engine, budget: int, repeats: int,
                 note: str = "") -> list[dict]:
    """Decode time per token (each decode's median step) over `repeats` decodes, against the
    floors, and where the greedy tokens part from the eager model's."""
    rows = []
    for r in range(repeats):
        out = decode(engine, f.prompt, budget)
        step = float(pd.Series(out.step_s).median())
        parted, gap = parting(f.model, f.prompt, out.tokens, f.eager_tokens)
        rows.append({"model": f.preset, "dtype": str(f.dtype).removeprefix("torch."),
                     "engine": name, "repeat": r, "budget": budget, "step_s": step,
                     "weight_bytes": f.weight_bytes, "floor_s": f.floor,
                     "over_floor": step / f.floor, "copy_bandwidth": f.measured,
                     "over_measured_floor": step * f.measured / f.weight_bytes,
                     "diverges_from_eager_at": parted, "eager_margin_there": gap,
                     "device": torch.cuda.get_device_name() if f.device == "cuda" else f.device})
        log(f"{f.preset} {name}: {step * 1e3:.3f} ms/token, {step / f.floor:.2f}x the peak's "
            f"floor, {step * f.measured / f.weight_bytes:.2f}x the copy's{note}")
    return rows


@torch.inference_mode()
def split_step(f: FloorModel, name: str, engine, budget: int, step: float) -> dict:
    """Where a step of `engine` spends its device time (`step_kernels`); {} where the profiler
    fails: a diagnosis, the timings stay."""
    try:
        kernels = step_kernels(engine, f.prompt, min(16, budget - 2), f.device == "cuda")
    except RuntimeError as e:
        log(f"{f.preset} {name}: no kernel split, the profiler failed: {e}")
        return {}
    log(f"{f.preset} {name}: {kernels['kernels_per_step']:.0f} kernels per step, busy "
        f"{kernels['kernel_s'] / step:.0%} of it; costliest: {kernels['top']}")
    return kernels


@torch.inference_mode()
def verdict_overhead(settings, smoke: bool, ks=(1, 2, 4, 6, 8), repeats: int = 5,
                     budget: int = 128) -> pd.DataFrame:
    """The pipelined loop's time outside the draft's and the target's passes (its verdict, the
    uniforms' draws, the copy to the host) per iteration, with the verdict compiled
    (`fuse_verdict`, as the config's `pipelined` engine runs it) and as eager kernels captured,
    on one pair of engines each over the same two models, alternating run by run. The models
    are `init` ones of the pair's shapes in bfloat16: an iteration's time does not depend on
    the weights (a random pair accepts less, so it runs more iterations for the same budget)."""
    from transformers import AutoModelForCausalLM

    device = "cpu" if smoke else "cuda"
    models = {}
    for name in ("target", "draft"):
        spec = model_spec(settings, name, smoke)
        config = train.gpt2_config(spec, spec["vocab_size"], eot=0)
        torch.manual_seed(1)
        with torch.device(device):
            models[name] = AutoModelForCausalLM.from_config(
                config, dtype=torch.float32 if smoke else torch.bfloat16).eval()
    engines = {compiled: [graphs.Engine(m, capture=not smoke, pipelined=True,
                                        fuse_verdict=compiled)
                          for m in models.values()] for compiled in (True, False)}
    prompt = torch.randint(0, models["target"].config.vocab_size, (32,)).tolist()
    rows = []
    for mode, s in (("greedy", GREEDY), ("sampled", Sampling(temperature=1.0))):
        for k in (1, 3) if smoke else ks:
            for repeat in range(-1, 2 if smoke else repeats):  # -1: capture and compilation
                for compiled, (target, draft) in engines.items():
                    g = [torch.Generator(device).manual_seed(seed) for seed in (repeat, 99)]
                    out = speculative.generate(target, draft, prompt, budget, k, s, *g)
                    if repeat >= 0:
                        rows.append({"mode": mode, "k": k, "repeat": repeat,
                                     "verdict": "compiled" if compiled else "eager",
                                     "iterations": out.target_calls,
                                     "iteration_us": out.total_s / out.target_calls * 1e6,
                                     "overhead_us": out.overhead_s / out.target_calls * 1e6,
                                     "overhead_share": out.overhead_share})
            row = pd.DataFrame(rows).query("mode == @mode and k == @k").groupby("verdict")
            log(f"verdict {mode} K={k}: median overhead " + ", ".join(
                f"{v} {g.overhead_us.median():.1f} us ({g.overhead_share.median():.2%})"
                for v, g in row))
    return pd.DataFrame(rows)


def time_verdict(settings, out: Path, smoke: bool, deadline: Deadline,
                 failed: list[str]) -> None:
    if deadline.allows("the verdict's overhead, compiled and not", 30 if smoke else 150):
        df = attempt("verdict overhead", failed, verdict_overhead, settings, smoke)
        if df is not None:
            df.to_csv(out / "stats/verdict.csv", index=False)


def write_tables(frames: list[pd.DataFrame], out: Path) -> None:
    df = pd.concat(frames, ignore_index=True)
    table = summary(df)
    table.to_csv(out / "stats/pair.csv", index=False)
    divergence(df).to_csv(out / "stats/divergence.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table[["engine", "mode", "k", "cost_ratio", "alpha", "measured", "speedup_stepped",
                     "predicted", "measured_over_predicted", "verify_cost", "overhead_share"]]
              .round(3).to_string(index=False), flush=True)


def attempt(step: str, failed: list[str], fn, *args):
    """Run one step; a failure is logged with its traceback and the next steps still run."""
    try:
        return fn(*args)
    except Exception:
        log(f"FAILED {step}:\n{traceback.format_exc()}")
        failed.append(step)
        return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deadline", type=float, required=True, help="seconds from now")
    p.add_argument("--out", required=True)
    p.add_argument("--config", default="config/gpu.yaml")
    p.add_argument("--models", default="results/models", help="where the pair is trained")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, nothing captured")
    p.add_argument("--parts", default="pair,bandwidth",
                   help="what to run, of: pair (train and time the pair), bandwidth, verdict "
                   "(the pipelined loop's overhead, its verdict compiled and not)")
    p.add_argument("--floor-engines", default=",".join(FLOOR_ENGINES),
                   help="the engines timed against the bandwidth floor")
    args = p.parse_args(argv)
    if unknown := set(args.floor_engines.split(",")) - set(FLOOR_ENGINES):
        p.error(f"--floor-engines: {', '.join(sorted(unknown))} not among "
                f"{', '.join(FLOOR_ENGINES)}")
    deadline, out, failed = Deadline(args.deadline), Path(args.out), []
    (out / "stats").mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.enable_cudnn_sdp(False)  # a new cuDNN plan per key length
    settings = load_settings(args.config)
    parts = set(args.parts.split(","))
    if "pair" in parts:
        time_pair(settings, out, Path(args.models), args.smoke, deadline, failed)
    if "verdict" in parts:
        time_verdict(settings, out, args.smoke, deadline, failed)
    if "bandwidth" in parts:
        time_floors(out, args.smoke, deadline, failed, tuple(args.floor_engines.split(",")))
    log(f"done, {deadline.left():.0f} s left" + (f"; FAILED: {', '.join(failed)}" * bool(failed)))
    return 1 if failed else 0


def time_pair(settings, out: Path, models: Path, smoke: bool, deadline: Deadline,
              failed: list[str]) -> None:
    dirs = train_pair(settings, out, models, smoke)
    pairs = {"cuda-cuda": 120} if smoke else {"cuda-cuda": 120, "cuda-cuda-graph": 60}
    frames = []
    for name, needs in pairs.items():
        if deadline.allows(f"study {name}", needs):
            df = attempt(f"study {name}", failed, run_study, settings, dirs, out, name, smoke)
            if df is not None:
                frames.append(df)
                write_tables(frames, out)


# Seconds each engine needs per model, with room to spare: compiling takes a minute or two;
# autotuning gpt2-xl's matmuls takes over five minutes and may not finish in one call (Inductor's
# caches keep what it tuned for a later call on the same machine). `reductions` tunes each
# reduction's launch configuration, and `fused` and its ablations the kernels around their own:
# two to three minutes of warm-up for gpt2-xl, about one for gpt2 (`fused-deterministic` takes
# `fused`'s seconds).
FLOOR_NEEDS = {"gpt2-xl": {"eager": 40, "graph": 40, "compiled": 150, "autotuned": 500,
                           "reductions": 240, "fused": 200, "linear": 150, "layered": 200,
                           "folded": 200, "unwritten": 200},
               "gpt2": {"eager": 20, "graph": 20, "compiled": 60, "autotuned": 160,
                        "reductions": 120, "fused": 100, "linear": 60, "layered": 100,
                        "folded": 100, "unwritten": 100}}


KERNEL_NAME = re.compile(r"""['"]kernel_name['"]: ['"](\w+)['"]""")


def tuned_configs(root: Path, since: float) -> list[dict]:
    """The launch configurations Inductor's autotuning chose since `since` (its `.best_config`
    files under `root`, its cache), each with its kernel's name: what differs between two
    processes whose tuned reductions ran at different speeds. A `.best_config` lies beside its
    kernel's module; where that folder holds several, the name comes from Triton's cache entry
    for the compiled kernel (`triton_cache_hash`, a folder of `<kernel>.json`), and is "?" where
    neither tells it."""
    found = [p for p in sorted(root.rglob("*.best_config")) if p.stat().st_mtime >= since]
    if not found:
        return []
    compiled = {}  # Triton's cache: entry -> the kernel names in it
    for entry in root.rglob("*.json"):
        if not entry.stem.startswith("__"):
            compiled.setdefault(entry.parent.name, set()).add(entry.stem)
    rows = []
    for path in found:
        config = json.loads(path.read_text())
        names = {m for py in path.parent.glob("*.py") for m in KERNEL_NAME.findall(py.read_text())}
        if len(names) != 1:
            names = compiled.get(config.get("triton_cache_hash"), set())
        rows.append({"kernel": next(iter(names)) if len(names) == 1 else "?", **config})
    return rows


@dataclasses.dataclass
class Timed:
    """A floor engine timed on a model, and where its step goes once profiled."""
    floor: FloorModel
    name: str
    engine: object
    rows: list[dict]
    kernels: dict = dataclasses.field(default_factory=dict)


# Seconds a timed engine's three profiled decodes take, with room to spare (they take a few).
PROFILE_NEEDS = 15


def time_floors(out: Path, smoke: bool, deadline: Deadline, failed: list[str],
                names: tuple[str, ...]) -> None:
    """Each model on each engine against the floor, written as each finishes: a call that runs
    out of time keeps the engines already timed. Then, once every engine is timed, where each
    one's step goes (`split_step`): a profiler session leaves CUPTI attached to the process
    (pytorch/pytorch#144455), and CUDA graphs replayed after one run slower, more so after each.
    With them, `tuned.csv`: the configurations Inductor tuned for each engine's kernels
    (`tuned_configs`), and `after_profiler.csv`: the first engine timed again after every
    profile, what that costs."""
    from torch._inductor.runtime.runtime_utils import cache_dir

    timed, tuned = [], []  # every timed engine lives until the profiles: ~3.2 GB for gpt2-xl

    def write():
        pd.DataFrame([t.kernels | row for t in timed for row in t.rows]).to_csv(
            out / "stats/bandwidth.csv", index=False)

    floors = [("gpt2-tiny", torch.float32, 16, "cpu")] if smoke else [
        ("gpt2-xl", torch.float16, 256, "cuda"), ("gpt2", torch.float16, 256, "cuda")]
    for preset, dtype, budget, device in floors:
        f = None
        for name in (n for n in names if runs_here(n, device == "cuda")):
            needs = 10 if smoke else FLOOR_NEEDS[preset][base_engine(name)]
            if not deadline.allows(f"{preset} {name} against the bandwidth floor", needs):
                continue
            f = f or attempt(f"{preset}'s eager tokens", failed, floor_model, preset, dtype,
                             budget, device)
            if f is None:
                break
            start = time.time()
            if got := attempt(f"{preset} {name}", failed, time_engine, f, name, budget, 3):
                timed.append(Timed(f, name, got[1], got[0]))
                write()
            if device == "cuda":  # Inductor tunes only Triton kernels
                tuned += [{"model": preset, "engine": name} | row
                          for row in tuned_configs(Path(cache_dir()), start)]
            if tuned:
                pd.DataFrame(tuned).to_csv(out / "stats/tuned.csv", index=False)
    profiles = 0
    for t in timed:
        step = f"{t.floor.preset} {t.name}'s kernels"
        if deadline.allows(step, PROFILE_NEEDS):
            t.kernels = attempt(step, failed, split_step, t.floor, t.name, t.engine,
                                t.rows[0]["budget"], t.rows[-1]["step_s"]) or {}
            profiles += 1
            write()
    step = "the first engine again, after the profiler"
    if profiles and deadline.allows(step, PROFILE_NEEDS):
        first = timed[0]
        again = attempt(step, failed, time_decodes, first.floor, first.name, first.engine,
                        first.rows[0]["budget"], 3, f", again after {profiles} profiler sessions")
        if again:
            pd.DataFrame([row | {"profiler_sessions_before": profiles} for row in again]).to_csv(
                out / "stats/after_profiler.csv", index=False)


if __name__ == "__main__":
    sys.exit(main())
