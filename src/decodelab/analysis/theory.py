"""The expected gain of speculative decoding in closed form (Leviathan et al. 2023): plain
floats, no torch, so that the statistics read it without the measuring stack."""

from __future__ import annotations

import math


def _check_alpha_k(alpha: float, k: int) -> None:
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0 or int(k) != k:
        raise ValueError(f"k must be a non-negative integer, got {k}")


def expected_tokens_per_call(alpha: float, k: int) -> float:
    """Expected tokens per target call with acceptance rate alpha and k draft tokens:
    (1 - alpha^(k+1)) / (1 - alpha), k + 1 at alpha = 1."""
    _check_alpha_k(alpha, k)
    if alpha == 1:
        return float(k + 1)
    if alpha == 0:
        return 1.0
    # expm1/log1p keep full precision as alpha -> 1, where 1 - alpha^(k+1) cancels.
    return -math.expm1((k + 1) * math.log1p(alpha - 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Expected wall-clock speedup (Leviathan et al. 2023), c = draft/target cost:
    (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1)), (k + 1) / (k c + 1) at alpha = 1."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    return expected_tokens_per_call(alpha, k) / (k * c + 1)


def alpha_from_tokens_per_call(tokens_per_call: float, k: int) -> float:
    """Per-token acceptance alpha from measured tokens per target call at draft length k: the
    root of expected_tokens_per_call(alpha, k) = tokens_per_call (NaN for NaN)."""
    from scipy.optimize import brentq

    if math.isnan(tokens_per_call):
        return float("nan")
    if tokens_per_call >= k + 1 - 1e-9:
        return 1.0
    if tokens_per_call <= 1 + 1e-12:
        return 0.0
    return float(brentq(lambda a: expected_tokens_per_call(a, k) - tokens_per_call, 0.0,
                        1 - 1e-12))


def alpha_of_calls(accepted: list[int], proposals: list[int], k: int) -> float:
    """alpha from the target calls that proposed all k draft tokens (NaN without one): the
    ones near the budget's end propose fewer and would bias tokens per call down."""
    full = [n for n, m in zip(accepted, proposals, strict=True) if m == k]
    return alpha_from_tokens_per_call(1 + sum(full) / len(full), k) if full else float("nan")
