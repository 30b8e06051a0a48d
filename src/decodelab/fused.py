"""gpt-fast's recipe for batch-1 decoding as a model transform: the `fused` graph engine's model.

A batch-1 step reads every weight once, in one-row matmuls (GEMVs), and attends one query over a
static cache. `prepare` stores each of GPT-2's Conv1D weights ([in, out]) as a Linear's ([out,
in], so a GEMV reads contiguous rows), runs every one-row product on decodelab's matvec kernel
(`decodelab.matvec`, the MLP's GELU in its first product's kernel) and attention on decodelab's
one-kernel attention (`decodelab.attention`); Inductor compiles the rest (layer norms, residual
adds, cache writes) under coordinate-descent tuning (`COMPILE`, as gpt-fast sets it). Passes of
several rows (a prompt, a verification) stay matmuls.

Before the matvec kernel, the GEMVs were Inductor's tuned reductions (`as_linears` alone: Inductor
makes a one-row `mm` a reduction only under coordinate descent, and GPT-2's `addmm` on an [in,
out] weight stays a cuBLAS call). Those fused the GELU into the next product's reads, computing
it once per row of the weight: 13-21 us per gpt2-xl layer where the product alone takes 9, and
their tuned launch configurations differed between processes. On an H100 gpt2-xl decoded at
2.63 ms per token on this model against 3.17-3.22 ms on that one in the same process (2.83x and
3.41-3.46x the datasheet's bandwidth floor; results/reference/cuda-h100/floor-matvec/).
"""

from __future__ import annotations

import torch

from . import attention, matvec

COMPILE = {"coordinate_descent_tuning": True}  # gpt-fast sets no max_autotune


def transposed(conv) -> torch.nn.Parameter:
    """GPT-2's Conv1D weight ([in, out]) stored as a Linear's ([out, in])."""
    return torch.nn.Parameter(conv.weight.detach().t().contiguous(), requires_grad=False)


class LinearConv1D(torch.nn.Module):
    """GPT-2's Conv1D (x W + b, W [in, out]) with W stored transposed, as a Linear's [out, in],
    computed as a matmul and an add."""

    def __init__(self, conv):
        super().__init__()
        self.weight, self.bias = transposed(conv), conv.bias

    def forward(self, x):
        return torch.matmul(x, self.weight.t()) + self.bias


class MatvecLinear(torch.nn.Module):
    """act(x weight^T + bias) (weight [out, in], `act` None or one the kernel `fuses`), one row on
    decodelab's matvec kernel (`matvec.linear`). Its sizes are named as a Linear's, which callers
    read from a model's LM head."""

    def __init__(self, weight, bias, act=None):
        super().__init__()
        self.weight, self.bias, self.act = weight, bias, act

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    def forward(self, x):
        return matvec.linear(x, self.weight, self.bias, self.act)


def as_linears(model, kernel: bool = False):
    """`model` with every Conv1D in the Linear layout, in place: a LinearConv1D, or with `kernel`
    a MatvecLinear (every Linear too, its parameters shared, and an MLP's GELU moved into its
    first product's kernel)."""
    from transformers.pytorch_utils import Conv1D

    for parent in list(model.modules()):
        act = getattr(parent, "act", None)
        if not (kernel and isinstance(getattr(parent, "c_fc", None), Conv1D) and matvec.fuses(act)):
            act = None
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D) and kernel:
                setattr(parent, name, MatvecLinear(transposed(child), child.bias,
                                                   act if name == "c_fc" else None))
            elif isinstance(child, Conv1D):
                setattr(parent, name, LinearConv1D(child))
            elif kernel and type(child) is torch.nn.Linear:
                setattr(parent, name, MatvecLinear(child.weight, child.bias))
        if act is not None:
            parent.act = torch.nn.Identity()
    return model


def prepare(model, kernel: bool = True, ends: bool = True):
    """`model` in the Linear layout with decodelab's attention (`attention.use`'s `ends`) and
    (with `kernel`) its one-row products on the matvec kernel, in place."""
    return attention.use(as_linears(model, kernel), ends)
