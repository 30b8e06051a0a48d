"""The rejection-sampling math of speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

No models here: distributions in, an accepted count and the next token out. A draft token
x ~ q_i is kept with probability min(1, p_i(x) / q_i(x)); at the first rejection the next token
comes from norm(max(0, p_i - q_i)), and when all K are kept a bonus token comes from p_K. Every
emitted token is then distributed exactly as p (`emitted_distribution` is the closed form).

p and q must come out of the same `warp`, so that q is exactly what the draft sampled from.
"""

from __future__ import annotations

import math

import torch


def wide(device: torch.device) -> torch.dtype:
    """float64 for the ratio, the residual and the running sum whatever the inputs; MPS has no
    float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def _residual_tol(*dtypes: torch.dtype) -> float:
    # Two distributions equal up to rounding differ by at most eps of the coarser input in total
    # variation, so a residual mass below that is rounding, not signal.
    return max(torch.finfo(dtype).eps for dtype in dtypes)


def _resample_weights(p: torch.Tensor, q: torch.Tensor, tol: float) -> torch.Tensor:
    """Unnormalised weights of the token drawn after a rejection: max(0, p - q), or p itself
    where that residual's mass is <= tol (over the last dim).

    The residual's mass is 1 - beta, the chance of a rejection at all. Where it is ~0, p ~ q and
    the residual is rounding noise (or exactly zero, and 0/0); drawing from p instead moves the
    emitted distribution by at most that mass in total variation, below the inputs' precision,
    and p is the distribution the step must reproduce anyway.
    """
    residual = (p - q).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > tol, residual, p)


def _sample_no_sync(weights: torch.Tensor, generator: torch.Generator | None,
                    u: torch.Tensor | None = None) -> torch.Tensor:
    """[..., V] unnormalised weights -> [...] indices, without a host sync: one uniform per row
    against the running sum (inverse CDF), in float64 where the device has it. `u` ([..., 1]):
    the uniforms, drawn beforehand (a CUDA graph replays the draw on them); None draws them.

    One random number per draw, where torch.multinomial and the exponential race draw V of them
    (0.1-0.15 ms per 4096-token row on a CPU core: a sixth of the default draft's step).
    """
    cdf = weights.cumsum(-1, dtype=wide(weights.device))
    if u is None:
        u = torch.rand((*cdf.shape[:-1], 1), generator=generator, device=cdf.device,
                       dtype=cdf.dtype)
    return _invert_cdf(cdf, u)


def _invert_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The index whose span of the normalised running sum holds u ([..., 1] in [0, 1)).

    cdf / cdf[-1] ends at exactly 1 (x / x is exact) and rounds monotonically, so flat stretches
    (zero weights) stay empty spans and any u < 1 lands on a token of positive weight: no clamp
    after rounding, four operations per draw in all (the sampler's share of a draft step).
    """
    return torch.searchsorted(cdf / cdf[..., -1:], u, right=True).squeeze(-1)


def _leading_run(matched: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True in a [K] bool tensor, as a [1] long tensor (no sync)."""
    return matched.to(torch.float32).cumprod(0).sum().long().reshape(1)


def _check_verify_shapes(scores: torch.Tensor, draft_tokens: torch.Tensor, name: str) -> int:
    if draft_tokens.dim() != 1:
        raise ValueError(f"draft_tokens must be [K], got shape {tuple(draft_tokens.shape)}")
    if draft_tokens.is_floating_point() or draft_tokens.is_complex():
        raise ValueError(f"draft_tokens must be an integer tensor, got {draft_tokens.dtype}")
    k = draft_tokens.shape[0]
    if scores.dim() != 2 or scores.shape[0] != k + 1 or scores.shape[1] == 0:
        raise ValueError(f"{name} must be [K+1, V] = [{k + 1}, V] for K={k} draft tokens, "
                         f"got shape {tuple(scores.shape)}")
    if scores.device != draft_tokens.device:
        raise ValueError(f"{name} is on {scores.device} but draft_tokens on "
                         f"{draft_tokens.device}")
    return k


def speculative_accept(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                       draft_tokens: torch.Tensor, generator: torch.Generator | None = None
                       ) -> tuple[int, int]:
    """Verify K draft tokens against the target; returns (n_accepted in 0..K, next_token).

    target_probs [K+1, V]: the target's distribution at each draft position plus the bonus one.
    draft_probs [K, V]: the distribution each draft token was sampled from.
    draft_tokens [K]: the draft tokens. generator: on the tensors' device.

    Token i is accepted iff u_i * q_i(x_i) < p_i(x_i), u_i ~ U[0, 1): with probability
    min(1, p/q). So q_i(x_i) = 0 (a token the draft could not have sampled) is accepted iff
    p_i(x_i) > 0, and p == q always accepts. next_token is drawn from norm(max(0, p_n - q_n)) at
    the first rejection n, or from p_K when all K are accepted (p_0 when K = 0). Token ids must
    be in [0, V); probabilities need not be normalised. One host sync per call.
    """
    n_accepted, token = speculative_verdict(target_probs, draft_probs, draft_tokens,
                                            generator).tolist()
    return n_accepted, token


def verdict_uniforms(k: int, generator: torch.Generator | None, device: torch.device,
                     out: tuple[torch.Tensor, torch.Tensor] = (None, None)
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The uniforms a verdict on K draft tokens draws, in this order: one per accept test ([K])
    and the next token's ([1, 1]); into `out` where given."""
    dtype = wide(device)
    return (torch.rand(k, generator=generator, device=device, dtype=dtype, out=out[0]),
            torch.rand(1, 1, generator=generator, device=device, dtype=dtype, out=out[1]))


def speculative_verdict(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                        draft_tokens: torch.Tensor, generator: torch.Generator | None = None,
                        u: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """`speculative_accept` without the host sync: [n_accepted, next_token] ([2], long) on the
    tensors' device. `u`: its uniforms (`verdict_uniforms`), drawn beforehand (a CUDA graph
    replays the verdict on them); None draws them from `generator`."""
    k = _check_verify_shapes(target_probs, draft_tokens, "target_probs")
    v = target_probs.shape[1]
    if tuple(draft_probs.shape) != (k, v):
        raise ValueError(f"draft_probs must be [K, V] = [{k}, {v}], "
                         f"got shape {tuple(draft_probs.shape)}")
    if not (target_probs.is_floating_point() and draft_probs.is_floating_point()):
        raise ValueError("target_probs and draft_probs must be floating point, got "
                         f"{target_probs.dtype} and {draft_probs.dtype}")
    if draft_probs.device != target_probs.device:
        raise ValueError(f"draft_probs is on {draft_probs.device} but target_probs on "
                         f"{target_probs.device}")

    dtype = wide(target_probs.device)
    u_accept, u_next = u if u is not None else verdict_uniforms(k, generator, target_probs.device)
    tokens = draft_tokens.long().unsqueeze(1)
    p_x = target_probs[:k].gather(1, tokens).squeeze(1)
    q_x = draft_probs.gather(1, tokens).squeeze(1)
    # u * q < p rather than u < p / q: no 0/0 when q(x) = p(x) = 0. u's dtype makes it wide.
    n = _leading_run(u_accept * q_x < p_x)

    p_n = target_probs.index_select(0, n).to(dtype)
    if k == 0:
        weights = p_n
    else:
        # The draft's row at n, zero at the bonus position n = K (whose residual is p_K itself):
        # one row read, where padding q with a zero row copied all K.
        q_n = draft_probs.index_select(0, n.clamp_max(k - 1)) * (n < k)
        weights = _resample_weights(p_n, q_n, _residual_tol(target_probs.dtype,
                                                            draft_probs.dtype))
    return torch.cat([n, _sample_no_sync(weights, generator, u_next)])


def greedy_accept(target_logits_or_probs: torch.Tensor, draft_tokens: torch.Tensor
                  ) -> tuple[int, int]:
    """Greedy verification: accept while the target's argmax equals the draft token; the next
    token is the target's argmax at the first mismatch, or at position K when all match."""
    n_accepted, token = greedy_verdict(target_logits_or_probs, draft_tokens).tolist()
    return n_accepted, token


def greedy_verdict(target_logits_or_probs: torch.Tensor, draft_tokens: torch.Tensor
                   ) -> torch.Tensor:
    """`greedy_accept` without the host sync: [n_accepted, next_token] ([2], long)."""
    k = _check_verify_shapes(target_logits_or_probs, draft_tokens, "target_logits_or_probs")
    best = target_logits_or_probs.argmax(dim=-1)
    n = _leading_run(best[:k] == draft_tokens.long())
    return torch.cat([n, best.index_select(0, n)])


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches top_p."""
    ordered = probs.sort(dim=-1, descending=True).values
    cumulative = ordered.cumsum(-1)
    ahead = torch.cat([torch.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], dim=-1)
    # A token is in the nucleus iff the mass ahead of it is still < top_p; the first always is.
    n_kept = (ahead < top_p).sum(-1, keepdim=True)
    cutoff = ordered.gather(-1, n_kept - 1)
    # Thresholding (not sort order) keeps ties at the cutoff, so the set is device-independent.
    return probs.masked_fill(probs < cutoff, 0)


def warp(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
         ) -> torch.Tensor:
    """logits [..., V] -> float32 probabilities [..., V]: temperature, then top-k, then top-p,
    renormalised. temperature 0 is a one-hot argmax. top_k = 0 and top_p = 1 disable those.
    Ties at the k-th logit are all kept, as are ties at the nucleus cutoff."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if temperature != 1:
        logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1:
        probs = _nucleus(probs, top_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None,
           u: torch.Tensor | None = None) -> torch.Tensor:
    """probs [..., V] -> sampled indices [...] (long), by inverse CDF (`_sample_no_sync`), on
    uniforms `u` ([..., 1]) where given."""
    return _sample_no_sync(probs, generator, u)


def emitted_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Closed form (float64, [..., V]) of the token one accept/resample step emits when the
    draft samples x ~ q: q(x) min(1, p(x)/q(x)) + (1 - beta) r(x), beta = sum_x min(p, q),
    r = norm(max(0, p - q)), with the same near-zero-residual fallback as `speculative_accept`.
    For normalised p and q it equals p."""
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and "
                         f"{tuple(q.shape)}")
    tol = _residual_tol(p.dtype, q.dtype)
    p64 = p.to("cpu" if p.device.type == "mps" else p.device, torch.float64)
    q64 = q.to(p64.device, torch.float64)
    kept = torch.minimum(p64, q64)  # q min(1, p/q), which is 0 where q is 0
    beta = kept.sum(-1, keepdim=True)
    resample = _resample_weights(p64, q64, tol)
    return kept + (1 - beta) * resample / resample.sum(-1, keepdim=True)
