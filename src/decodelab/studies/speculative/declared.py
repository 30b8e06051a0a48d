"""The speculative study's declarations.

What the registry (`decodelab.studies`) reads of this study: its tables, where it stands in the
paper, its paper sections and the figures the paper reads."""

from __future__ import annotations

from decodelab.core.tables import CI, REASON, STABLE, Table

ORDER = 20
SECTIONS = ("paper", "pays")
FIGURES = ("acceptance", "speedup", "parallelism", "theory")


def speculative(key: str, numeric: tuple[str, ...], flags: tuple[str, ...] = (),
                text: tuple[str, ...] = ()) -> Table:
    return Table(f"speculative_{key}", "speculative", "speculative_stats", "Speculative",
                 numeric=numeric, flags=flags, text=text, optional=True)


TABLES = (
    # alpha: per-token acceptance (from tokens per call); proposal_acceptance: accepted/proposed
    speculative("acceptance", ("k", "alpha", *CI, "proposal_acceptance", "tokens_per_call", "n")),
    # speedup over the fair baseline (`baseline`), speedup_stepped over the per-step harness
    # prompt_ci_*: the interval over prompts (every process decodes the same ones)
    speculative("speedup", ("k", "speedup", *CI, "prompts", "prompt_ci_low", "prompt_ci_high",
                            "spec_s", "autoregressive_s", "n",
                            "overhead_share", "host_gap_share", "speedup_stepped", "stepped_ci_low",
                            "stepped_ci_high", "stepped_s"),
                flags=STABLE, text=(*REASON, "baseline")),
    speculative("theory", ("k", "alpha", "cost_ratio", "predicted", "measured", "verify_cost",
                          "predicted_verify", "draft_cost", "predicted_passes")),
    speculative("hf", ("k", "ours_s", "hf_s", "ours_over_hf", *CI, "agree_hf_assisted",
                       "agree_speculative")),
    speculative("parallelism", ("context", "k", "ratio", *CI, "n")),
    # a model's greedy step alone over its memory-bandwidth floor (weight bytes / copy bandwidth)
    speculative("floor", ("step_s", "weight_bytes", "bandwidth", "floor_s", "over_floor", "n"),
                text=("pair", "role", "model", "device", "engine")),
)
