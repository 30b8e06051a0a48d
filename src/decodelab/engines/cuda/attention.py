"""One Triton kernel for a decoding step's attention over a static cache, as transformers'
attention implementation `decodelab` (`use`).

A batch-1 step with a static cache attends one query (K + 1 when it verifies) over every slot of
the cache. PyTorch's SDPA backends spend more than that needs (the memory-efficient one: a
CUTLASS kernel built for long queries; the math one: a bmm, a softmax and a bmm, with the mask
built beside them), where the keys and values to read are a few hundred KB.
`attend` runs one program per (head, query) that attends over only the slots the mask keeps
(what a hidden slot holds, NaN included, never reaches its sums), with an online softmax in
float32; a long cache is split into parts, one program each, as in flash-decoding. The mask of a
plain causal pass is each row's count of slots seen (`causal_ends`, what transformers gets as
this implementation's mask), which the kernel compares with a slot's index and stops its loop
at; any other pass's is a boolean [T, L] mask. It serves CUDA tensors of batch 1 with a
power-of-two head size; anything else, and every pass where Triton is missing, goes to SDPA with
the boolean mask. `TRITON_INTERPRET=1` runs the kernel on the CPU (the tests).
"""

from __future__ import annotations

import functools
import os

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheel has no Triton: every pass goes to SDPA
    triton = None

NAME = "decodelab"
MASKED = "decodelab_masked"  # the same, always given a boolean mask (an ablation of causal_ends)
BLOCK = 128  # slots per loop iteration (faster than 64 on most decoding shapes)
MAX_QUERIES = 16  # longer queries (a prompt's pass) go to SDPA
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton reads it once too
# From SPLIT_FROM slots on, each (head, query) splits the cache into parts of about SPLIT_SPAN
# slots (at most MAX_SPLITS), one program each, merged by a second kernel: one program per
# head would leave most of a GPU idle over a 4K-16K context. Below SPLIT_FROM the second
# kernel's merge costs more than the parts save, so a short cache stays in one part.
SPLIT_FROM = 512
SPLIT_SPAN = 128
MAX_SPLITS = 32
# A verification's K + 1 rows in one program per head (`attend_rows_kernel`), which reads each
# block of keys and values once for all of them, instead of one program per row, each reading
# them again. It serves every pass whose rows come as slot counts; with a boolean mask only from
# SHARED_MASKED_FROM slots on, since over a shorter cache the mask's [16, BLOCK] loads can cost
# more than the shared reads save.
SHARED_ROWS = True
SHARED_MASKED_FROM = 4096


if triton is not None:

    @triton.jit
    def attend_kernel(q, k, v, keep, out, best_out, total_out, length, span, scale, q_h, q_t,
                      k_h, k_l, v_h, v_l, keep_t, keep_l, out_t, out_h, out_s, stat_t, stat_h,
                      D: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr,
                      ENDS: tl.constexpr):
        """Program (head, row, part) attends over slots [part * span, (part + 1) * span) that
        `keep` keeps: a boolean mask [T, L], or with ENDS each row's count of slots seen [T]. One
        part: the output. Several: each part's unnormalized output, maximum and sum, for
        `combine_kernel`."""
        attend_program(q, k, v, keep, out, best_out, total_out, q, q, keep, length, span, scale,
                       q_h, q_t, k_h, k_l, v_h, v_l, keep_t, keep_l, out_t, out_h, out_s,
                       stat_t, stat_h, D, BLOCK, SPLIT, ENDS, False)

    @triton.jit
    def write_attend_kernel(q, k, v, out, best_out, total_out, new_k, new_v, position, length,
                            span, scale, q_h, q_t, k_h, k_l, v_h, v_l, out_t, out_h, out_s,
                            stat_t, stat_h, D: tl.constexpr, BLOCK: tl.constexpr,
                            SPLIT: tl.constexpr):
        """`attend_kernel` for one row whose own key and value, `new_k` and `new_v` (head stride
        q_h), belong in slot `position`, after every slot it sees: the program whose part holds
        it attends to them from its registers and writes them into the cache. (A kernel of its
        own, not `attend_kernel` with pointers it leaves unused: Inductor copies the tensors
        passed for those, extra kernels in every step.)"""
        attend_program(q, k, v, position, out, best_out, total_out, new_k, new_v, position,
                       length, span, scale, q_h, q_t, k_h, k_l, v_h, v_l, 0, 0, out_t, out_h,
                       out_s, stat_t, stat_h, D, BLOCK, SPLIT, True, True)

    @triton.jit
    def attend_program(q, k, v, keep, out, best_out, total_out, new_k, new_v, position, length,
                       span, scale, q_h, q_t, k_h, k_l, v_h, v_l, keep_t, keep_l, out_t, out_h,
                       out_s, stat_t, stat_h, D: tl.constexpr, BLOCK: tl.constexpr,
                       SPLIT: tl.constexpr, ENDS: tl.constexpr, WRITE: tl.constexpr):
        """The body of `attend_kernel` (WRITE unset) and `write_attend_kernel` (ENDS set,
        `keep` unread: the row sees the slots up to `position`)."""
        head = tl.program_id(0)
        row = tl.program_id(1)
        part = tl.program_id(2)
        d = tl.arange(0, D)
        # Inductor passes `scale` as a float64: the product is cast back
        query = (tl.load(q + head * q_h + row * q_t + d).to(tl.float32) * scale).to(tl.float32)
        # -1e30, not -inf: a block the mask hides whole leaves the running maximum finite
        best = tl.max(tl.full([BLOCK], -1e30, tl.float32), axis=0)
        total = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
        acc = tl.zeros([D], tl.float32)
        end = tl.minimum(length, (part + 1) * span)
        if WRITE:  # the row sees the slots up to its own, which no program reads from the cache
            fresh = tl.load(position).to(tl.int32)
            stop = tl.minimum(end, fresh)
            end = tl.minimum(end, fresh + 1)
        else:
            if ENDS:  # the loop stops at the row's last slot
                end = tl.minimum(end, tl.load(keep + row * keep_t).to(tl.int32))
            stop = end
        for start in range(part * span, stop, BLOCK):
            slot = start + tl.arange(0, BLOCK)
            # Keys and values load only where the mask keeps a slot: while a static cache
            # fills, most of it is hidden, and a stale slot's NaN never reaches the sums.
            # (Loading them beside the mask would read the whole cache, hidden slots included.)
            if ENDS:
                seen = slot < stop
            else:
                seen = tl.load(keep + row * keep_t + slot * keep_l, mask=slot < stop, other=0) != 0
            keys = tl.load(k + head * k_h + slot[:, None] * k_l + d[None, :], mask=seen[:, None],
                           other=0.0)
            scores = tl.where(seen, tl.sum(keys.to(tl.float32) * query[None, :], axis=1), -1e30)
            new_best = tl.maximum(best, tl.max(scores, axis=0))
            weights = tl.where(seen, tl.exp(scores - new_best), 0.0)
            shrink = tl.exp(best - new_best)
            values = tl.load(v + head * v_h + slot[:, None] * v_l + d[None, :],
                             mask=seen[:, None], other=0.0)
            acc = acc * shrink + tl.sum(weights[:, None] * values.to(tl.float32), axis=0)
            total = total * shrink + tl.sum(weights, axis=0)
            best = new_best
        if WRITE:
            if (fresh >= part * span) & (fresh < end):
                key = tl.load(new_k + head * q_h + d)
                value = tl.load(new_v + head * q_h + d)
                score = tl.sum(key.to(tl.float32) * query, axis=0)
                new_best = tl.maximum(best, score)
                weight = tl.exp(score - new_best)
                shrink = tl.exp(best - new_best)
                acc = acc * shrink + weight * value.to(tl.float32)
                total = total * shrink + weight
                best = new_best
                tl.store(k + head * k_h + fresh * k_l + d, key)
                tl.store(v + head * v_h + fresh * v_l + d, value)
        if SPLIT:
            stat = row * stat_t + head * stat_h + part
            tl.store(out + row * out_t + head * out_h + part * out_s + d, acc)
            tl.store(best_out + stat, best)
            tl.store(total_out + stat, total)
        else:
            tl.store(out + row * out_t + head * out_h + d, (acc / total).to(out.dtype.element_ty))

    @triton.jit
    def attend_rows_kernel(q, k, v, keep, out, best_out, total_out, rows, length, span, scale,
                           q_h, q_t, k_h, k_l, v_h, v_l, keep_t, keep_l, out_t, out_h, out_s,
                           stat_t, stat_h, D: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr,
                           SPLIT: tl.constexpr, IEEE: tl.constexpr, ENDS: tl.constexpr):
        """`attend_kernel` for all `rows` of a pass in program (head, 0, part): R (a power of
        two, 16 or more, as tl.dot needs) holds them, the scores and the weighted values are
        two small matmuls, and a block's keys and values load once, where any row keeps a
        slot."""
        head = tl.program_id(0)
        part = tl.program_id(2)
        r = tl.arange(0, R)
        d = tl.arange(0, D)
        live = r < rows
        query = tl.load(q + head * q_h + r[:, None] * q_t + d[None, :], mask=live[:, None],
                        other=0.0)
        query = (query.to(tl.float32) * scale).to(tl.float32)
        best = tl.full([R], -1e30, tl.float32)
        total = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, D], tl.float32)
        end = tl.minimum(length, (part + 1) * span)
        if ENDS:
            stops = tl.load(keep + r * keep_t, mask=live, other=0).to(tl.int32)
            end = tl.minimum(end, tl.max(stops, axis=0))
        for start in range(part * span, end, BLOCK):
            slot = start + tl.arange(0, BLOCK)
            if ENDS:
                seen = (slot[None, :] < stops[:, None]) & (slot < end)[None, :]
            else:
                seen = tl.load(keep + r[:, None] * keep_t + slot[None, :] * keep_l,
                               mask=live[:, None] & (slot < end)[None, :], other=0) != 0
            needed = tl.max(seen.to(tl.int32), axis=0) > 0
            keys = tl.load(k + head * k_h + slot[:, None] * k_l + d[None, :], mask=needed[:, None],
                           other=0.0)
            values = tl.load(v + head * v_h + slot[:, None] * v_l + d[None, :],
                             mask=needed[:, None], other=0.0)
            if IEEE:  # float32 caches: tl.dot would round its inputs to TF32
                scores = tl.dot(query, tl.trans(keys), input_precision="ieee")
            else:
                scores = tl.dot(query.to(keys.dtype), tl.trans(keys))
            scores = tl.where(seen, scores, -1e30)
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            weights = tl.where(seen, tl.exp(scores - new_best[:, None]), 0.0)
            shrink = tl.exp(best - new_best)
            if IEEE:
                acc = acc * shrink[:, None] + tl.dot(weights, values, input_precision="ieee")
            else:
                acc = acc * shrink[:, None] + tl.dot(weights.to(values.dtype), values)
            total = total * shrink + tl.sum(weights, axis=1)
            best = new_best
        if SPLIT:
            stat = r * stat_t + head * stat_h + part
            tl.store(out + r[:, None] * out_t + head * out_h + part * out_s + d[None, :], acc,
                     mask=live[:, None])
            tl.store(best_out + stat, best, mask=live)
            tl.store(total_out + stat, total, mask=live)
        else:
            tl.store(out + r[:, None] * out_t + head * out_h + d[None, :],
                     (acc / tl.where(live, total, 1.0)[:, None]).to(out.dtype.element_ty),
                     mask=live[:, None])  # padding rows keep nothing

    @triton.jit
    def combine_kernel(parts, best, total, out, parts_t, parts_h, parts_p, stat_t, stat_h, out_t,
                       out_h, D: tl.constexpr, PARTS: tl.constexpr):
        """Program (head, row) merges its parts' online softmaxes (flash-decoding's second
        pass)."""
        head = tl.program_id(0)
        row = tl.program_id(1)
        d = tl.arange(0, D)
        p = tl.arange(0, PARTS)
        stat = row * stat_t + head * stat_h + p
        bests = tl.load(best + stat)
        weights = tl.exp(bests - tl.max(bests, axis=0))
        accs = tl.load(parts + row * parts_t + head * parts_h + p[:, None] * parts_p + d[None, :])
        merged = tl.sum(weights[:, None] * accs, axis=0) / tl.sum(weights * tl.load(total + stat))
        tl.store(out + row * out_t + head * out_h + d, merged.to(out.dtype.element_ty))

    def launch(kernel):
        return kernel if INTERPRETED else torch.library.wrap_triton(kernel)

    def attend_pass(query, key, value, keep, scale, span, parts, outs, out_strides, fresh):
        """`attend_kernel`, one program per (head, row, part), or `attend_rows_kernel`, one per
        (head, part), writing `outs`: the output, or the parts' sums and statistics. `fresh`:
        None, or the new key and value ([H, 1, D], query's strides) and the slot to write them
        (`write_attend_kernel`, `keep` None)."""
        heads, rows, dim = query.shape
        length = key.shape[1]
        strides = (query.stride(0), query.stride(1), key.stride(0), key.stride(1),
                   value.stride(0), value.stride(1))
        split = parts > 1
        if fresh is not None:
            launch(write_attend_kernel)[(heads, rows, parts)](
                query, key, value, *outs, *fresh, length, span, scale, *strides, *out_strides,
                D=dim, BLOCK=BLOCK, SPLIT=split)
            return
        ends = keep.dim() == 1
        strides += (keep.stride(0), 0 if ends else keep.stride(1))
        if shares_rows(rows, dim, length, ends):
            launch(attend_rows_kernel)[(heads, 1, parts)](
                query, key, value, keep, *outs, rows, length, span, scale, *strides,
                *out_strides, D=dim, R=max(16, triton.next_power_of_2(rows)), BLOCK=BLOCK,
                SPLIT=split, IEEE=query.dtype == torch.float32, ENDS=ends)
        else:
            launch(attend_kernel)[(heads, rows, parts)](
                query, key, value, keep, *outs, length, span, scale, *strides, *out_strides,
                D=dim, BLOCK=BLOCK, SPLIT=split, ENDS=ends)

    def attend_into(query, key, value, keep, scale, fresh=None):
        """query [H, T, D], key and value [H, L, D], keep as `attend`'s (None with `fresh`):
        out [T, H, D], the parts' outputs merged where the cache is split."""
        heads, rows, dim = query.shape
        length = key.shape[1]
        parts = splits(length)
        span = triton.cdiv(triton.cdiv(length, parts), BLOCK) * BLOCK
        out = query.new_empty(rows, heads, dim)
        if parts == 1:
            attend_pass(query, key, value, keep, scale, span, 1, (out, out, out),
                        (out.stride(0), out.stride(1), 0, 0, 0), fresh)
            return out
        acc = query.new_empty(rows, heads, parts, dim, dtype=torch.float32)
        best = query.new_empty(rows, heads, parts, dtype=torch.float32)
        total = torch.empty_like(best)
        attend_pass(query, key, value, keep, scale, span, parts, (acc, best, total),
                    (acc.stride(0), acc.stride(1), acc.stride(2), best.stride(0), best.stride(1)),
                    fresh)
        launch(combine_kernel)[(heads, rows)](
            acc, best, total, out, acc.stride(0), acc.stride(1), acc.stride(2), best.stride(0),
            best.stride(1), out.stride(0), out.stride(1), D=dim, PARTS=parts)
        return out

    @torch.library.triton_op("decodelab::attend", mutates_args=())
    def attend_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  keep: torch.Tensor, scale: float) -> torch.Tensor:
        """query [H, T, D], key and value [H, L, D], keep [T, L] (bool) or each row's count of
        slots seen [T] (an integer dtype): out [T, H, D]."""
        return attend_into(query, key, value, keep, scale)

    # Opaque to Inductor, unlike the ops above: it traces the kernel's writes through views of
    # `pair` and copies the whole buffer around them, extra kernels in every layer.
    @torch.library.custom_op("decodelab::write_attend", mutates_args=("pair",))
    def write_attend_op(row: torch.Tensor, pair: torch.Tensor, position: torch.Tensor,
                        scale: float) -> torch.Tensor:
        """row [3 H D]: one token's query, key and value (GPT-2's c_attn output); pair [2, 1, H,
        L, D]: a layer's cached keys and values; position (0-d): the token's slot, after every
        slot it sees. Writes its key and value there; out [1, H, D]."""
        heads, dim = pair.shape[2], pair.shape[4]
        query, key, value = row.view(3, heads, 1, dim).unbind(0)
        return attend_into(query, pair[0, 0], pair[1, 0], None, scale, (key, value, position))

    @write_attend_op.register_fake
    def _(row, pair, position, scale):
        return row.new_empty(1, pair.shape[2], pair.shape[4])


def shares_rows(rows: int, dim: int, length: int, ends: bool) -> bool:
    """Whether a pass's rows go to `attend_rows_kernel` together (SHARED_ROWS)."""
    return (SHARED_ROWS and rows > 1 and dim >= 16
            and (ends or length >= SHARED_MASKED_FROM))


def splits(length: int) -> int:
    """Parts a cache of `length` slots is split into, a power of two (one below SPLIT_FROM)."""
    if length < SPLIT_FROM:
        return 1
    return min(MAX_SPLITS, 1 << (length // SPLIT_SPAN - 1).bit_length())


def is_ends(mask: torch.Tensor | None) -> bool:
    """Whether `mask` is `causal_ends`' count of slots each row sees, not a [B, 1, T, L] mask."""
    return mask is not None and mask.dim() == 1


def as_mask(ends: torch.Tensor, length: int) -> torch.Tensor:
    """The boolean mask [1, 1, T, L] of `ends`: row t keeps the first ends[t] slots."""
    return (torch.arange(length, device=ends.device) < ends[:, None])[None, None]


def serves(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether the kernel takes this pass (else SDPA does)."""
    batch, heads, rows, dim = query.shape
    on_device = query.is_cuda or (INTERPRETED and query.device.type == "cpu")
    kept = mask is not None and (mask.shape == (rows,) if is_ends(mask) else (
        mask.dtype == torch.bool and mask.shape[-2:] == (rows, key.shape[2])))
    return (triton is not None and on_device and batch == 1 and rows <= MAX_QUERIES
            and key.shape[1] == heads and dim & (dim - 1) == 0 and kept
            and key.stride(-1) == 1 and query.stride(-1) == 1)


def writes(x: torch.Tensor, width: int, pair: torch.Tensor | None, mask: torch.Tensor | None
           ) -> bool:
    """Whether `write_attend` takes one token `x` [1, 1, E] whose c_attn output has `width`
    columns, over cache buffer `pair` [2, 1, H, L, D], with `causal_ends`' mask."""
    if pair is None or not is_ends(mask) or mask.shape != (1,) or x.shape[:2] != (1, 1):
        return False
    heads, dim = pair.shape[2], pair.shape[4]
    on_device = x.is_cuda or (INTERPRETED and x.device.type == "cpu")
    return (triton is not None and on_device and width == 3 * heads * dim
            and dim & (dim - 1) == 0 and x.dtype == pair.dtype and pair.is_contiguous())


def write_attend(row, pair, position, scale: float) -> torch.Tensor:
    """One token's attention where it `writes`: its key and value (from c_attn's output `row`)
    into `pair` at slot `position`, its query over that slot and every one before it, in one
    kernel; out [1, 1, H, D]."""
    return torch.ops.decodelab.write_attend(row.view(-1), pair, position, scale)[None]


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface: query [1, H, T, D], key and value the cache's
    [1, H, L, D], attention_mask [1, 1, T, L] (True: attend) or `causal_ends`' [T]; out
    [1, T, H, D]."""
    if dropout or not serves(query, key, attention_mask):
        if is_ends(attention_mask):
            attention_mask = as_mask(attention_mask, key.shape[2])
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    keep = attention_mask if is_ends(attention_mask) else attention_mask[0, 0]
    out = torch.ops.decodelab.attend(query[0], key[0], value[0], keep, float(scale))
    return out[None], None


def boolean_mask(*args, **kwargs):
    """SDPA's boolean mask, always built: SDPA may skip it for a causal pass (transformers asks
    it to where it can), which a static cache's empty slots forbid here. (A partial binding
    `allow_is_causal_skip=False` would not do: transformers' own keyword overrides it.)"""
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs | {"allow_is_causal_skip": False})


def causal_ends(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                attention_mask=None, **kwargs):
    """transformers' mask interface for `decodelab`: a plain causal pass of one sequence (no
    padding, no window, the cache from slot 0) gets the count of slots each of its rows sees,
    q_offset + t + 1, which the kernel compares with a slot's index instead of loading a mask
    (so no kernel builds a mask in each layer); any other gets `boolean_mask`."""
    from transformers.masking_utils import causal_mask_function

    if (batch_size == 1 and attention_mask is None and kv_offset == 0 and kwargs.get("local_size")
            is None and mask_function in (None, causal_mask_function)):
        return torch.arange(1, q_length + 1, device=kwargs.get("device", "cpu")) + q_offset
    return boolean_mask(batch_size, q_length, kv_length, q_offset, kv_offset,
                        mask_function or causal_mask_function, attention_mask, **kwargs)


@functools.cache
def register() -> None:
    """`decodelab` as an attention implementation, with `causal_ends` as its masks, and
    `decodelab_masked`, with `boolean_mask`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    for name, mask in ((NAME, causal_ends), (MASKED, boolean_mask)):
        AttentionInterface.register(name, attention)
        AttentionMaskInterface.register(name, mask)


def use(model, ends: bool = True):
    """`model` (in place) with its attention on `attention`; without `ends`, every pass's mask a
    boolean [T, L] one."""
    register()
    model.set_attn_implementation(NAME if ends else MASKED)
    return model
