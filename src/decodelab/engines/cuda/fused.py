"""gpt-fast's recipe for batch-1 decoding as a model transform: the `fused` graph engine's model.

A batch-1 step reads every weight once, in one-row matmuls (GEMVs), and attends one query over a
static cache. `prepare` stores each of GPT-2's Conv1D weights ([in, out]) as a Linear's ([out, in],
so a GEMV reads contiguous rows), runs every one-row product on decodelab's matvec kernel
(`decodelab.engines.cuda.matvec`, the MLP's GELU in its first product's kernel) and attention on
decodelab's one-kernel attention (`decodelab.engines.cuda.attention`); Inductor compiles the rest
(layer norms, residual adds, the cache writes of passes of several rows) under coordinate-descent
tuning (`COMPILE`, as gpt-fast sets it). Passes of several rows (a prompt, a verification) stay
matmuls. `write_in_attention` (on by default) has each one-token attention read c_attn's row whole
and write its own cache slot: no cache-write, no query-select and no slot-count kernel per layer,
341 kernels per gpt2-xl step against 436. `fold_norms` (an option, off) moves GPT-2's layer norms
and residual adds into the matvec kernels: 96 kernels fewer per gpt2-xl step, but each product
then does the norm's work as well, which can cost more than the launches it saves.

Without the kernel (`as_linears` alone) the GEMVs are Inductor's tuned reductions: Inductor makes
a one-row `mm` a reduction only under coordinate descent, and GPT-2's `addmm` on an [in, out]
weight stays a cuBLAS call. Those reductions fuse the GELU into the next product's reads, computing
it once per row of the weight, and their tuned launch configurations differ between processes:
why the one-row products have a kernel of their own.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import StaticCache

from decodelab.engines.cuda import attention, matvec
from decodelab.engines.cuda.static_cache import PairedLayer

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

    def forward(self, x, residual=None):
        return matvec.linear(x, self.weight, self.bias, self.act, residual)


class NormMatvecLinear(MatvecLinear):
    """A MatvecLinear after LayerNorm `norm`, the two in one kernel (`matvec.norm_linear`):
    called on x, act(norm(x) weight^T + bias); `added` to a residual, that sum too."""

    def __init__(self, norm, weight, bias, act=None):
        super().__init__(weight, bias, act)
        self.norm = norm

    def forward(self, x):
        return matvec.norm_linear(x, None, self.norm, self.weight, self.bias, self.act)[1]

    def added(self, x, delta):
        """(delta + x, act(norm(delta + x) weight^T + bias))."""
        return matvec.norm_linear(x, delta, self.norm, self.weight, self.bias, self.act)


def folded_forward(self, hidden_states, *args, **kwargs):
    """GPT-2's block (inference) with its layer norms in the products after them and its residual
    adds in the kernels around them: attention's first product normalizes, the MLP's first adds
    attention's output to the residual and normalizes, its last adds the residual. The
    arguments go to attention as GPT-2's block passes them (transformers 5: positional the same,
    the rest by name)."""
    attended, _ = self.attn(hidden_states, *args, **kwargs)
    hidden_states, fed = self.mlp.c_fc.added(hidden_states, attended)
    return self.mlp.c_proj(self.mlp.act(fed), residual=hidden_states)


@functools.cache
def folded(block_class):
    return type(f"Folded{block_class.__name__}", (block_class,), {"forward": folded_forward})


def fold_norms(model):
    """`model` (in place) with each GPT-2 block's layer norms folded into the kernels of the
    products after them and its residual adds into the products' kernels (`folded_forward`):
    a one-token step then launches two kernels fewer per layer. Blocks of other shapes (cross
    attention, products not on the kernel) stay as they are."""
    for block in model.modules():
        if not folds(block):
            continue
        attn, mlp = block.attn, block.mlp
        attn.c_attn = NormMatvecLinear(block.ln_1, attn.c_attn.weight, attn.c_attn.bias,
                                       attn.c_attn.act)
        mlp.c_fc = NormMatvecLinear(block.ln_2, mlp.c_fc.weight, mlp.c_fc.bias, mlp.c_fc.act)
        block.__class__ = folded(type(block))
    return model


def folds(block) -> bool:
    """Whether `fold_norms` folds `block`: GPT-2's, its products on the kernel."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    return (type(block) is GPT2Block and not hasattr(block, "crossattention")
            and type(block.attn.c_attn) is MatvecLinear and type(block.mlp.c_fc) is MatvecLinear
            and type(block.mlp.c_proj) is MatvecLinear
            and all(type(n) is torch.nn.LayerNorm for n in (block.ln_1, block.ln_2)))


def writing_forward(self, hidden_states, *args, **kwargs):
    """GPT-2's attention (inference), a one-token pass over `static_cache`'s paired buffers in two
    kernels and the output product: c_attn's row goes whole to `attention.write_attend`, which
    reads the query from it and writes the key and value into the cache itself. Every other
    pass is GPT-2's own."""
    # a folded block passes its arguments by position
    named = dict(zip(self.parameter_names, args, strict=False)) | kwargs
    cache = named.get("cache", named.get("past_key_values"))  # as transformers 5 releases name it
    layer = cache.layers[self.layer_idx] if isinstance(cache, StaticCache) else None
    pair = getattr(layer, "pair", None) if type(layer) is PairedLayer else None
    mask = named.get("attention_mask")
    if (self.training or named.get("encoder_hidden_states") is not None
            or not attention.writes(hidden_states, self.c_attn.out_features, pair, mask)):
        return super(type(self), self).forward(hidden_states, *args, **kwargs)
    row = self.c_attn(hidden_states)
    scale = getattr(self, "scaling", None)  # as GPT-2 passes it to `attention.attention`
    scale = self.head_dim**-0.5 if scale is None else scale
    out = attention.write_attend(row, pair, layer.cumulative_length, scale)
    layer.advance(1)
    return self.c_proj(out.view(hidden_states.shape)), None


@functools.cache
def writing(attention_class):
    """`attention_class` with `writing_forward`, which reads its forward's arguments by name."""
    names = tuple(inspect.signature(attention_class.forward).parameters)[2:]  # self, hidden_states
    return type(f"Writing{attention_class.__name__}", (attention_class,),
                {"forward": writing_forward, "parameter_names": names})


def write_in_attention(model):
    """`model` (in place) with each GPT-2 attention's one-token passes on `writing_forward`: per
    layer, one kernel fewer to write the cache and none to select the query from c_attn's
    output."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    for module in model.modules():
        if (type(module) is GPT2Attention and not module.is_cross_attention
                and isinstance(module.c_attn, MatvecLinear)):
            module.__class__ = writing(GPT2Attention)
    return model


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


def prepare(model, kernel: bool = True, ends: bool = True, fold: bool = False,
            write: bool = True):
    """`model` in the Linear layout with decodelab's attention (`attention.use`'s `ends`) and
    (with `kernel`) its one-row products on the matvec kernel, with `fold` GPT-2's layer norms and
    residual adds folded into them (`fold_norms`; the floor engine `folded`), with `write` each
    one-token attention writing its own cache slot (`write_in_attention`; without it, the floor
    engine `unwritten`), in place."""
    model = as_linears(model, kernel)
    if kernel and fold:
        fold_norms(model)
    if kernel and write:
        write_in_attention(model)
    return attention.use(model, ends)
