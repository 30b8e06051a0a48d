"""decodelab's attention kernel, one call's time inside a CUDA graph of CALLS calls (no host
launch in the figure), against the kernel at 982625f, at 6bbc414 (keys and values loaded beside
the mask) and SDPA's memory-efficient backend; kv_GBps counts the slots in use.
Shapes: gpt2-xl (25 heads of 64), float16, 1 row (a step) and 5 (verifying K=4)."""

import functools
import importlib.util
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, "src")
from decodelab.engines.cuda import attention as cur  # noqa: E402


def load(name):
    """decodelab.engines.cuda.attention at an earlier commit, its op renamed to `name` (.gpu/attention_*.py)."""
    spec = importlib.util.spec_from_file_location(name, f".gpu/attention_{name[-7:]}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


old, beside = load("old982625f"), load("beside6bbc414")

HEADS, D, CALLS, REPS = 25, 64, 48, 20
LENGTHS = (288, 1024, 4096, 16384)
FILLS = ("full", "half")  # the cache's slots in use: all but 16, or half


def inputs(rows, length, fill):
    g = torch.Generator(device="cuda").manual_seed(length + rows)
    q = torch.randn(HEADS, rows, D, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(HEADS, length, D, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(HEADS, length, D, device="cuda", dtype=torch.float16, generator=g)
    used = length - 16 if fill == "full" else length // 2
    slot = torch.arange(length, device="cuda")
    keep = slot[None, :] < (used - rows + 1 + torch.arange(rows, device="cuda"))[:, None]
    return q, k, v, keep


def per_call_us(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(REPS):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / (REPS * CALLS))
    return sorted(times)[len(times) // 2]


def variants():
    then = {"SPLIT_FROM": 1024, "SPLIT_SPAN": 512}  # the split calls 3 and 4 had
    yield "982625f block64", old, {"BLOCK": 64} | then
    yield "6bbc414 block64", beside, {"BLOCK": 64} | then
    yield "6bbc414 block128", beside, {"BLOCK": 128} | then
    for block in (64, 128):
        yield f"head block{block}", cur, {"BLOCK": block} | then
    yield "head block64 split256 span64", cur, {"BLOCK": 64, "SPLIT_FROM": 256, "SPLIT_SPAN": 64}
    for split in (256, 512):
        yield f"head block128 split{split} span128", cur, {"SPLIT_FROM": split, "SPLIT_SPAN": 128}
    # added after call 4 (no call has run it): a pass's rows in one program per head
    yield "head block128 split512 span128 shared", cur, {"SPLIT_FROM": 512, "SPLIT_SPAN": 128,
                                                          "SHARED_ROWS": True}


def efficient(q, k, v, keep, scale):
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(
            q[None], k[None], v[None], keep[None, None], scale=scale)[0].transpose(0, 1)


def row(name, rows, length, fill, parts, fn, want, kv):
    try:
        err = (fn().float() - want).abs().max().item()
        us = per_call_us(fn)
        print(f"{name},{rows},{length},{fill},{parts},{us:.2f},{kv / us / 1e3:.0f},{err:.1e}",
              flush=True)
    except Exception as e:  # a variant that fails to compile is a row, not the end
        print(f"{name},{rows},{length},{fill},{parts},nan,nan,{type(e).__name__}: {str(e)[:80]!r}",
              flush=True)


def shape(rows, length, fill, defaults):
    q, k, v, keep = inputs(rows, length, fill)
    scale = D**-0.5
    with sdpa_kernel(SDPBackend.MATH):
        want = torch.nn.functional.scaled_dot_product_attention(
            q[None].float(), k[None].float(), v[None].float(), keep[None, None],
            scale=scale)[0].transpose(0, 1)
    kv = 2 * keep[-1].sum().item() * HEADS * D * k.element_size()  # the slots in use
    args = (q, k, v, keep, scale)
    for name, module, patch in variants():
        for key, value in {**defaults, **patch}.items():
            setattr(module, key, value)
        op = {old: torch.ops.old982625f, beside: torch.ops.beside6bbc414}.get(
            module, torch.ops.decodelab).attend
        row(name, rows, length, fill, module.splits(length), functools.partial(op, *args), want, kv)
    for key, value in defaults.items():
        setattr(cur, key, value)
    row("sdpa efficient", rows, length, fill, 0, functools.partial(efficient, *args), want, kv)


def main():
    print("variant,rows,length,fill,parts,us_per_call,kv_GBps,max_err")
    defaults = {name: getattr(cur, name)
                for name in ("BLOCK", "SPLIT_FROM", "SPLIT_SPAN", "SHARED_ROWS")}
    for rows in (1, 5):
        for length in LENGTHS:
            for fill in FILLS:
                shape(rows, length, fill, defaults)


if __name__ == "__main__":
    main()
