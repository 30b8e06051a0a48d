"""The `fused` engine's model: Conv1D in the Linear layout, attention on decodelab's kernel."""

import copy

import torch
from transformers import AutoModelForCausalLM
from transformers.pytorch_utils import Conv1D

from decodelab.backends import sources
from decodelab.engines.cuda import attention, fused


def tiny_gpt2():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(sources.preset_config("gpt2-tiny")).eval()


def test_every_conv1d_becomes_a_linear_layout_that_computes_the_same():
    model = tiny_gpt2()
    ids = torch.randint(0, model.config.vocab_size, (1, 12))
    with torch.inference_mode():
        before = model(ids).logits
        swapped = fused.as_linears(copy.deepcopy(model))
        after = swapped(ids).logits
    assert not any(isinstance(m, Conv1D) for m in swapped.modules())
    linears = [m for m in swapped.modules() if isinstance(m, fused.LinearConv1D)]
    assert len(linears) == 4 * model.config.n_layer  # c_attn, c_proj, c_fc and the MLP's c_proj
    assert all(m.weight.is_contiguous() and m.weight.shape[0] == m.bias.shape[0] for m in linears)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_prepare_changes_the_model_in_place_and_puts_its_attention_on_the_kernel():
    model = tiny_gpt2()
    assert fused.prepare(model) is model
    assert model.config._attn_implementation == attention.NAME
    assert not any(isinstance(m, Conv1D) for m in model.modules())
