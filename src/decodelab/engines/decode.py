"""The decode harness: a timed prefill, then one timed forward pass per generated token.

The full budget is always decoded (no EOS stop), so budgets are comparable. With the cache on,
each step feeds one token and a `DynamicCache` we own; with it off, each step re-runs the whole
sequence, which is what `use_cache=False` means for latency.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from decodelab.backends.devices import now
from decodelab.backends.models import require_finite
from decodelab.engines.sampling import sample, warp


@dataclass
class Decoded:
    tokens: list[int]
    prefill_s: float
    step_s: list[float] = field(default_factory=list)
    # Where a step's time goes: the host's wall and CPU time until the step's work is queued
    # (on CPU, until it is done). Wall well above CPU: the thread was not running; step well
    # above launch: the device was busy.
    launch_s: list[float] = field(default_factory=list)
    launch_cpu_s: list[float] = field(default_factory=list)
    probed: list[float] = field(default_factory=list)

    @property
    def decode_s(self) -> float:
        return float(sum(self.step_s))


def cache_kwarg(model) -> str:
    """transformers 5.24 renamed `past_key_values` to `cache`; accept both spellings."""
    return forward_cache_kwarg(type(model))


@functools.cache
def forward_cache_kwarg(model_class: type) -> str:
    # Once per class: inspect.signature costs ~0.2 ms, paid on every forward pass otherwise.
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model) -> DynamicCache:
    """An empty KV cache for `model`: its own where it keeps one (`llamacpp.Engine`)."""
    own = getattr(model, "new_cache", None)
    return own() if own is not None else DynamicCache(config=model.config)


def forward_logits(model, ids: torch.Tensor, cache: DynamicCache | None) -> torch.Tensor:
    """Logits of the last position only (`logits_to_keep=1`, as `generate` does)."""
    kwargs = {"use_cache": cache is not None, "logits_to_keep": 1}
    if cache is not None:
        kwargs[cache_kwarg(model)] = cache
    return model(input_ids=ids, **kwargs).logits[:, -1, :]


def first_divergence(ours: list[int], reference: list[int]) -> int | None:
    """The first position where two token sequences differ, None where they agree."""
    return next((i for i, (a, b) in enumerate(zip(ours, reference, strict=True)) if a != b),
                None)


@torch.inference_mode()
def margin(model, prefix: list[int]) -> float:
    """The gap between the model's two largest next-token logits after `prefix`, evaluated
    afresh: how close to a tie greedy decoding was where two sequences part."""
    ids = torch.tensor([prefix], device=model.device)
    top = forward_logits(model, ids, new_cache(model))[0].float().topk(2).values
    return float(top[0] - top[1])


def next_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
               generator: torch.Generator | None) -> torch.Tensor:
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    return sample(warp(logits, temperature, top_k, top_p), generator).reshape(-1, 1)


@torch.inference_mode()
def decode(model, prompt: torch.Tensor, budget: int, use_cache: bool = True,
           temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           generator: torch.Generator | None = None,
           probe: Callable[[], float] | None = None, role: str = "model") -> Decoded:
    """Generate exactly `budget` tokens after `prompt` ([1, T] ids on the model's device).
    `probe` (a device clock, say) is read after every step, outside the step's time. NaN/inf
    logits in the prefill or the last step stop it, checked after the last timestamp."""
    device = prompt.device
    cache = new_cache(model) if use_cache else None
    start = now(device)
    logits = forward_logits(model, prompt, cache)
    prefill_logits = logits.clone()  # a graph engine's later replays reuse its buffers
    token = next_token(logits, temperature, top_k, top_p, generator)
    prefill_end = now(device)
    out = Decoded(tokens=[], prefill_s=prefill_end - start)
    generated = [token]
    last = prefill_end
    for _ in range(budget - 1):
        cpu = time.thread_time()
        ids = token if use_cache else torch.cat([prompt, *generated], dim=1)
        logits = forward_logits(model, ids, cache)
        token = next_token(logits, temperature, top_k, top_p, generator)
        out.launch_cpu_s.append(time.thread_time() - cpu)
        out.launch_s.append(time.perf_counter() - last)
        generated.append(token)
        t = now(device)
        out.step_s.append(t - last)
        last = t
        if probe is not None:
            out.probed.append(probe())
            last = time.perf_counter()
    require_finite(torch.cat([prefill_logits, logits]), model, role,
                   "in the prefill or the last decode step")
    out.tokens = torch.cat(generated, dim=1)[0].tolist()
    return out
