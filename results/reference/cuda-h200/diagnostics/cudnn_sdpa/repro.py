"""Host cost of cuDNN attention at a new key length: a standalone reproduction (plain torch).

Decoding with a KV cache calls `scaled_dot_product_attention` with a key length one longer at
every step, and speculative verification with a query of K+1 tokens at a key length that
grows by the accepted count. PyTorch's cuDNN SDPA backend keys its execution-plan cache on the
exact shapes and strides, so every new key length is a cache miss that builds a plan on the
host. This script times the host side of such calls, per step, in two passes over the same
lengths in one process: pass 0 meets every length for the first time, pass 1 finds all of
them cached. With `--model gpt2` it runs the same loop through transformers' GPT-2 (random
weights from its config, no download) with its DynamicCache, as a decoding harness does.
`--case budgets` decodes several budgets one after another in one process, in the shuffled
order a latency sweep uses: a run steps up where it passes the longest key length that an
earlier run of the process reached, since only the lengths beyond it are new.

    python repro.py --out DIR          # the whole matrix, each case in its own process
    python repro.py --case decode --backend cudnn --dtype float16   # one case, JSON to stdout

Each case prints one JSON line: per-step host and wall times for both passes, the first
step-up (steps staying above 2.5x the median of the first 8 for 8 steps in a row), and what
TORCH_CUDNN_SDPA_CACHE_DEBUG=1 reported (calls and hit rate) when it is set.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "default": None,
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
    "flash": [SDPBackend.FLASH_ATTENTION],
    "no-cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}
ENVS = {"plain": {}, "cache-debug": {"TORCH_CUDNN_SDPA_CACHE_DEBUG": "1"},
        "avoid-recompile": {"TORCH_CUDNN_SDPA_AVOID_RECOMPILE": "1",
                            "TORCH_CUDNN_SDPA_CACHE_DEBUG": "1"}}
CACHE_LINE = re.compile(r"SDPA Cache Called (\d+) times\. Hit rate: (\d+)%")
HEADS, HEAD_DIM, LAYERS = 12, 64, 12  # GPT-2 small


BUDGETS = [64, 16, 256, 32, 128, 8, 512]  # a shuffled sweep's order


def lengths(case: str, prompt: int, steps: int, k: int) -> list[tuple[int, int]]:
    """(query length, key length) per step: one new token a step when decoding; K+1 query
    tokens over a key that grows by a varying accepted count when verifying."""
    if case in ("decode", "budgets"):
        return [(1, prompt + s + 1) for s in range(steps)]
    accepted = itertools.cycle([k, 1, k // 2 + 1, 2, k, 0])
    out, key = [], prompt
    for _ in range(steps):
        out.append((k + 1, key + k + 1))
        key += next(accepted) + 1
    return out


def kv_buffers(layout: str, max_len: int, dtype: torch.dtype):
    """A BHSD cache grown by concatenation (as transformers' DynamicCache) or a preallocated
    BSHD buffer sliced per step (the layout TORCH_CUDNN_SDPA_AVOID_RECOMPILE accepts)."""
    if layout == "bshd":
        buf = torch.randn(1, max_len, HEADS, HEAD_DIM, device="cuda", dtype=dtype)
        return lambda n: buf[:, :n].transpose(1, 2)
    buf = torch.randn(1, HEADS, max_len, HEAD_DIM, device="cuda", dtype=dtype)
    return lambda n: buf[:, :, :n].clone()  # a fresh contiguous tensor, as torch.cat gives


def attention_step(kv, q_len: int, k_len: int, dtype: torch.dtype, masked: bool):
    q = torch.randn(1, q_len, HEADS, HEAD_DIM, device="cuda", dtype=dtype).transpose(1, 2)
    k = v = kv(k_len)
    mask = None
    if masked and q_len > 1:  # a causal mask over the cached prefix, as a verifier passes
        mask = torch.ones(q_len, k_len, device="cuda", dtype=torch.bool).tril(k_len - q_len)

    def run():
        for _ in range(LAYERS):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return run


def gpt2_step(model, prompt: int):
    from transformers import DynamicCache
    state = {}

    def reset():
        state["cache"] = DynamicCache(config=model.config)
        ids = torch.randint(0, 1000, (1, prompt), device="cuda")
        out = model(ids, past_key_values=state["cache"], use_cache=True)
        state["next"] = out.logits[:, -1:].argmax(-1)

    def step(q_len: int):
        ids = state["next"].repeat(1, q_len)
        out = model(ids, past_key_values=state["cache"], use_cache=True)
        state["next"] = out.logits[:, -1:].argmax(-1)
    return reset, step


def timed(fn) -> tuple[float, float]:
    """Host time until the step's work is queued, and wall time until it is done."""
    start = time.perf_counter()
    fn()
    queued = time.perf_counter()
    torch.cuda.synchronize()
    return queued - start, time.perf_counter() - start


def step_up(times: list[float], window: int = 8, factor: float = 2.5) -> int | None:
    if len(times) < 2 * window:
        return None
    base = statistics.median(times[:window])
    for i in range(window, len(times) - window + 1):
        if all(t > factor * base for t in times[i:i + window]):
            return i
    return None


def run_case(args) -> dict:
    dtype = getattr(torch, args.dtype)
    shapes = lengths(args.case, args.prompt, args.steps, args.k)
    backends = BACKENDS[args.backend]
    passes = []
    with warnings.catch_warnings(record=True) as caught, \
            (sdpa_kernel(backends) if backends else _null()):
        warnings.simplefilter("always")
        if args.case == "budgets":
            passes = run_budgets(args, dtype)
            shapes = [len(p) for p in passes]
        elif args.model == "gpt2":
            passes = run_gpt2(args, dtype, shapes)
        else:
            kv = kv_buffers(args.layout, shapes[-1][1] + 1, dtype)
            for _ in range(2):
                passes.append([timed(attention_step(kv, q, n, dtype, args.masked))
                               for q, n in shapes])
    debug = cache_debug("\n".join(str(w.message) for w in caught))
    host = [[h for h, _ in p] for p in passes]
    wall = [[w for _, w in p] for p in passes]
    return {
        "case": args.case, "model": args.model, "backend": args.backend, "dtype": args.dtype,
        "layout": args.layout, "masked": args.masked, "k": args.k, "prompt": args.prompt,
        "env": {k: v for k, v in os.environ.items() if k.startswith("TORCH_CUDNN")},
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(),
        "shapes": shapes, "host_s": host, "wall_s": wall,
        "host_median_ms": [1e3 * statistics.median(h) for h in host],
        "wall_median_ms": [1e3 * statistics.median(w) for w in wall],
        "step_up_at": [step_up(w) for w in wall],
        "budgets": BUDGETS if args.case == "budgets" else None,
        **debug,
        "warnings": sorted({str(w.message)[:160] for w in caught if not CACHE_LINE.search(
            str(w.message))}),
    }


def gpt2(dtype):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_positions=4096, attn_implementation="sdpa")
    return GPT2LMHeadModel(config).to("cuda", dtype).eval()


def run_budgets(args, dtype):
    """One decode run per budget of BUDGETS, in that order, in this process (one "pass" each)."""
    reset, step = gpt2_step(gpt2(dtype), args.prompt)
    runs = []
    with torch.inference_mode():
        for budget in BUDGETS:
            reset()
            torch.cuda.synchronize()
            runs.append([timed(lambda: step(1)) for _ in range(budget)])
    return runs


def run_gpt2(args, dtype, shapes):
    reset, step = gpt2_step(gpt2(dtype), args.prompt)
    passes = []
    with torch.inference_mode():
        for _ in range(2):  # the second pass decodes the same lengths again
            reset()
            torch.cuda.synchronize()
            passes.append([timed(lambda q=q: step(q)) for q, _ in shapes])
    return passes


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


MATRIX = [
    # (model, case, layout, masked, k, steps)
    ("sdpa", "decode", "bhsd", False, 0, 512),
    ("sdpa", "decode", "bshd", False, 0, 512),
    ("sdpa", "verify", "bhsd", True, 4, 128),
    ("sdpa", "verify", "bshd", False, 4, 128),
    ("gpt2", "decode", "bhsd", False, 0, 256),
    ("gpt2", "verify", "bhsd", True, 4, 64),
    ("gpt2", "budgets", "bhsd", False, 0, 0),
]


def run_matrix(out: Path, dtypes: list[str], backends: list[str], models: list[str],
               cases: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "cases.jsonl", "a") as sink:
        for (model, case, layout, masked, k, steps), dtype, backend, env in itertools.product(
                MATRIX, dtypes, backends, ENVS):
            if (backend != "cudnn" and env != "plain") or model not in models \
                    or case not in cases:
                continue
            cmd = [sys.executable, __file__, "--model", model, "--case", case, "--layout",
                   layout, "--k", str(k), "--steps", str(steps), "--dtype", dtype,
                   "--backend", backend] + (["--masked"] if masked else [])
            done = subprocess.run(cmd, capture_output=True, text=True,
                                  env={**os.environ, **ENVS[env]}, timeout=600)
            if done.returncode:
                record = {"cmd": cmd, "env_name": env, "error": done.stderr[-2000:]}
            else:
                record = {**json.loads(done.stdout.splitlines()[-1]), "env_name": env}
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            print(summary_line(record), flush=True)


def cache_debug(text: str) -> dict:
    """What TORCH_CUDNN_SDPA_CACHE_DEBUG=1 said last (a C++ warning, raised as a Python one)."""
    found = CACHE_LINE.findall(text)
    if not found:
        return {}
    calls, hits = found[-1]
    return {"cache_calls": int(calls), "cache_hit_percent": int(hits)}


def summary_line(r: dict) -> str:
    if "error" in r:
        return f"ERROR {r['cmd'][2:]} {r['env_name']}: {r['error'][-300:]}"
    return (f"{r['model']:5} {r['case']:6} {r['layout']} mask={int(r['masked'])} "
            f"{r['dtype']:8} {r['backend']:8} {r['env_name']:15} "
            f"host ms/step {r['host_median_ms'][0]:7.3f} -> {r['host_median_ms'][1]:7.3f}  "
            f"wall {r['wall_median_ms'][0]:7.3f} -> {r['wall_median_ms'][1]:7.3f}  "
            f"step-up {r['step_up_at']}  cache {r.get('cache_calls')} calls "
            f"{r.get('cache_hit_percent')}% hits")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="run the whole matrix, writing DIR/cases.jsonl")
    p.add_argument("--model", choices=["sdpa", "gpt2"], default="sdpa")
    p.add_argument("--case", choices=["decode", "verify", "budgets"], default="decode")
    p.add_argument("--layout", choices=["bhsd", "bshd"], default="bhsd")
    p.add_argument("--masked", action="store_true")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    p.add_argument("--backend", choices=list(BACKENDS), default="default")
    p.add_argument("--backends", nargs="+", default=["cudnn", "no-cudnn", "default"])
    p.add_argument("--models", nargs="+", default=["sdpa", "gpt2"])
    p.add_argument("--cases", nargs="+", default=["decode", "verify", "budgets"])
    args = p.parse_args()
    if args.out:
        run_matrix(args.out, args.dtypes, args.backends, args.models, args.cases)
    else:
        print(json.dumps(run_case(args)))


if __name__ == "__main__":
    main()
