import time

import pytest
import torch

from decodelab.backends import models, sources
from decodelab.engines import decode as decode_module
from decodelab.engines.decode import decode


@pytest.fixture(scope="module", params=["gpt2-tiny", "opt-tiny", "bloom-tiny"])
def model(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("m") / request.param
    sources.prepare({"source": "init", "preset": request.param, "seed": 3}, out)
    return models.load(out, "cpu")


def prompt_for(model, length=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (1, length), generator=gen)


def test_cache_on_and_off_give_the_same_greedy_tokens(model):
    prompt = prompt_for(model)
    on = decode(model, prompt, 24, use_cache=True)
    off = decode(model, prompt, 24, use_cache=False)
    assert on.tokens == off.tokens


def test_greedy_tokens_match_a_plain_full_sequence_argmax(model):
    prompt = prompt_for(model)
    ids = prompt
    with torch.no_grad():
        for _ in range(10):
            nxt = model(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    assert decode(model, prompt, 10).tokens == ids[0, prompt.shape[1]:].tolist()


def test_the_full_budget_is_decoded_even_past_eos(model):
    prompt = prompt_for(model)
    first = decode(model, prompt, 1).tokens[0]
    model.config.eos_token_id = first  # an EOS as the very first token must not stop decoding
    out = decode(model, prompt, 17)
    assert len(out.tokens) == 17
    assert len(out.step_s) == 16
    assert out.prefill_s > 0 and all(s > 0 for s in out.step_s)


def test_a_probe_is_read_once_per_step(model):
    prompt = prompt_for(model)
    calls = iter(range(100))
    out = decode(model, prompt, 9, probe=lambda: float(next(calls)))
    assert out.probed == [float(i) for i in range(8)]
    assert len(out.step_s) == 8
    assert decode(model, prompt, 9).probed == []


def stalled(forward, how: str, seconds: float = 0.02):
    """`forward` with each call held up `seconds`, asleep, or busy on this thread for `seconds`
    of its own CPU time (so that a loaded machine stretches the wall time, not the CPU time)."""
    def slow(*args, **kwargs):
        if how == "asleep":
            time.sleep(seconds)
        end = time.thread_time() + seconds
        while how == "busy" and time.thread_time() < end:
            pass
        return forward(*args, **kwargs)
    return slow


@pytest.mark.parametrize("how", ["asleep", "busy"])
def test_the_launch_breakdown_tells_a_thread_that_waits_from_one_that_works(model, monkeypatch,
                                                                            how):
    prompt = prompt_for(model)
    plain = decode(model, prompt, 9)
    assert len(plain.launch_s) == len(plain.launch_cpu_s) == len(plain.step_s) == 8
    assert all(0 < a <= s for a, s in zip(plain.launch_s, plain.step_s, strict=True))
    monkeypatch.setattr(decode_module, "forward_logits",
                        stalled(decode_module.forward_logits, how))
    out = decode(model, prompt, 9)
    assert min(out.launch_s) >= 0.02
    if how == "asleep":  # the wall time grew, this thread's CPU time did not
        assert max(out.launch_cpu_s) < 0.02
    else:
        assert min(out.launch_cpu_s) >= 0.015


def test_seeded_sampling_is_reproducible_and_differs_from_greedy(model):
    prompt = prompt_for(model)

    def sample(seed):
        gen = torch.Generator().manual_seed(seed)
        return decode(model, prompt, 32, temperature=1.0, generator=gen).tokens

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
