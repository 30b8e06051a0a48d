"""The batched study's declarations.

What the registry (`decodelab.studies`) reads of this study: its tables, where it stands in the
paper, its paper sections and the figures the paper reads."""

from __future__ import annotations

from decodelab.core.tables import CI, Table

ORDER = 50
SECTIONS = ("paper",)
FIGURES = ("batched_speedup", "batched_overhead")


BATCHED_KEYS = ("batch", "context", "k")


def batched(key: str, numeric: tuple[str, ...], text: tuple[str, ...] = ()) -> Table:
    """A batched-speculation table, per backend, batch size and context."""
    return Table(f"batched_{key}", "batched", "batched_stats", "Batched speculation",
                 numeric=(*BATCHED_KEYS, *numeric), text=("backend", *text), optional=True)


TABLES = (
    # per backend, batch size and context
    batched("throughput", ("tokens_per_s", "speedup", *CI, "over_synchronized", "sync_ci_low",
                           "sync_ci_high", "over_unsynchronized", "unsync_ci_low",
                           "unsync_ci_high", "acceptance", "refresh_layer", "n"),
            text=("mode",)),
    batched("costs", ("forward_s", "verify_s", "verify_tokens", "measured_overhead", "t_draft",
                      "t_verify", "overhead", "ceiling")),
    batched("simulator", ("gain", *CI, "best_fixed_k", "adaptive_tokens_per_s",
                          "fixed_tokens_per_s", "fixed_over_autoregressive", "seeds"),
            text=("scenario",)),
)
