"""decodelab's attention kernel against SDPA's backends at one query (and 5), gpt2-xl's heads,
float16, caches of 288 to 16384 slots: CUDA-event median of 200 calls each. (Call 1 ran this
script before it was reformatted for the linter; what it does is unchanged.)"""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from decodelab.engines.cuda import attention


def timed(fn, n=200):
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(n):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[n // 2]


def row(rows: int, length: int) -> str:
    q = torch.randn(1, 25, rows, 64, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(1, 25, length, 64, device="cuda", dtype=torch.float16) for _ in range(2))
    slots = torch.arange(length, device="cuda")[None]
    mask = (slots < length - rows + 1 + torch.arange(rows, device="cuda")[:, None])[None, None]

    def ours():
        return attention.attention(None, q, k, v, mask)[0]

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    ref = {}
    for name, backend in (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
        with sdpa_kernel(backend):
            ref[name] = timed(sdpa)
            out = sdpa()
    diff = (ours() - out.transpose(1, 2)).abs().max().item()
    return (f"{rows},{length},{attention.splits(length)},{timed(ours):.1f},"
            f"{ref['efficient']:.1f},{ref['math']:.1f},{diff:.2e}")


print("rows,length,splits,kernel_us,efficient_us,math_us,max_abs_diff")
for rows in (1, 5):
    for length in (288, 1024, 2048, 4096, 8192, 16384):
        print(row(rows, length), flush=True)
