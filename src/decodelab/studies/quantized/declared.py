"""The quantized study's declarations.

What the registry (`decodelab.studies`) reads of this study: its tables, where it stands in the
paper, its paper sections and the figures the paper reads."""

from __future__ import annotations

from decodelab.core.tables import CI, REASON, STABLE, Table

ORDER = 30
SECTIONS = ("paper",)
FIGURES = ("quantized",)


TABLES = (
    Table("quantized_verify_cost", "quantized", "quantized_stats", "Quantized",
          numeric=("context", "k", "ratio", *CI, "n", "extra_per_token"), flags=STABLE,
          text=("backend", "quantization", "device", "model", *REASON), optional=True),
    Table("quantized_speculative", "quantized", "quantized_stats", "Quantized",
          numeric=("k", "speedup", *CI, "agree", "sequences", "diverged", "first_divergence",
                   "min_margin"),
          text=("pair", "target_backend", "target_quant", "draft_backend", "draft_quant",
                "mode"), optional=True),
    Table("quantized_peer", "quantized", "quantized_stats", "Quantized",
          numeric=("k", "peer_speedup", *CI, "n", "peer_acceptance", "peer_tokens_per_s",
                   "peer_autoregressive_tokens_per_s", "decodelab_speedup",
                   "decodelab_proposal_acceptance"),
          text=("pair", "mode"), optional=True),
)
