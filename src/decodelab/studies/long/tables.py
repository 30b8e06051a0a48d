"""The long-context study's tables (raw rows: `decodelab.studies.long.run`), the held-out document
the
unit that the bootstrap resamples:

- acceptance: per-token alpha (pooled over a document's calls in every process, as
  `stats.pooled_alpha` pools them) and per-proposal acceptance, the mean over documents;
- speedup: per document, the fair baseline's median time over the speculative one's (same L,
  mode and processes), the mean over documents; beside it c, the draft's cost per drafted token
  over the target's decode step, and Leviathan et al.'s prediction from the measured alpha and c;
- memory: the draft view's and the verifier's KV bytes and the allocator's peak.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from decodelab.analysis.stats import mean_ci
from decodelab.analysis.theory import alpha_of_calls, expected_speedup
from decodelab.config.settings import Confidence

KEYS = ["target", "backend", "drafter", "policy", "kv_budget", "length", "mode", "k"]
BASE_KEYS = ["target", "backend", "length", "mode", "document"]
ACCEPTANCE_COLUMNS = [*KEYS, "alpha", "ci_low", "ci_high", "proposal_acceptance",
                      "proposal_ci_low", "proposal_ci_high", "tokens_per_call", "n"]
SPEEDUP_COLUMNS = [*KEYS, "speedup", "ci_low", "ci_high", "spec_s", "autoregressive_s",
                   "cost_ratio", "alpha", "predicted", "n"]
MEMORY_COLUMNS = [k for k in KEYS if k not in ("mode", "k")] + [
    "draft_kv_bytes", "verifier_kv_bytes", "peak_bytes", "rss_bytes", "n"]


def flat(cells) -> list[int]:
    return [n for cell in cells for n in cell]


def per_document(runs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and document, over its processes: pooled alpha and per-proposal
    acceptance, median time and draft step."""
    rows = []
    for key, g in runs[runs["method"] == "speculative"].groupby([*KEYS, "document"]):
        row = dict(zip([*KEYS, "document"], key, strict=True))
        accepted, proposals = flat(g["accepted"]), flat(g["proposals"])
        rows.append({**row, "alpha": alpha_of_calls(accepted, proposals, int(row["k"])),
                     "proposal_acceptance": sum(accepted) / sum(proposals) if sum(proposals)
                     else np.nan,
                     "tokens_per_call": g["tokens"].map(len).sum() / g["target_calls"].sum(),
                     "total_s": g["total_s"].median(), "draft_step_s": g["draft_step_s"].median()})
    return pd.DataFrame(rows, columns=[*KEYS, "document", "alpha", "proposal_acceptance",
                                       "tokens_per_call", "total_s", "draft_step_s"])


def baselines(runs: pd.DataFrame) -> pd.DataFrame:
    """Per L, mode and document: the target alone, median time and decode step."""
    base = runs[runs["method"] == "autoregressive"]
    return base.groupby(BASE_KEYS).agg(autoregressive_s=("total_s", "median"),
                                       step_s=("step_s", "median")).reset_index()


def acceptance_table(docs: pd.DataFrame, ci: Confidence) -> pd.DataFrame:
    rows = []
    for key, g in docs.groupby(KEYS):
        alpha, low, high = mean_ci(g["alpha"].to_numpy(dtype=float), ci)
        prop, plow, phigh = mean_ci(g["proposal_acceptance"].to_numpy(dtype=float), ci)
        rows.append({**dict(zip(KEYS, key, strict=True)), "alpha": alpha, "ci_low": low,
                     "ci_high": high, "proposal_acceptance": prop, "proposal_ci_low": plow,
                     "proposal_ci_high": phigh,
                     "tokens_per_call": float(g["tokens_per_call"].mean()), "n": len(g)})
    return pd.DataFrame(rows, columns=ACCEPTANCE_COLUMNS)


def speedup_table(docs: pd.DataFrame, base: pd.DataFrame, ci: Confidence) -> pd.DataFrame:
    paired = docs.merge(base, on=BASE_KEYS)
    paired["speedup"] = paired["autoregressive_s"] / paired["total_s"]
    paired["cost_ratio"] = paired["draft_step_s"] / paired["step_s"]
    rows = []
    for key, g in paired.groupby(KEYS):
        speedup, low, high = mean_ci(g["speedup"].to_numpy(dtype=float), ci)
        alpha, c = float(g["alpha"].mean()), float(g["cost_ratio"].mean())
        row = dict(zip(KEYS, key, strict=True))
        predicted = expected_speedup(alpha, int(row["k"]), c) if np.isfinite(alpha) else np.nan
        rows.append({**row, "speedup": speedup, "ci_low": low, "ci_high": high,
                     "spec_s": float(g["total_s"].median()),
                     "autoregressive_s": float(g["autoregressive_s"].median()),
                     "cost_ratio": c, "alpha": alpha, "predicted": predicted, "n": len(g)})
    return pd.DataFrame(rows, columns=SPEEDUP_COLUMNS)


def memory_table(runs: pd.DataFrame) -> pd.DataFrame:
    keys = MEMORY_COLUMNS[:MEMORY_COLUMNS.index("draft_kv_bytes")]
    spec = runs[runs["method"] == "speculative"]
    out = spec.groupby(keys).agg(
        draft_kv_bytes=("draft_kv_bytes", "max"), verifier_kv_bytes=("verifier_kv_bytes", "max"),
        peak_bytes=("peak_bytes", "median"), rss_bytes=("rss_bytes", "median"),
        n=("document", "nunique")).reset_index()
    return out[MEMORY_COLUMNS]


def tables(runs: pd.DataFrame, ci: Confidence) -> dict[str, pd.DataFrame]:
    """The group's tables (`decodelab.core.tables`, group long); no runs give them empty."""
    if not len(runs):
        return {"acceptance": pd.DataFrame(columns=ACCEPTANCE_COLUMNS),
                "speedup": pd.DataFrame(columns=SPEEDUP_COLUMNS),
                "memory": pd.DataFrame(columns=MEMORY_COLUMNS)}
    docs = per_document(runs)
    return {"acceptance": acceptance_table(docs, ci),
            "speedup": speedup_table(docs, baselines(runs), ci), "memory": memory_table(runs)}
