"""The memory-bandwidth floor of a decoding step: at batch 1 a step reads every weight once, so
no step beats weight bytes / memory bandwidth. How far a model's measured step lies above it says
how much a decoder leaves on the table (kernel launches, the host), and where speculative
decoding has room: a step far above its floor is bound by something other than the weights.
This module measures; `stats.floor_table` sets the steps against the floor.

The bandwidth is measured in the speculative process itself (a device-to-device copy), not
taken from a datasheet, so the floor is what this device delivers to this process.
"""

from __future__ import annotations

import math

import torch

from decodelab.backends.devices import now
from decodelab.engines.speculative import torch_device

COPY_BYTES = 256 * 2**20


def copy_bandwidth(device: torch.device | str, nbytes: int = COPY_BYTES, repeats: int = 5
                   ) -> float:
    """Bytes per second of a device-to-device copy (read and write), the best of `repeats`
    after one warm-up copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = math.inf
    for _ in range(repeats):
        start = now(device)
        dst.copy_(src)
        best = min(best, now(device) - start)
    return 2 * nbytes / best


def weight_bytes(model) -> float:
    """Bytes of a PyTorch model's parameters, or those of the one a graph engine wraps; for an
    engine outside torch, its own count (`weight_bytes()`, llama.cpp's), else NaN."""
    if torch_device(model) is None:
        counted = getattr(model, "weight_bytes", None)
        return counted() if counted is not None else math.nan
    return float(sum(p.numel() * p.element_size() for p in model.parameters()))


def compute_device(model) -> torch.device | None:
    """Where a model's step reads its weights: its torch device, or for an engine outside torch
    the device it computes on (`compute_device`, llama.cpp's) where torch can copy there too;
    None where neither is known."""
    device = torch_device(model)
    if device is not None:
        return device
    named = getattr(model, "compute_device", None)
    if named == "cuda":  # llama.cpp offloads to the first GPU
        return torch.device("cuda", 0) if torch.cuda.is_available() else None
    return torch.device(named) if named is not None else None


def columns(target, draft) -> dict[str, float]:
    """Each role's weight bytes and its device's copy bandwidth (measured once per device)."""
    measured: dict[torch.device, float] = {}
    out = {}
    for role, model in (("target", target), ("draft", draft)):
        device = compute_device(model)
        if device is not None and device not in measured:
            measured[device] = copy_bandwidth(device)
        out[f"{role}_weight_bytes"] = weight_bytes(model)
        out[f"{role}_bandwidth"] = measured.get(device, math.nan)
    return out
