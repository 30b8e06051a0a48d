"""decodelab's attention kernel against SDPA: on a CUDA device, or on the CPU under Triton's
interpreter (TRITON_INTERPRET=1 with Triton importable). `make test` installs Triton in a
directory of its own (`make kernel-tools`), and `test_the_kernels_run_under_tritons_interpreter`
runs this file's kernel tests in a process that imports it; without either, the SDPA fallback."""

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from decodelab.backends import sources
from decodelab.engines.cuda import attention, graphs
from decodelab.engines.decode import decode

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
KERNEL = attention.triton is not None and (CUDA or attention.INTERPRETED)
needs_kernel = pytest.mark.skipif(not KERNEL, reason="no CUDA device and no Triton interpreter")
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device")
ROOT = Path(__file__).resolve().parents[1]
INTERPRETER = ROOT / ".venv/triton"  # `make kernel-tools`


def inputs(rows: int, length: int, seen: list[int], dtype=torch.float32, heads=3, dim=64):
    """query [1, H, T, D] as GPT-2 makes it (a transposed view), a cache's keys and values
    [1, H, L, D], and a mask whose row t keeps the first seen[t] slots."""
    g = torch.Generator().manual_seed(rows * 1000 + length)
    q = torch.randn(1, rows, heads, dim, generator=g).transpose(1, 2)
    k, v = (torch.randn(1, heads, length, dim, generator=g) for _ in range(2))
    mask = torch.arange(length)[None, :] < torch.tensor(seen)[:, None]
    return [t.to(DEVICE, dtype) for t in (q, k, v)] + [mask[None, None].to(DEVICE)]


def kept(mask: torch.Tensor, seen: list[int], ends: bool) -> torch.Tensor:
    """What the kernel is given: the boolean mask, or with `ends` each row's count of slots seen
    (`attention.causal_ends`)."""
    return torch.tensor(seen, device=mask.device) if ends else mask


def sdpa(q, k, v, mask, scale):
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                           attn_mask=mask, scale=scale)
    return out.transpose(1, 2)


def rows_together(monkeypatch, shared: bool):
    """A pass's rows in one program per head (`attend_rows_kernel`) at any length, or never."""
    monkeypatch.setattr(attention, "SHARED_ROWS", shared)
    monkeypatch.setattr(attention, "SHARED_MASKED_FROM", 0)


def test_rows_go_together_where_they_were_faster_on_a_gpu():
    assert attention.shares_rows(5, 64, 288, ends=True)
    assert not attention.shares_rows(1, 64, 16384, ends=True)  # a step: one row
    assert not attention.shares_rows(5, 8, 288, ends=True)  # tl.dot needs 16 columns
    assert not attention.shares_rows(5, 64, 288, ends=False)  # a short boolean mask
    assert attention.shares_rows(5, 64, attention.SHARED_MASKED_FROM, ends=False)


CASES = [(1, 288, [33]), (1, 150, [150]), (2, 64, [1, 64]), (4, 300, [70, 71, 72, 73]),
         (3, 200, [64, 128, 129]), (16, 40, list(range(25, 41))),
         # split into parts merged by a second kernel; parts the mask hides whole, or past the end
         (2, 1030, [700, 1030]), (1, 2100, [1999]), (1, 4096, [100]), (5, 600, [1, 2, 3, 4, 5])]


@needs_kernel
@pytest.mark.parametrize("ends", [False, True])
@pytest.mark.parametrize("rows,length,seen,shared", [case + (False,) for case in CASES] + [
    case + (True,) for case in CASES if case[0] > 1])  # rows together: SHARED_ROWS
def test_the_kernel_attends_over_the_slots_the_mask_keeps_as_sdpa_does(rows, length, seen, shared,
                                                                        ends, monkeypatch):
    rows_together(monkeypatch, shared)
    q, k, v, mask = inputs(rows, length, seen)
    assert attention.serves(q, k, kept(mask, seen, ends))
    out, weights = attention.attention(None, q, k, v, kept(mask, seen, ends), scaling=0.125)
    assert weights is None and out.shape == (1, rows, 3, 64)
    torch.testing.assert_close(out, sdpa(q, k, v, mask, 0.125), rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("ends", [False, True])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("length,seen", [(200, [10, 130]), (1500, [10, 1300])])
def test_what_a_slot_the_mask_hides_holds_never_reaches_the_kernels_output(length, seen, shared,
                                                                           ends, monkeypatch):
    rows_together(monkeypatch, shared)
    q, k, v, mask = inputs(2, length, seen)
    hidden = ~mask[0, 0].any(0)
    k[:, :, hidden], v[:, :, hidden] = float("nan"), float("nan")  # stale slots past a rollback
    out, _ = attention.attention(None, q, k, v, kept(mask, seen, ends))
    assert out.isfinite().all()
    k[:, :, hidden], v[:, :, hidden] = 0.0, 0.0
    torch.testing.assert_close(out, sdpa(q, k, v, mask, 64 ** -0.5), rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("ends", [False, True])
@pytest.mark.parametrize("rows,length,seen,shared", [
    (1, 100, [40], False), (1, 2100, [1500], False),  # one part; several
    (2, 100, [40, 41], True), (2, 2100, [1500, 1501], True)])  # rows together: SHARED_ROWS
def test_the_kernel_is_checked_by_a_case_it_must_fail(rows, length, seen, shared, ends,
                                                      monkeypatch):
    """Negative control: the same comparison tells a mask shifted by one slot apart."""
    rows_together(monkeypatch, shared)
    q, k, v, mask = inputs(rows, length, seen)
    out, _ = attention.attention(None, q, k, v, kept(mask, seen, ends))
    shifted = torch.roll(mask, 1, dims=-1)
    assert not torch.allclose(out, sdpa(q, k, v, shifted, 64 ** -0.5), rtol=1e-5, atol=1e-5)


def written(length: int, position: int, stale: float | None, dtype=torch.float32):
    """One token's c_attn row [1, 1, 3 H D] (3 heads of 64), a layer's cache buffer [2, 1, H, L, D]
    whose slots from `position` on hold `stale` (None: random), and the buffer once the token's
    key and value are in slot `position`."""
    g = torch.Generator().manual_seed(length + position)
    row = torch.randn(1, 1, 3 * 3 * 64, generator=g)
    pair = torch.randn(2, 1, 3, length, 64, generator=g)
    if stale is not None:
        pair[..., position:, :] = stale
    after = pair.clone()
    after[:, 0, :, position] = row.view(3, 3, 64)[1:]
    return [t.to(DEVICE, dtype) for t in (row, pair, after)]


def attended(row, cache, position: int):
    """SDPA's attention of `row`'s query over `cache`'s slots up to `position`: out [1, 1, H, D]."""
    query = row.view(1, 1, 3, 3, 64)[:, :, 0].transpose(1, 2)
    mask = (torch.arange(cache.shape[3], device=DEVICE) <= position)[None, None, None]
    return sdpa(query, cache[0], cache[1], mask, 0.125)


# one part: first slot, last, between; split: each side of a part's border, the last slot
WRITES = [(40, 0), (40, 39), (288, 33), (1030, 255), (1030, 256), (2100, 2099), (4096, 100)]


@needs_kernel
@pytest.mark.parametrize("length,position,dtype", [case + (torch.float32,) for case in WRITES]
                         + [(288, 33, torch.float16), (1030, 256, torch.float16)])
def test_the_writing_kernel_stores_the_tokens_key_and_value_and_attends_as_sdpa_does(
        length, position, dtype):
    row, pair, after = written(length, position, float("nan"), dtype)
    keep = torch.tensor([position + 1], device=DEVICE)
    assert attention.writes(row, row.shape[-1], pair, keep)
    out = attention.write_attend(row, pair, torch.tensor(position, device=DEVICE), 0.125)
    torch.testing.assert_close(pair[..., :position + 1, :], after[..., :position + 1, :])
    assert pair[..., position + 1:, :].isnan().all()  # nothing else written
    after[..., position + 1:, :] = 0.0
    reference = attended(row, after, position).to(dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(out, reference, rtol=tolerance, atol=tolerance)


@needs_kernel
@pytest.mark.parametrize("length,position", [(288, 33), (1030, 256)])
def test_the_writing_kernel_is_checked_by_a_case_it_must_fail(length, position):
    """Negative control: the same comparison tells apart attention over the cache before the
    token's key and value were written."""
    row, pair, _ = written(length, position, None)
    before = pair.clone()
    out = attention.write_attend(row, pair, torch.tensor(position, device=DEVICE), 0.125)
    assert not torch.allclose(out, attended(row, before, position), rtol=1e-5, atol=1e-5)


class Writer(torch.nn.Module):
    """A layer's cache buffer and position, and a token's attention writing into it."""

    def __init__(self, length: int, position: int):
        super().__init__()
        _, self.pair, _ = written(length, position, None)
        self.position = torch.tensor(position, device=DEVICE)
        torch._dynamo.mark_static_address(self.pair)  # as static_cache.PairedLayer's

    def forward(self, row):
        out = attention.write_attend(row * 1.0, self.pair, self.position, 0.125)
        self.position.add_(1)
        return out


@needs_kernel
@torch.inference_mode()
def test_inductor_hands_the_writing_kernel_the_cache_buffer_itself():
    """No copy of the buffer around the op (a traced triton_op got one per layer on an H100),
    and the token's key and value land in it."""
    from torch._inductor.utils import run_and_get_code

    writer = Writer(40, 5)
    row, _, after = written(40, 5, None)
    address = writer.pair.data_ptr()
    _, code = run_and_get_code(torch.compile(writer, dynamic=False), row)
    calls = re.findall(r"decodelab\.write_attend\.default\(\w+, (\w+),", "\n".join(code))
    assert len(calls) == 1 and calls[0].startswith("arg"), calls  # a graph input: the buffer
    assert "clone" not in "\n".join(code)
    assert writer.pair.data_ptr() == address and int(writer.position) == 6
    torch.testing.assert_close(writer.pair, after)


def test_passes_the_writing_kernel_does_not_take_go_to_gpt2s_own():
    row, pair, _ = written(40, 3, None)
    keep = torch.tensor([4])
    assert attention.writes(row, row.shape[-1], pair, keep) == KERNEL
    assert not attention.writes(row, row.shape[-1], None, keep)  # no paired cache yet
    assert not attention.writes(row, row.shape[-1], pair, None)  # a boolean mask
    assert not attention.writes(row, row.shape[-1], pair, torch.tensor([4, 5]))  # two tokens
    assert not attention.writes(row, row.shape[-1] - 64, pair, keep)  # another head count
    assert not attention.writes(row.half(), row.shape[-1], pair, keep)  # another dtype


def test_a_long_cache_is_split_into_a_power_of_two_parts():
    assert [attention.splits(n) for n in (288, 511, 512, 1024, 2048, 4096, 16384, 65536)] == [
        1, 1, 4, 8, 16, 32, 32, 32]


def test_passes_the_kernel_does_not_serve_go_to_sdpa():
    q, k, v, mask = inputs(1, 50, [20])
    assert not attention.serves(q, k, None)  # no mask: SDPA's causal case
    assert not attention.serves(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), mask)
    long = inputs(attention.MAX_QUERIES + 1, 50, [20] * (attention.MAX_QUERIES + 1))
    assert not attention.serves(long[0], long[1], long[3])
    assert not attention.serves(q, k, torch.zeros_like(mask, dtype=q.dtype))  # an additive mask
    odd = inputs(1, 50, [20], dim=48)
    assert not attention.serves(odd[0], odd[1], odd[3])
    out, _ = attention.attention(None, *odd[:3], odd[3])
    torch.testing.assert_close(out, sdpa(*odd[:3], odd[3], 48 ** -0.5), rtol=1e-5, atol=1e-5)


def test_a_plain_causal_pass_gets_each_rows_count_of_slots_and_any_other_a_mask():
    from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay

    ends = attention.causal_ends(1, 3, 40, torch.tensor(7), device="cpu")
    assert ends.tolist() == [8, 9, 10]
    torch.testing.assert_close(attention.as_mask(ends, 40)[0, 0],
                               torch.arange(40)[None, :] <= torch.arange(7, 10)[:, None])
    padded = attention.causal_ends(1, 3, 10, 7, attention_mask=torch.ones(1, 10, dtype=bool),
                                   device="cpu")
    window = attention.causal_ends(1, 3, 10, 7, mask_function=and_masks(
        causal_mask_function, sliding_window_overlay(4)), device="cpu")
    for mask in (padded, window, attention.causal_ends(2, 3, 10, 7, device="cpu")):
        assert mask.dtype == torch.bool and mask.shape[-2:] == (3, 10)
    assert window[0, 0, 2].sum() == 4  # the window's mask, not the plain causal one


def test_the_boolean_mask_is_built_where_transformers_lets_sdpa_skip_it():
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    args = dict(batch_size=1, q_length=4, kv_length=4, q_offset=0, kv_offset=0,
                mask_function=causal_mask_function, attention_mask=None,
                allow_is_causal_skip=True, device="cpu")
    assert sdpa_mask(**args) is None  # the control: SDPA's own skip
    mask = attention.boolean_mask(**args)
    torch.testing.assert_close(mask[0, 0], torch.ones(4, 4, dtype=torch.bool).tril())


def tiny_model():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(sources.preset_config("gpt2-tiny"))
    return model.to(DEVICE).eval()


@torch.inference_mode()
def test_a_model_on_it_computes_the_logits_sdpa_does_pass_by_pass(monkeypatch):
    """Prefill (SDPA), one-token steps and a verification's 5 tokens (the kernel where it runs)
    on a static cache, against the same passes on SDPA. Where the kernel runs, it served the
    steps: transformers passed the boolean mask it takes."""
    served, ends = [], []
    serves = attention.serves

    def counted(query, key, mask):
        ends.append(attention.is_ends(mask))
        served.append(serves(query, key, mask))
        return served[-1]

    monkeypatch.setattr(attention, "serves", counted)
    model = tiny_model()
    ours = attention.use(copy.deepcopy(model))
    assert ours.config._attn_implementation == attention.NAME
    ids = torch.randint(0, model.config.vocab_size, (1, 40), device=DEVICE)
    engines = [graphs.Engine(m, capture=False, max_len=64) for m in (model, ours)]
    caches = [e.new_cache() for e in engines]
    for start, n in [(0, 20), (20, 1), (21, 5), (26, 1)]:
        a, b = (e(ids[:, start:start + n], past_key_values=c).logits.clone()
                for e, c in zip(engines, caches, strict=True))
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    layers = model.config.n_layer
    assert served == [False] * layers + [KERNEL] * 3 * layers  # the prompt's pass: SDPA
    assert all(ends)  # transformers passed `causal_ends`' counts, never a [T, L] mask


@needs_cuda
@pytest.mark.parametrize("name", ["graph", "compiled"])
@torch.inference_mode()
def test_a_graph_engine_on_the_kernel_decodes_the_eager_models_greedy_tokens(name):
    model = tiny_model()
    engine = graphs.Engine(attention.use(copy.deepcopy(model)), max_len=128,
                           compile=graphs.COMPILE_OPTIONS.get(name))
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), device=DEVICE)
    assert decode(engine, prompt, 64).tokens == decode(model, prompt, 64).tokens


def kernel_tools_env(interpret: bool) -> dict:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(INTERPRETER), str(ROOT / "src")])}
    if interpret:
        return env | {"TRITON_INTERPRET": "1"}
    return {k: v for k, v in env.items() if k != "TRITON_INTERPRET"}


needs_kernel_tools = pytest.mark.skipif(not (INTERPRETER / ".installed").exists(),
                                        reason="no `make kernel-tools`")


@pytest.mark.skipif(KERNEL, reason="the kernel tests run in this process")
@needs_kernel_tools
def test_the_kernels_run_under_tritons_interpreter():
    """This file's kernel tests and tests/test_matvec.py's."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                          __file__, str(ROOT / "tests/test_matvec.py"), "-k",
                          "(kernel or sdpa) and not compile"],
                         cwd=ROOT, env=kernel_tools_env(True), capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "92 passed" in run.stdout and "Triton interpreter" not in run.stdout, run.stdout[-3000:]


@needs_kernel_tools
def test_the_kernels_compile_for_an_h100():
    """What the interpreter lets pass and a GPU's compiler would not (tests/compile_kernels.py)."""
    run = subprocess.run([sys.executable, str(ROOT / "tests/compile_kernels.py")], cwd=ROOT,
                         env=kernel_tools_env(False), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]
