"""The seed study's OWN reported values, quoted in the text as the comparison point and never as
a result of this build: the one place in the paper pipeline where a number is typed by hand."""

from __future__ import annotations

from decodelab.report.tex import plain

# Source: the seed abstract (shared/seeds/, "Non-Monotonic Latency in Apple MPS Decoding ..."):
# "a measured 1.61x wall-clock speedup at K=6, on an acceptance profile declining from 69.7% at
# K=1 to 37.8% at the optimum, while three of five configurations decelerate".
SEED_CLAIMS = {
    "speedup": 1.61, "best_k": 6, "first_k": 1, "acceptance_first_k_percent": 69.7,
    "acceptance_best_k_percent": 37.8, "configurations": 5, "decelerating": 3,
    # its equivalence verification: "a two-sample test over roughly 9,200 real-model tokens per
    # method (chi2 = 162.5, dof = 200, p = 0.976) and exact greedy-sequence agreement"
    "chi2": 162.5, "chi2_dof": 200, "chi2_p": 0.976, "chi2_tokens_per_method": 9200,
}
# Source: the BudgetDraft seed abstract (shared/seeds/000_*): "up to 6.55x, 4.46x, and 2.10x
# end-to-end speedup vs AR at 4K, 8K, and 16K context lengths" (a 68M drafter and a 7B YaRN-Llama
# verifier on an A100, greedy; the design memo, shared/design/sparse-kv.md).
BUDGETDRAFT_SPEEDUPS = {"FourK": 6.55, "EightK": 4.46, "SixteenK": 2.10}
BUDGETDRAFT_SETUP = {"Contexts": "4K, 8K and 16K", "Drafter": "68M", "Verifier": "7B",
                     "Gpu": "A100"}

# Source: the ASPIRE seed abstract (shared/seeds/000_*): "ASPIRE achieves 1.70-4.58x speedup in
# decoding throughput over autoregressive baselines and improves average speedup by
# approximately 27% over the strongest prior self-speculative baselines".
ASPIRE_CLAIMS = {"Low": 1.70, "High": 4.58, "OverSyncPercent": 27}

# Public reports of quantized verification on Apple silicon, quoted as what a Mac run would be
# expected to show: llama.cpp on an M3 Max with Q4_0 "processes 1 token at 63.6 t/s but 2 tokens
# at 25.9 t/s" (ggml-org/llama.cpp#4624), and MLX's 4-bit quantized_matmul "costs 6.1x its
# one-row time at 8 rows while bf16 stays at 2x" (ml-explore/mlx#4265).
METAL_REPORTS = {"LlamaOneToken": 63.6, "LlamaTwoTokens": 25.9, "LlamaIssue": 4624,
                 "LlamaSetup": "a Q4\\_0 model on an M3 Max", "MlxEightRows": 6.1,
                 "MlxBfSixteen": 2.0, "MlxIssue": 4265, "MlxSetup": "4-bit matrix product"}


def speculative_claims() -> dict[str, str]:
    """The seed's reported values (SEED_CLAIMS): the text labels them as the seed's."""
    s = SEED_CLAIMS
    return {
        "SeedSpeedup": plain(s["speedup"]), "SeedBestK": str(s["best_k"]),
        "SeedFirstK": str(s["first_k"]),
        "SeedAccFirstK": f"{plain(s['acceptance_first_k_percent'])}\\%",
        "SeedAccBestK": f"{plain(s['acceptance_best_k_percent'])}\\%",
        "SeedNumConfigs": str(s["configurations"]), "SeedNumSlower": str(s["decelerating"]),
    }


def verification_claims() -> dict[str, str]:
    """The seed's reported level-3 values (SEED_CLAIMS): the text labels them as the seed's."""
    s = SEED_CLAIMS
    return {"SeedChi": plain(s["chi2"]), "SeedChiDof": str(s["chi2_dof"]),
            "SeedChiP": plain(s["chi2_p"]),
            "SeedChiTokens": f"{s['chi2_tokens_per_method']:,}"}


def long_claims() -> dict[str, str]:
    """BudgetDraft's reported speedups (BUDGETDRAFT_SPEEDUPS): the text labels them as its."""
    return {**{f"SeedBudgetDraft{k}": f"{v:.2f}" for k, v in BUDGETDRAFT_SPEEDUPS.items()},
            **{f"SeedBudgetDraft{k}": v for k, v in BUDGETDRAFT_SETUP.items()}}


def batched_claims() -> dict[str, str]:
    """ASPIRE's reported values (ASPIRE_CLAIMS): the text labels them as its."""
    c = ASPIRE_CLAIMS
    return {"SeedAspireLow": f"{c['Low']:.2f}", "SeedAspireHigh": f"{c['High']:.2f}",
            "SeedAspireOverSyncPercent": str(c["OverSyncPercent"])}


def quantized_claims() -> dict[str, str]:
    """Public Metal reports (METAL_REPORTS): the text labels them as others' measurements."""
    r = METAL_REPORTS
    return {"MetalLlamaOneToken": plain(r["LlamaOneToken"]),
            "MetalLlamaTwoTokens": plain(r["LlamaTwoTokens"]),
            "MetalLlamaIssue": f"ggml-org/llama.cpp\\#{r['LlamaIssue']}",
            "MetalMlxEightRows": plain(r["MlxEightRows"]),
            "MetalMlxBfSixteen": plain(r["MlxBfSixteen"]),
            "MetalMlxIssue": f"ml-explore/mlx\\#{r['MlxIssue']}",
            "MetalLlamaSetup": r["LlamaSetup"], "MetalMlxSetup": r["MlxSetup"]}
