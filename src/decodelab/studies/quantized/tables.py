"""The quantized study's tables: the verify cost of each GGUF type (time on K+1 tokens over 1,
as `stats.parallelism_table` has it for the PyTorch backends), the speculative rows of the
configurations with a llama.cpp role, with greedy agreement and where sequences part, and
llama.cpp's own speculative example on the same GGUF pairs (the peer) beside them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from decodelab.analysis.stability import paired
from decodelab.analysis.stats import bootstrap_ci, median_ratio
from decodelab.config.settings import Confidence
from decodelab.studies.speculative.tables import SPEC_KEYS, agreement, parallelism_table

VERIFY_COLUMNS = ["backend", "quantization", "device", "model", "context", "k", "ratio",
                  "ci_low", "ci_high", "n", "extra_per_token", "stable", "unstable_reason"]
VERIFY_KEYS = ["backend", "model", "context"]
ROLE_COLUMNS = ["target_backend", "target_quant", "draft_backend", "draft_quant"]
DIVERGENCE = ["diverged", "first_divergence", "min_margin"]
PEER_COLUMNS = [*SPEC_KEYS, "peer_speedup", "ci_low", "ci_high", "n", "peer_acceptance",
                "peer_tokens_per_s", "peer_autoregressive_tokens_per_s", "decodelab_speedup",
                "decodelab_proposal_acceptance"]
SPECULATIVE_COLUMNS = ["pair", *ROLE_COLUMNS, "mode", "k", "speedup", "ci_low", "ci_high",
                       "agree", "sequences", *DIVERGENCE]


def verify_cost_table(runs: pd.DataFrame, ci: Confidence, verdict: pd.DataFrame
                      ) -> pd.DataFrame:
    """Per type, device and model: the ratio, and what each token past the first costs in
    single-token passes ((ratio - 1) / K): about 0 is batch-parallel, about 1 serial. A ratio
    is stable when both its passes are (`verdict`: the parallelism study's verdicts, which
    judge these runs beside PyTorch's)."""
    if not len(runs):
        return pd.DataFrame(columns=VERIFY_COLUMNS)
    labels = runs.groupby("backend")[["quantization", "llama_device"]].first()
    table = parallelism_table(runs, ci).join(labels, on="backend")
    table = table.rename(columns={"llama_device": "device"})
    table["extra_per_token"] = (table["ratio"] - 1) / table["k"]
    table = paired(table.assign(tokens=table["k"] + 1), verdict, {
        "K+1 tokens": ([*VERIFY_KEYS, "tokens"], {}), "1 token": (VERIFY_KEYS, {"tokens": 1})})
    return table[VERIFY_COLUMNS]


def roles(runs: pd.DataFrame) -> pd.DataFrame:
    """Per pair: each role's backend and GGUF type (a PyTorch role's raw rows name neither)."""
    cols = {c: runs[f"pair_{c}"] if f"pair_{c}" in runs
            else pd.Series(None, index=runs.index, dtype=object) for c in ROLE_COLUMNS}
    out = pd.DataFrame({"pair": runs["pair"], **cols}).groupby("pair").first()
    for role in ("target", "draft"):
        out[f"{role}_backend"] = out[f"{role}_backend"].fillna("pytorch")
        out[f"{role}_quant"] = out[f"{role}_quant"].fillna("")
    return out.reset_index()


def divergences(runs: pd.DataFrame) -> pd.DataFrame:
    """Per pair and K of the greedy speculative rows: how many sequences part from the
    target's own greedy output, the earliest position, and the smallest margin there."""
    greedy = runs[(runs["mode"] == "greedy") & (runs["method"] == "speculative")]
    if "diverges_at" not in greedy:
        greedy = greedy.assign(diverges_at=np.nan, divergence_margin=np.nan)
    return greedy.groupby(["pair", "k"]).agg(
        diverged=("diverges_at", "count"), first_divergence=("diverges_at", "min"),
        min_margin=("divergence_margin", "min")).reset_index()


def speculative_table(runs: pd.DataFrame, speedup: pd.DataFrame) -> pd.DataFrame:
    """The speedup rows of the configurations with a llama.cpp role, each with its roles and,
    in greedy mode, agreement with the target's own greedy decoding and the divergences."""
    if not len(runs):
        return pd.DataFrame(columns=SPECULATIVE_COLUMNS)
    rows = speedup[speedup["pair"].isin(set(runs["pair"]))].merge(roles(runs), on="pair")
    greedy = agreement(runs, "speculative").drop(columns="method").merge(
        divergences(runs), on=["pair", "k"], how="left").assign(mode="greedy")
    out = rows.merge(greedy, on=["pair", "mode", "k"], how="left")
    # where sequences part is measured against a llama.cpp target only
    out.loc[out["target_backend"] != "llamacpp", DIVERGENCE] = np.nan
    return out[SPECULATIVE_COLUMNS]


def peer_table(runs: pd.DataFrame, speedup: pd.DataFrame, acceptance: pd.DataFrame,
               ci: Confidence) -> pd.DataFrame:
    """Per pair, mode and K: llama.cpp's speculative decode rate over its own autoregressive
    rate (seconds per token, median over prompts per process, then over processes as
    `stats.speedup_table` does), its acceptance (drafted tokens accepted, pooled), and
    decodelab's speedup and per-proposal acceptance on the same pair beside them."""
    if not len(runs):
        return pd.DataFrame(columns=PEER_COLUMNS)
    runs = runs.assign(per_token_s=runs["seconds"] / runs["tokens"])
    proc = runs.groupby(["pair", "mode", "method", "k", "repeat"]).agg(
        per_token_s=("per_token_s", "median"), accepted=("accepted", "sum"),
        drafted=("drafted", "sum")).reset_index()
    rows = []
    for (pair, mode), group in proc.groupby(["pair", "mode"]):
        base = group.loc[group["method"] == "autoregressive", "per_token_s"].to_numpy(float)
        for k, spec in group[group["method"] == "speculative"].groupby("k"):
            x = spec["per_token_s"].to_numpy(float)
            low, high = bootstrap_ci(median_ratio, (base, x), ci)
            rows.append({"pair": pair, "mode": mode, "k": k, "peer_speedup": median_ratio(base, x),
                         "ci_low": low, "ci_high": high, "n": len(x),
                         "peer_acceptance": spec["accepted"].sum() / spec["drafted"].sum(),
                         "peer_tokens_per_s": 1 / float(np.median(x)),
                         "peer_autoregressive_tokens_per_s": 1 / float(np.median(base))})
    ours = speedup[SPEC_KEYS + ["speedup"]].merge(
        acceptance[SPEC_KEYS + ["proposal_acceptance"]], on=SPEC_KEYS, how="outer").rename(
        columns={"speedup": "decodelab_speedup",
                 "proposal_acceptance": "decodelab_proposal_acceptance"})
    return pd.DataFrame(rows).merge(ours, on=SPEC_KEYS, how="left")[PEER_COLUMNS]
