"""What folding GPT-2's residual add and layer norm into the next one-row product would save:
per layer of gpt2-xl (1,600 wide, float16), inside a CUDA graph of LAYERS distinct weights (no
host launch, weights from HBM), the `fused` engine's way (an Inductor kernel for `s = h + a;
ln(s)` under coordinate descent, then `matvec_kernel`) against one kernel that adds, normalizes
and multiplies (`ln_matvec_kernel`: each program recomputes the row's statistics from L2, the
first writes s). Shapes: c_attn (4,800 out) and c_fc (6,400 out, GELU). Also the product alone.
On a CPU (TRITON_INTERPRET=1) it checks the kernel's values only."""

import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "src")
from decodelab.engines.cuda import fused, matvec  # noqa: E402

WIDTH, LAYERS, REPS = 1600, 48, 20
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@triton.jit
def ln_matvec_kernel(h, a, s_out, g, beta, w, b, out, n, k, w_n, eps, BN: tl.constexpr,
                     KP: tl.constexpr, GELU: tl.constexpr):
    """s = h + a (as float16), y = layer_norm(s) * g + beta (as float16), out = w y + b (GELU)."""
    i = tl.arange(0, KP)
    inside = i < k
    s = (tl.load(h + i, mask=inside, other=0.0) + tl.load(a + i, mask=inside, other=0.0))
    if tl.program_id(0) == 0:
        tl.store(s_out + i, s, mask=inside)
    s = s.to(tl.float32)
    mean = tl.sum(s, axis=0) / k
    centred = tl.where(inside, s - mean, 0.0)
    rstd = 1 / tl.sqrt(tl.sum(centred * centred, axis=0) / k + eps)
    y = centred * rstd * tl.load(g + i, mask=inside, other=0.0).to(tl.float32)
    y = (y + tl.load(beta + i, mask=inside, other=0.0).to(tl.float32)).to(h.dtype.element_ty)
    cols = tl.program_id(0) * BN + tl.arange(0, BN)
    live = cols < n
    ws = tl.load(w + cols[:, None] * w_n + i[None, :], mask=live[:, None] & inside[None, :],
                 other=0.0)
    acc = tl.sum(ws.to(tl.float32) * y.to(tl.float32)[None, :], axis=1)
    acc += tl.load(b + cols, mask=live, other=0.0).to(tl.float32)
    if GELU:
        acc = acc.to(out.dtype.element_ty).to(tl.float32)
        inner = 1.5957691216057308 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (2 - 2 / (tl.exp(inner) + 1))
    tl.store(out + cols, acc.to(out.dtype.element_ty), mask=live)


def folded(h, a, s_out, g, beta, w, b, out, gelu):
    n, k = w.shape
    ln_matvec_kernel[(triton.cdiv(n, matvec.BN),)](
        h, a, s_out, g, beta, w, b, out, n, k, w.stride(0), 1e-5, BN=matvec.BN,
        KP=triton.next_power_of_2(k), GELU=gelu, num_warps=matvec.WARPS)
    return out


def add_norm(h, a, g, beta):
    s = h + a
    return s, torch.nn.functional.layer_norm(s, (s.shape[-1],), g, beta, 1e-5)


def layers(out_features):
    gen = torch.Generator(device=DEVICE).manual_seed(out_features)
    half = dict(device=DEVICE, dtype=torch.float16)
    ws = [torch.randn(out_features, WIDTH, generator=gen, **half) / WIDTH**0.5
          for _ in range(LAYERS if CUDA else 1)]
    bias = torch.randn(out_features, generator=gen, **half) / 10
    g = 1 + torch.randn(WIDTH, generator=gen, **half) / 10
    beta = torch.randn(WIDTH, generator=gen, **half) / 10
    h, a = (torch.randn(1, WIDTH, generator=gen, **half) for _ in range(2))
    return ws, bias, g, beta, h, a


def graph_us(step):
    """Median time of one call of `step` (which runs all LAYERS) in a CUDA graph, per layer."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
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
        times.append(start.elapsed_time(end) * 1000 / (REPS * LAYERS))
    return sorted(times)[2]


def shape(name, out_features, gelu, compiled_norm):
    ws, bias, g, beta, h, a = layers(out_features)
    s_out, out = torch.empty_like(h), h.new_empty(1, out_features)
    s, y = add_norm(h, a, g, beta)
    want = torch.ops.decodelab.engines.cuda.matvec(y, ws[0], bias, gelu)
    got = folded(h, a, s_out, g, beta, ws[0], bias, out, gelu)
    err = (got.float() - want.float()).abs().max().item()
    same_s = torch.equal(s_out, s)
    if not CUDA:
        print(f"{name},cpu-interpreted,nan,{err:.1e},{same_s}", flush=True)
        return

    def unfused():
        for w in ws:
            s, y = compiled_norm(h, a, g, beta)
            torch.ops.decodelab.engines.cuda.matvec(y, w, bias, gelu)

    def product():
        for w in ws:
            torch.ops.decodelab.engines.cuda.matvec(h, w, bias, gelu)

    def one_kernel():
        for w in ws:
            folded(h, a, s_out, g, beta, w, bias, out, gelu)

    for label, step in (("add+norm kernel, matvec", unfused), ("ln_matvec", one_kernel),
                        ("matvec alone", product)):
        print(f"{name},{label},{graph_us(step):.2f},{err:.1e},{same_s}", flush=True)


def main():
    torch._inductor.config.coordinate_descent_tuning = fused.COMPILE["coordinate_descent_tuning"]
    norm = torch.compile(add_norm) if CUDA else add_norm
    print("shape,variant,us_per_layer,max_err_vs_unfused,s_equal", flush=True)
    shape("c_attn 4800", 4800, False, norm)
    shape("c_fc 6400 gelu", 6400, True, norm)


if __name__ == "__main__":
    main()
