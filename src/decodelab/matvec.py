"""One Triton kernel for a decoding step's matmuls: one row times a Linear's weight, plus its bias,
and GPT-2's GELU where the MLP's first product feeds it.

A batch-1 step multiplies one row by every weight matrix of the model: a GEMV that reads the
matrix once, so its time is the matrix's bytes over the memory bandwidth the kernel reaches.
`matvec` runs one program per BN output columns, each reading its BN rows of the weight ([out,
in], contiguous along `in`) in chunks of BK, accumulating in float32 and summing once at the end.
Inductor's tuned reductions compute the same product about as fast alone, but their launch
configuration is tuned anew in every process (gpt2-xl's 6400x1600 product: 9.1-11.6 us on three
H100s, this kernel 9.7-9.9), and in the model Inductor fuses the GELU into the next product's
reads, where it is computed once per row of the weight (results/reference/cuda-h100/floor-matvec/).
It serves one row of a CUDA tensor (or any, under `TRITON_INTERPRET=1`, the tests); anything
else, and every call where Triton is missing, is a plain matmul.
"""

from __future__ import annotations

import torch

from .attention import INTERPRETED, triton

if triton is not None:
    import triton.language as tl

    from .attention import launch

# Rows per program, columns per iteration and warps: on three H100s, 2 rows, 1,024 columns and 4
# warps were the fastest or within 2% of it for each of gpt2-xl's and gpt2's five weight shapes
# (of 30 and 8 configurations timed; results/reference/cuda-h100/floor-matvec/). 16 rows of
# 2,048 columns on 4 warps spill: 904 us against 53 for gpt2-xl's LM head.
BN = 2
BLOCK_K = 1024
WARPS = 4


if triton is not None:

    @triton.jit
    def matvec_kernel(x, w, b, out, n, k, w_n, BN: tl.constexpr, BK: tl.constexpr,
                      BIAS: tl.constexpr, GELU: tl.constexpr):
        """Program p: out[p * BN:(p + 1) * BN] = w[those rows] @ x (+ b), and with GELU set,
        GPT-2's tanh GELU of that."""
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
        if GELU:  # on the product rounded to the output's type, as the unfused model has it
            y = y.to(out.dtype.element_ty).to(tl.float32)
            inner = 1.5957691216057308 * (y + 0.044715 * y * y * y)  # 2 sqrt(2 / pi) (...)
            y = 0.5 * y * (2 - 2 / (tl.exp(inner) + 1))  # 1 + tanh(inner / 2)
        tl.store(out + cols, y.to(out.dtype.element_ty), mask=live)

    @torch.library.triton_op("decodelab::matvec", mutates_args=())
    def matvec_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  gelu: bool) -> torch.Tensor:
        """x [..., in] holding one row, weight [out, in], bias [out] or None: out [..., out]."""
        n, k = weight.shape
        out = x.new_empty(*x.shape[:-1], n)
        launch(matvec_kernel)[(triton.cdiv(n, BN),)](
            x, weight, weight if bias is None else bias, out, n, k, weight.stride(0), BN=BN,
            BK=min(BLOCK_K, triton.next_power_of_2(k)), BIAS=bias is not None, GELU=gelu,
            num_warps=WARPS)
        return out


def serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes this product (else a matmul does)."""
    on_device = x.is_cuda or (INTERPRETED and x.device.type == "cpu")
    return (triton is not None and on_device and x.numel() == x.shape[-1] == weight.shape[1]
            and x.is_contiguous() and weight.is_contiguous() and x.dtype == weight.dtype)


def fuses(act) -> bool:
    """Whether the kernel computes activation module `act` itself: GPT-2's tanh GELU."""
    from transformers.activations import NewGELUActivation

    return type(act) is NewGELUActivation


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act=None
           ) -> torch.Tensor:
    """act(x @ weight.T (+ bias)), `act` None or one the kernel `fuses`: on the kernel where it
    serves, else a matmul, an add and `act`."""
    if serves(x, weight):
        return torch.ops.decodelab.matvec(x, weight, bias, act is not None)
    y = torch.matmul(x, weight.t())
    y = y if bias is None else y + bias
    return y if act is None else act(y)
