"""decodelab's matvec kernel against F.linear: on a CUDA device, or on the CPU under Triton's
interpreter (tests/test_attention.py's `test_the_kernels_run_under_tritons_interpreter` runs this
file's kernel tests there); without either, the matmul fallback."""

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.activations import NewGELUActivation

from decodelab.backends import sources
from decodelab.engines import decode
from decodelab.engines.cuda import attention, fused, graphs, matvec

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
KERNEL = matvec.triton is not None and (CUDA or matvec.INTERPRETED)
needs_kernel = pytest.mark.skipif(not KERNEL, reason="no CUDA device and no Triton interpreter")


def inputs(n: int, k: int, bias: bool, dtype=torch.float32):
    g = torch.Generator().manual_seed(n * 7919 + k)
    x, w = torch.randn(1, 1, k, generator=g), torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g) if bias else None
    return [None if t is None else t.to(DEVICE, dtype) for t in (x, w, b)]


def reference(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


# rows past the last program's end; k short of one BK, several BKs, not a multiple of one
CASES = [(37, 100, True), (300, 1600, True), (50, 2100, False), (7, 16, True), (90, 4200, True)]


@needs_kernel
@pytest.mark.parametrize("rows", [matvec.BN, 1, 16])  # rows per program
@pytest.mark.parametrize("n,k,bias", CASES)
def test_the_kernel_multiplies_one_row_as_linear_does(n, k, bias, rows, monkeypatch):
    monkeypatch.setattr(matvec, "BN", rows)
    x, w, b = inputs(n, k, bias)
    assert matvec.serves(x, w)
    out = matvec.linear(x, w, b)
    assert out.shape == (1, 1, n) and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), reference(x, w, b), rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("n,k,scale", [(37, 100, 1.0), (300, 1600, 30.0)])  # 30: tanh saturates
def test_the_kernel_computes_gpt2s_gelu_on_its_product(n, k, scale):
    x, w, b = inputs(n, k, True)
    act = NewGELUActivation()
    assert matvec.fuses(act) and not matvec.fuses(torch.nn.GELU())
    out = matvec.linear(x * scale, w, b, act)
    torch.testing.assert_close(out.double(), act(reference(x * scale, w, b)), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out.double(), reference(x * scale, w, b), rtol=1e-3, atol=1e-3)


@needs_kernel
@pytest.mark.parametrize("n,k", [(37, 100), (90, 4200)])
def test_the_kernel_is_checked_by_a_case_it_must_fail(n, k):
    """Negative control: the same comparison tells the product with the last column of the
    weight dropped apart."""
    x, w, b = inputs(n, k, True)
    out = matvec.linear(x, w, b).double()
    cut = w.clone()
    cut[:, -1] = 0
    assert not torch.allclose(out, reference(x, cut, b), rtol=1e-5, atol=1e-5)


def norm_inputs(k: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(k)
    norm = torch.nn.LayerNorm(k)
    with torch.no_grad():
        norm.weight.copy_(1 + torch.randn(k, generator=g) / 10)
        norm.bias.copy_(torch.randn(k, generator=g) / 10)
    delta = 3 + torch.randn(1, 1, k, generator=g)  # off zero mean: the norm's centring counts
    return norm.to(DEVICE, dtype), delta.to(DEVICE, dtype)


@needs_kernel
@pytest.mark.parametrize("n,k,add,act", [(37, 100, False, None), (300, 1600, True, None),
                                         (90, 1600, True, NewGELUActivation())])
def test_the_norm_kernel_adds_normalizes_and_multiplies_as_gpt2s_block(n, k, add, act):
    x, w, b = inputs(n, k, True)
    norm, delta = norm_inputs(k)
    assert matvec.norms(x, norm, w, b)
    s, out = matvec.norm_linear(x, delta if add else None, norm, w, b, act)
    want_s = delta + x if add else x
    assert torch.equal(s, want_s) and (s is x) == (not add)
    want = reference(norm.double()(want_s.double()), w, b)
    want = want if act is None else act(want)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    # negative control: the same product without the norm's centring (its bias left as is)
    uncentred = norm.weight.double() * want_s.double() / want_s.double().pow(2).mean().sqrt()
    assert not torch.allclose(out.double(), reference(uncentred + norm.bias.double(), w, b),
                              rtol=1e-3, atol=1e-3)


@needs_kernel
def test_the_kernel_adds_a_residual_to_its_product():
    x, w, b = inputs(90, 4200, True)
    r = torch.randn(1, 1, 90, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out = matvec.linear(x, w, b, residual=r)
    torch.testing.assert_close(out.double(), reference(x, w, b) + r.double(), rtol=1e-5,
                               atol=1e-5)
    assert not torch.allclose(out.double(), reference(x, w, b), rtol=1e-3, atol=1e-3)


def test_products_the_kernel_does_not_serve_are_a_matmul():
    x, w, b = inputs(30, 64, True)
    two = torch.cat([x, x], dim=1)
    assert not matvec.serves(two, w)  # two rows: a verification's pass
    assert not matvec.serves(x, w.t().contiguous().t())  # a transposed view
    assert not matvec.serves(x.double(), w)
    torch.testing.assert_close(matvec.linear(two, w, b), F.linear(two, w, b))
    act = NewGELUActivation()
    torch.testing.assert_close(matvec.linear(two, w, b, act), act(F.linear(two, w, b)))
    if not KERNEL:
        assert not matvec.serves(x, w)


FOLD_WRITE = [(False, False), (True, False), (False, True), (True, True)]  # fused.prepare's options


@pytest.mark.parametrize("fold,write", FOLD_WRITE)
@torch.inference_mode()
def test_a_model_on_the_kernel_computes_the_logits_the_linear_layout_does_pass_by_pass(
        fold, write, monkeypatch):
    """fused.prepare(kernel=True), its layer norms folded in or not, one-token attention writing
    its own cache slot or not: prefill (matmuls), one-token steps (the kernel where it runs: four
    per layer and the LM head), a verification's 3 tokens (matmuls) and, two of them rolled
    back, one-token steps again on a static cache, which ends up holding the same keys and
    values. Off a GPU: programs of 16 rows (fewer for the interpreter to run) and a vocabulary
    of 512."""
    served, written = [], []
    serves, write_attend = matvec.serves, attention.write_attend
    monkeypatch.setattr(matvec, "serves", lambda *a: served.append(serves(*a)) or served[-1])
    monkeypatch.setattr(attention, "write_attend",
                        lambda *a: written.append(a[0].shape) or write_attend(*a))
    if not CUDA:
        monkeypatch.setattr(matvec, "BN", 16)
    torch.manual_seed(0)
    config = sources.preset_config("gpt2-tiny")
    config.vocab_size = 512
    model = AutoModelForCausalLM.from_config(config).to(DEVICE).eval()
    plain = fused.prepare(copy.deepcopy(model), kernel=False)
    ours = fused.prepare(copy.deepcopy(model), kernel=True, fold=fold, write=write)
    assert any(isinstance(m, fused.MatvecLinear) for m in ours.modules())
    mlp = ours.transformer.h[0].mlp  # its GELU in its first product's kernel
    assert isinstance(mlp.act, torch.nn.Identity) and matvec.fuses(mlp.c_fc.act)
    assert isinstance(mlp.c_fc, fused.NormMatvecLinear) == fold
    assert (type(ours.transformer.h[0]).__name__ == "FoldedGPT2Block") == fold
    assert (type(ours.transformer.h[0].attn).__name__ == "WritingGPT2Attention") == write
    assert ours.lm_head.weight is ours.transformer.wte.weight  # still tied
    ids = torch.randint(0, model.config.vocab_size, (1, 30), device=DEVICE)
    engines = [graphs.Engine(m, capture=False, max_len=40) for m in (plain, ours)]
    caches = [e.new_cache() for e in engines]
    layers = model.config.n_layer
    # after the verification, two of its 3 tokens are rolled back, as a rejection does
    for start, n in [(0, 20), (20, 1), (21, 3), (22, 1), (23, 1)]:
        for cache in caches:
            cache.crop(start)
        a = engines[0](ids[:, start:start + n], past_key_values=caches[0]).logits.clone()
        served.clear()
        written.clear()
        b = engines[1](ids[:, start:start + n], past_key_values=caches[1]).logits.clone()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        on_kernel = n == 1 and KERNEL
        # a folded product the kernel does not serve asks again as a plain one
        asks = 4 * layers + 1 + (2 * layers if fold and not on_kernel else 0)
        assert served == [on_kernel] * asks
        assert len(written) == (layers if write and on_kernel else 0)
        for x, y in zip(engines[0].cache.layers, engines[1].cache.layers, strict=True):
            torch.testing.assert_close(x.pair[..., :start + n, :], y.pair[..., :start + n, :],
                                       rtol=1e-4, atol=1e-4)
        assert [e.cache.get_seq_length() for e in engines] == [start + n] * 2
        assert [c.get_seq_length() for c in caches] == [start + n] * 2


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("fold,write", FOLD_WRITE)
@torch.inference_mode()
def test_the_compiled_engine_on_it_decodes_the_eager_models_greedy_tokens(fold, write):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(sources.preset_config("gpt2-tiny")).cuda().eval()
    ours = fused.prepare(copy.deepcopy(model), kernel=True, fold=fold, write=write)
    engine = graphs.Engine(ours, max_len=128, compile=fused.COMPILE)
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), device="cuda")
    assert decode.decode(engine, prompt, 64).tokens == decode.decode(model, prompt, 64).tokens
    assert attention.NAME == ours.config._attn_implementation
