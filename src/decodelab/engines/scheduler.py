"""The per-request speculation scheduler (ASPIRE, reduced to testable parts), as pure functions.

Per request a Beta posterior of its per-token acceptance alpha; a cost model of one batched
forward, fitted by least squares to measured times: t_draft(B, L) = d0 + d1 B + d2 B L and
t_verify(B, L, n) = v0 + v1 B n + v2 B L for n tokens per row (weights read once, compute per
token fed, each row's KV read once); and per request the K that maximizes expected tokens per
unit cost, E(K) / (K t_draft + t_verify(K + 1)) with E(K) = (1 - a^(K+1)) / (1 - a). A request
drafts one more token while it has drafted fewer than its K*, and verifies otherwise.

E(K) is concave and the cost affine in K, so their ratio is unimodal: `k_star` climbs until the
ratio falls instead of scanning every K (the tests check it against the brute-force argmax).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from decodelab.core.errors import DecodelabError


@dataclass(frozen=True)
class Posterior:
    """Beta(accepts + a, rejects + b) over a request's per-token acceptance. `decay` < 1 forgets
    old rounds geometrically, so that the estimate follows a request whose acceptance switches."""

    accepts: float = 1.0
    rejects: float = 1.0

    def update(self, proposed: int, accepted: int, decay: float = 1.0) -> Posterior:
        """One verification: `accepted` of `proposed` draft tokens kept. The tokens after the
        first rejection were never judged, so a round adds its accepts and at most one reject."""
        if not 0 <= accepted <= proposed:
            raise DecodelabError(f"accepted {accepted} of {proposed} proposed draft tokens")
        rejected = 1 if accepted < proposed else 0
        return Posterior(decay * self.accepts + accepted, decay * self.rejects + rejected)

    @property
    def mean(self) -> float:
        return self.accepts / (self.accepts + self.rejects)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round of K drafts and a verification emits, per-token acceptance alpha."""
    return k + 1.0 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def draft_features(batch: float, context: float) -> np.ndarray:
    return np.array([1.0, batch, batch * context])


def verify_features(batch: float, context: float, tokens: float) -> np.ndarray:
    return np.array([1.0, batch * tokens, batch * context])


@dataclass(frozen=True)
class CostModel:
    draft: tuple[float, float, float]  # seconds per forward: d0, d1 (per row), d2 (per row x L)
    verify: tuple[float, float, float]  # v0, v1 (per token fed), v2 (per row x L)

    def t_draft(self, batch: float, context: float) -> float:
        return float(draft_features(batch, context) @ self.draft)

    def t_verify(self, batch: float, context: float, tokens: float) -> float:
        return float(verify_features(batch, context, tokens) @ self.verify)


def least_squares(features: np.ndarray, seconds: np.ndarray, what: str) -> tuple:
    if len(seconds) < features.shape[1] or np.linalg.matrix_rank(features) < features.shape[1]:
        raise DecodelabError(f"the {what} cost model has {features.shape[1]} coefficients and "
                             f"needs at least as many timings at different shapes, got "
                             f"{len(seconds)} of rank {np.linalg.matrix_rank(features)}")
    return tuple(float(c) for c in np.linalg.lstsq(features, seconds, rcond=None)[0])


def fit_costs(draft: Sequence[tuple[float, float, float]],
              verify: Sequence[tuple[float, float, float, float]]) -> CostModel:
    """Least squares on measured forwards: draft rows (B, L, seconds), verify rows
    (B, L, tokens per row, seconds)."""
    d, v = np.asarray(draft, dtype=float), np.asarray(verify, dtype=float)
    if d.ndim != 2 or d.shape[1] != 3 or v.ndim != 2 or v.shape[1] != 4:
        raise DecodelabError("cost timings are rows of (batch, context, seconds) for drafts and "
                             "(batch, context, tokens, seconds) for verifications")
    return CostModel(
        least_squares(np.stack([draft_features(b, ctx) for b, ctx, _ in d]), d[:, 2], "draft"),
        least_squares(np.stack([verify_features(b, ctx, n) for b, ctx, n, _ in v]), v[:, 3],
                      "verify"))


def fitted_cost(rows: Sequence[Mapping]) -> CostModel:
    """`fit_costs` on timed batched forwards (batch, context, tokens per row, seconds): a draft
    is a one-token forward, a verification one of any width."""
    draft = [(r["batch"], r["context"], r["seconds"]) for r in rows if r["tokens"] == 1]
    verify = [(r["batch"], r["context"], r["tokens"], r["seconds"]) for r in rows]
    return fit_costs(draft, verify)


def tokens_per_second(alpha: float, k: int, cost: CostModel, batch: float, context: float
                      ) -> float:
    """Expected tokens per unit cost of one request's round of K drafts and a verification."""
    seconds = k * cost.t_draft(batch, context) + cost.t_verify(batch, context, k + 1)
    return expected_tokens(alpha, k) / seconds


def k_star(alpha: float, cost: CostModel, batch: float, context: float, k_max: int) -> int:
    """The K in 0..k_max maximizing `tokens_per_second` (unimodal in K: climb to the top)."""
    k = 0
    while k < k_max and (tokens_per_second(alpha, k + 1, cost, batch, context)
                         > tokens_per_second(alpha, k, cost, batch, context)):
        k += 1
    return k


def round_k(posterior: Posterior, cost: CostModel, batch: float, context: float,
            k_max: int) -> int:
    """K* at the posterior mean, but at least 1: a round of K = 0 judges no draft token, so a
    request stuck there would never learn that its acceptance rose."""
    return max(1, k_star(posterior.mean, cost, batch, context, k_max))


def drafts_more(posterior: Posterior, drafted: int, cost: CostModel, batch: float,
                context: float, k_max: int) -> bool:
    """A request's choice this tick: draft one more token (True) or verify now (False)."""
    return drafted < round_k(posterior, cost, batch, context, k_max)
