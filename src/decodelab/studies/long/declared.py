"""The long-context study's declarations.

What the registry (`decodelab.studies`) reads of this study: its tables, where it stands in the
paper, its paper sections and the figures the paper reads."""

from __future__ import annotations

from decodelab.core.tables import CI, Table

ORDER = 40
SECTIONS = ("paper",)
FIGURES = ("long_acceptance", "long_speedup", "long_cost")


LONG_TEXT = ("target", "backend", "drafter", "policy")  # and the numbers length, kv_budget


def long(key: str, numeric: tuple[str, ...], per_mode: bool = True) -> Table:
    """A long-context table, per configuration (and per mode and K where `per_mode`)."""
    return Table(f"long_{key}", "long", "long_stats", "Long contexts",
                 numeric=("length", "kv_budget", *(("k",) if per_mode else ()), *numeric),
                 text=(*LONG_TEXT, *(("mode",) if per_mode else ())), optional=True)


TABLES = (
    # per L x KV budget x policy x drafter x mode x K, intervals over held-out documents
    long("acceptance", ("alpha", *CI, "proposal_acceptance", "proposal_ci_low",
                        "proposal_ci_high", "tokens_per_call", "n")),
    long("speedup", ("speedup", *CI, "spec_s", "autoregressive_s", "cost_ratio", "alpha",
                     "predicted", "n")),
    long("memory", ("draft_kv_bytes", "verifier_kv_bytes", "peak_bytes", "rss_bytes", "n"),
         per_mode=False),
)
