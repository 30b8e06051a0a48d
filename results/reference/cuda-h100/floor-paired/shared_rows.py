"""decodelab's attention kernel on a verification's rows, one call's time inside a CUDA graph of
CALLS calls: one program per (head, row) as committed, against `attention.SHARED_ROWS` (a pass's
rows in one program per head, each block of keys and values read once), with both masks (a
boolean [T, L] and `causal_ends`' counts). gpt2-xl's shapes (25 heads of 64), float16; the
error is against SDPA's math backend in float32."""

import functools
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, "src")
from decodelab.engines.cuda import attention  # noqa: E402

HEADS, D, CALLS, REPS = 25, 64, 48, 20


def inputs(rows, length, fill):
    g = torch.Generator(device="cuda").manual_seed(length + rows)
    q, k, v = (torch.randn(HEADS, n, D, device="cuda", dtype=torch.float16, generator=g)
               for n in (rows, length, length))
    used = length - 16 if fill == "full" else length // 2
    ends = (used - rows + 1 + torch.arange(rows, device="cuda")).to(torch.int32)
    keep = torch.arange(length, device="cuda")[None, :] < ends[:, None]
    return q, k, v, keep, ends


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


def main():
    print("rows,length,fill,mask,shared,parts,us_per_call,kv_GBps,max_err", flush=True)
    for rows in (1, 5, 9):
        for length in (288, 1024, 4096, 16384):
            for fill in ("full", "half"):
                q, k, v, keep, ends = inputs(rows, length, fill)
                with sdpa_kernel(SDPBackend.MATH):
                    want = torch.nn.functional.scaled_dot_product_attention(
                        q[None].float(), k[None].float(), v[None].float(), keep[None, None],
                        scale=D**-0.5)[0].transpose(0, 1)
                kv = 2 * int(ends[-1]) * HEADS * D * k.element_size()
                for mask_name, mask in (("bool", keep), ("ends", ends)):
                    for shared in ((False, True) if rows > 1 else (False,)):
                        attention.SHARED_ROWS = shared
                        fn = functools.partial(torch.ops.decodelab.attend, q, k, v, mask, D**-0.5)
                        try:
                            err = (fn().float() - want).abs().max().item()
                            us = per_call_us(fn)
                            print(f"{rows},{length},{fill},{mask_name},{shared},"
                                  f"{attention.splits(length)},{us:.2f},{kv / us / 1e3:.0f},"
                                  f"{err:.1e}", flush=True)
                        except Exception as e:  # a failing variant is a row, not the end
                            print(f"{rows},{length},{fill},{mask_name},{shared},"
                                  f"{attention.splits(length)},nan,nan,"
                                  f"{type(e).__name__}: {str(e)[:80]!r}", flush=True)
    attention.SHARED_ROWS = False


if __name__ == "__main__":
    main()
