"""One Triton kernel for a decoding step's matmuls: one row times a Linear's weight, plus its bias,
and GPT-2's GELU where the MLP's first product feeds it.

A batch-1 step multiplies one row by every weight matrix of the model: a GEMV that reads the matrix
once, so its time is the matrix's bytes over the memory bandwidth the kernel reaches. `matvec` runs
one program per BN output columns, each reading its BN rows of the weight ([out, in], contiguous
along `in`) in chunks of BK, accumulating in float32 and summing once at the end. Inductor's tuned
reductions compute the same product about as fast alone, but their launch configuration is tuned
anew in every process, so their time varies from one process to the next where this kernel's does
not, and in the model Inductor fuses the GELU into the next product's reads, where it is computed
once per row of the weight. `norm_matvec_kernel` runs a layer norm (after a residual add, which its
first program writes out) in each program before the product, and `matvec_kernel` adds a residual
after it: GPT-2's block then has no kernel of its own for either (`fused.fold_norms`). Each program
recomputes the row's statistics, from L2: reading one row again costs less than the separate kernel
it saves. It serves one row of a CUDA tensor (or any, under `TRITON_INTERPRET=1`, the tests);
anything else, and every call where Triton is missing, is a plain matmul.
"""

from __future__ import annotations

import torch

from decodelab.engines.cuda.attention import INTERPRETED, triton

if triton is not None:
    import triton.language as tl

    from decodelab.engines.cuda.attention import launch

# Rows per program, columns per iteration and warps: 2 rows, 1,024 columns and 4 warps, the
# fastest or near it for each of gpt2-xl's and gpt2's five weight shapes among the configurations
# tried. Larger tiles (16 rows of 2,048 columns on 4 warps) spill registers and run many times
# slower.
BN = 2
BLOCK_K = 1024
WARPS = 4
NORM_WIDTH = 8192  # the widest row a program normalizes whole, in registers


if triton is not None:

    @triton.jit
    def matvec_kernel(x, w, b, r, out, n, k, w_n, BN: tl.constexpr, BK: tl.constexpr,
                      BIAS: tl.constexpr, GELU: tl.constexpr, RESIDUAL: tl.constexpr):
        """Program p: out[p * BN:(p + 1) * BN] = w[those rows] @ x (+ b), and with GELU set,
        GPT-2's tanh GELU of that; with RESIDUAL, r's columns added to it."""
        cols = tl.program_id(0) * BN + tl.arange(0, BN)
        live = cols < n
        acc = tl.zeros([BN, BK], tl.float32)
        for start in range(0, k, BK):
            i = start + tl.arange(0, BK)
            inside = i < k
            xs = tl.load(x + i, mask=inside, other=0.0).to(tl.float32)
            ws = tl.load(w + cols[:, None] * w_n + i[None, :], mask=live[:, None] & inside[None, :],
                         other=0.0)
            acc += ws.to(tl.float32) * xs[None, :]
        y = tl.sum(acc, axis=1)
        if BIAS:
            y += tl.load(b + cols, mask=live, other=0.0).to(tl.float32)
        y = finish(y, r, cols, live, out.dtype.element_ty, GELU, RESIDUAL)
        tl.store(out + cols, y.to(out.dtype.element_ty), mask=live)

    @triton.jit
    def finish(y, r, cols, live, dtype: tl.constexpr, GELU: tl.constexpr, RESIDUAL: tl.constexpr):
        """A product's epilogue, each step on the value rounded to `dtype` as the unfused model
        rounds it: GPT-2's tanh GELU, a residual's add."""
        if GELU:
            y = y.to(dtype).to(tl.float32)
            inner = 1.5957691216057308 * (y + 0.044715 * y * y * y)  # 2 sqrt(2 / pi) (...)
            y = 0.5 * y * (2 - 2 / (tl.exp(inner) + 1))  # 1 + tanh(inner / 2)
        if RESIDUAL:
            y = y.to(dtype).to(tl.float32) + tl.load(r + cols, mask=live, other=0.0).to(tl.float32)
        return y

    @triton.jit
    def norm_matvec_kernel(x, d, s_out, g, beta, w, b, out, n, k, w_n, eps, BN: tl.constexpr,
                           KP: tl.constexpr, ADD: tl.constexpr, GELU: tl.constexpr):
        """Program p: s = x (+ d with ADD, rounded to x's type; program 0 writes it to s_out),
        y = layer_norm(s) * g + beta rounded to x's type, out[p * BN:(p + 1) * BN] = w[those rows]
        @ y + b (GELU). KP: k rounded up to a power of two, the whole row at once."""
        i = tl.arange(0, KP)
        inside = i < k
        s = tl.load(x + i, mask=inside, other=0.0)
        if ADD:
            s = (tl.load(d + i, mask=inside, other=0.0) + s).to(x.dtype.element_ty)
            if tl.program_id(0) == 0:
                tl.store(s_out + i, s, mask=inside)
        s = s.to(tl.float32)
        mean = tl.sum(s, axis=0) / k
        centred = tl.where(inside, s - mean, 0.0)
        rstd = 1 / tl.sqrt(tl.sum(centred * centred, axis=0) / k + eps)
        y = centred * rstd * tl.load(g + i, mask=inside, other=0.0).to(tl.float32)
        y = y + tl.load(beta + i, mask=inside, other=0.0).to(tl.float32)
        y = y.to(x.dtype.element_ty).to(tl.float32)
        cols = tl.program_id(0) * BN + tl.arange(0, BN)
        live = cols < n
        ws = tl.load(w + cols[:, None] * w_n + i[None, :], mask=live[:, None] & inside[None, :],
                     other=0.0)
        acc = tl.sum(ws.to(tl.float32) * y[None, :], axis=1)
        acc += tl.load(b + cols, mask=live, other=0.0).to(tl.float32)
        acc = finish(acc, b, cols, live, out.dtype.element_ty, GELU, False)
        tl.store(out + cols, acc.to(out.dtype.element_ty), mask=live)

    @torch.library.triton_op("decodelab::matvec", mutates_args=())
    def matvec_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  gelu: bool, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., in] holding one row, weight [out, in], bias [out] or None, residual like the
        output or None: out [..., out]."""
        n, k = weight.shape
        out = x.new_empty(*x.shape[:-1], n)
        launch(matvec_kernel)[(triton.cdiv(n, BN),)](
            x, weight, weight if bias is None else bias, out if residual is None else residual,
            out, n, k, weight.stride(0), BN=BN, BK=min(BLOCK_K, triton.next_power_of_2(k)),
            BIAS=bias is not None, GELU=gelu, RESIDUAL=residual is not None, num_warps=WARPS)
        return out

    def norm_matvec(x, delta, s_out, norm_weight, norm_bias, eps, weight, bias, gelu):
        n, k = weight.shape
        out = x.new_empty(*x.shape[:-1], n)
        launch(norm_matvec_kernel)[(triton.cdiv(n, BN),)](
            x, x if delta is None else delta, out if s_out is None else s_out, norm_weight,
            norm_bias, weight, bias, out, n, k, weight.stride(0), eps, BN=BN,
            KP=triton.next_power_of_2(k), ADD=delta is not None, GELU=gelu, num_warps=WARPS)
        return out

    @torch.library.triton_op("decodelab::norm_matvec", mutates_args=())
    def norm_matvec_op(x: torch.Tensor, norm_weight: torch.Tensor, norm_bias: torch.Tensor,
                       eps: float, weight: torch.Tensor, bias: torch.Tensor, gelu: bool
                       ) -> torch.Tensor:
        """layer_norm(x) @ weight.T + bias (GELU), x one row."""
        return norm_matvec(x, None, None, norm_weight, norm_bias, eps, weight, bias, gelu)

    @torch.library.triton_op("decodelab::add_norm_matvec", mutates_args=())
    def add_norm_matvec_op(x: torch.Tensor, delta: torch.Tensor, norm_weight: torch.Tensor,
                           norm_bias: torch.Tensor, eps: float, weight: torch.Tensor,
                           bias: torch.Tensor, gelu: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(s, layer_norm(s) @ weight.T + bias (GELU)) with s = delta + x, x one row."""
        s = torch.empty_like(x)
        return s, norm_matvec(x, delta, s, norm_weight, norm_bias, eps, weight, bias, gelu)


def serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes this product (else a matmul does)."""
    on_device = x.is_cuda or (INTERPRETED and x.device.type == "cpu")
    return (triton is not None and on_device and x.numel() == x.shape[-1] == weight.shape[1]
            and x.is_contiguous() and weight.is_contiguous() and x.dtype == weight.dtype)


def fits(operand: torch.Tensor | None, x: torch.Tensor, shape) -> bool:
    """Whether a kernel can read `operand` (None: there is none) beside row `x`: `shape`,
    contiguous, x's type."""
    return operand is None or (operand.shape == shape and operand.is_contiguous()
                               and operand.dtype == x.dtype)


def fuses(act) -> bool:
    """Whether the kernel computes activation module `act` itself: GPT-2's tanh GELU."""
    from transformers.activations import NewGELUActivation

    return type(act) is NewGELUActivation


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act=None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """act(x @ weight.T (+ bias)) (+ residual), `act` None or one the kernel `fuses`: on the
    kernel where it serves, else a matmul, an add and `act`."""
    if serves(x, weight) and fits(residual, x, (*x.shape[:-1], weight.shape[0])):
        return torch.ops.decodelab.matvec(x, weight, bias, act is not None, residual)
    y = torch.matmul(x, weight.t())
    y = y if bias is None else y + bias
    y = y if act is None else act(y)
    return y if residual is None else residual + y  # as GPT-2's block adds it


def norms(x: torch.Tensor, norm, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `norm_linear` runs this product, after LayerNorm `norm`, on the kernel."""
    return (serves(x, weight) and bias is not None and x.shape[-1] <= NORM_WIDTH
            and type(norm) is torch.nn.LayerNorm and norm.weight is not None
            and norm.bias is not None and norm.normalized_shape == (x.shape[-1],))


def norm_linear(x: torch.Tensor, delta: torch.Tensor | None, norm, weight: torch.Tensor,
                bias: torch.Tensor | None, act=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, act(norm(s) @ weight.T + bias)) with s = delta + x (delta None: x), LayerNorm `norm`:
    one kernel where it `norms`, else the add, the norm and `linear`."""
    if norms(x, norm, weight, bias) and fits(delta, x, x.shape):
        args = (norm.weight, norm.bias, norm.eps, weight, bias, act is not None)
        if delta is None:
            return x, torch.ops.decodelab.norm_matvec(x, *args)
        return torch.ops.decodelab.add_norm_matvec(x, delta, *args)
    s = x if delta is None else delta + x  # as GPT-2's block adds it
    return s, linear(norm(s), weight, bias, act)
