"""gpt-fast's recipe for batch-1 decoding as a model transform: the `fused` graph engine's model.

Inductor turns a one-row matmul into a reduction kernel (its bias and the elementwise work beside
it fused in, its launch configuration tuned) only under coordinate-descent tuning, and only for
`mm`/`bmm` (torch/_inductor/decomposition.py): GPT-2's Conv1D calls `addmm` on an [in, out]
weight, which stays a cuBLAS call. `prepare` stores each Conv1D's weight as a Linear's ([out, in],
so a reduction reads contiguous rows) computed as a matmul and an add, and puts attention on
decodelab's one-kernel attention (`decodelab.attention`); `COMPILE` is the Inductor options.
On an H100 the Linear layout with coordinate descent (and attention on SDPA's math backend) took
gpt2-xl from the `compiled` engine's 3.43 to 3.18 ms per token
(results/reference/cuda-h100/floor-kernels/), and this engine to 2.86-2.96 ms in one process but
3.32-3.51 ms in two later ones, beside `compiled`'s 3.46-3.51
(results/reference/cuda-h100/floor-fused/).
"""

from __future__ import annotations

import torch

from . import attention

COMPILE = {"coordinate_descent_tuning": True}  # gpt-fast sets no max_autotune


class LinearConv1D(torch.nn.Module):
    """GPT-2's Conv1D (x W + b, W [in, out]) with W stored transposed, as a Linear's [out, in],
    computed as a matmul and an add."""

    def __init__(self, conv):
        super().__init__()
        self.weight = torch.nn.Parameter(conv.weight.detach().t().contiguous(),
                                         requires_grad=False)
        self.bias = conv.bias

    def forward(self, x):
        return torch.matmul(x, self.weight.t()) + self.bias


def as_linears(model):
    """`model` with every Conv1D replaced by a LinearConv1D, in place."""
    from transformers.pytorch_utils import Conv1D

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                setattr(parent, name, LinearConv1D(child))
    return model


def prepare(model):
    """`model` in the Linear layout with decodelab's attention, in place."""
    return attention.use(as_linears(model))
