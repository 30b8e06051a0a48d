"""One-row matmuls (x @ W.T + b, float16) of gpt2-xl and gpt2, one call's time inside a CUDA graph
of CALLS calls over COPIES distinct weights (read from HBM, not L2; no host launch in the figure):
cuBLAS (F.linear), Inductor's reduction with and without coordinate-descent tuning (the `fused`
engine's), and decodelab's matvec kernel at its default configuration and over a grid of
(BN, BK, warps). GBps counts the weight's and bias's bytes read."""

import functools
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, "src")
from decodelab.engines.cuda import matvec  # noqa: E402

CALLS, REPS = 48, 20
SHAPES = {"gpt2-xl": [("qkv", 4800, 1600, True), ("proj", 1600, 1600, True),
                      ("fc", 6400, 1600, True), ("mlp_proj", 1600, 6400, True),
                      ("lm_head", 50257, 1600, False)],
          "gpt2": [("qkv", 2304, 768, True), ("proj", 768, 768, True), ("fc", 3072, 768, True),
                   ("mlp_proj", 768, 3072, True), ("lm_head", 50257, 768, False)]}
GRID = [(bn, bk, warps) for bn in (1, 2, 4, 8, 16) for bk in (512, 1024, 2048)
        for warps in (4, 8)]
SMALL_GRID = [(bn, bk, 4) for bn in (1, 2, 4, 8) for bk in (512, 1024)]


def per_call_us(fn, copies):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(i % copies)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(i % copies)
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


def raw(x, ws, bs, out, bn, bk, warps, i):
    n, k = ws[i].shape
    matvec.matvec_kernel[(triton.cdiv(n, bn),)](
        x, ws[i], ws[i] if bs[i] is None else bs[i], out, n, k, k, BN=bn, BK=bk,
        BIAS=bs[i] is not None, GELU=False, num_warps=warps)
    return out


def shape(model, name, n, k, bias):
    nbytes = 2 * (n * k + (n if bias else 0))
    copies = min(CALLS, max(8, -(-600 * 2**20 // nbytes)))
    g = torch.Generator(device="cuda").manual_seed(n * k)
    x = torch.randn(1, k, device="cuda", dtype=torch.float16, generator=g)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16, generator=g) / k**0.5
          for _ in range(copies)]
    bs = [torch.randn(n, device="cuda", dtype=torch.float16, generator=g)
          for _ in range(copies)] if bias else [None] * copies
    want = F.linear(x.float(), ws[0].float(), None if bs[0] is None else bs[0].float())
    out = torch.empty(1, n, device="cuda", dtype=torch.float16)

    def report(variant, fn):
        try:
            err = (fn(0).float() - want).abs().max().item()
            us = per_call_us(fn, copies)
            print(f"{model},{name},{n},{k},{variant},{us:.2f},{nbytes / us / 1e3:.0f},{err:.1e}",
                  flush=True)
        except Exception as e:  # a variant that fails is a row, not the end
            print(f"{model},{name},{n},{k},{variant},nan,nan,{type(e).__name__}: {str(e)[:60]!r}",
                  flush=True)

    report("cublas", lambda i: F.linear(x, ws[i], bs[i]))
    for label, options in (("inductor", {}), ("inductor cd", {"coordinate_descent_tuning": True})):
        torch._dynamo.reset()
        fn = torch.compile(lambda x, w, b: x @ w.t() if b is None else x @ w.t() + b,
                           options=options, dynamic=False)
        report(label, lambda i, fn=fn: fn(x, ws[i], bs[i]))
    bk = min(matvec.BLOCK_K, triton.next_power_of_2(k))
    report(f"matvec default {matvec.BN}/{bk}/{matvec.WARPS}",
           lambda i: torch.ops.decodelab.engines.cuda.matvec(x, ws[i], bs[i], False))
    for bn, bk, warps in GRID if model == "gpt2-xl" else SMALL_GRID:
        if bk <= 2 * triton.next_power_of_2(k):
            report(f"matvec {bn}/{bk}/{warps}",
                   functools.partial(raw, x, ws, bs, out, bn, bk, warps))


def main():
    print("model,matrix,n,k,variant,us_per_call,GBps,max_err", flush=True)
    for model, shapes in SHAPES.items():
        for name, n, k, bias in shapes:
            shape(model, name, n, k, bias)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
