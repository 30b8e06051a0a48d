"""The latency study's declarations: latency, KV speedup and spike tables, and the regimes in depth.

What the registry (`decodelab.studies`) reads of this study: its tables, where it stands in the
paper, its paper sections and the figures the paper reads."""

from __future__ import annotations

from decodelab.core.tables import CI, REASON, STABLE, SWEEP_KEYS, Table

ORDER = 10
SECTIONS = ("paper", "paper_depth")
FIGURES = ("latency", "kv_speedup", "regime_depth", "changepoints")


def regime_depth(key: str, flags: tuple[str, ...] = ("use_cache",)) -> Table:
    return Table(f"regime_{key}", "regime_depth", "regime_depth", "Decode regimes", flags=flags)


TABLES = (
    Table("latency", "latency", "statistics", "Decode regimes",
          numeric=("prompt_len", "budget", "median", *CI, "n"), flags=("use_cache", *STABLE),
          text=REASON, required=(*SWEEP_KEYS, "median", *CI, "n")),
    Table("kv_speedup", "latency", "statistics", "KV cache",
          numeric=("prompt_len", "budget", "speedup", *CI, "n"), flags=STABLE, text=REASON,
          required=("backend", "model", "family", "dtype", "prompt_len", "budget", "metric",
                    "speedup", *CI)),
    Table("regimes", "regimes", "regimes", "Decode regimes",
          numeric=("prompt_len", "budget", "value_median", "trend_median", "ratio_median",
                   "ratio_min", "frac_above", "p_value", "n_repeats"),
          flags=("use_cache", "spike", *STABLE), text=REASON,
          required=(*SWEEP_KEYS, "ratio_median", "spike")),
    regime_depth("summary"),
    regime_depth("phases"),
    regime_depth("variance"),
    regime_depth("variance_summary"),
    regime_depth("memory", flags=()),
    regime_depth("changepoints", flags=("use_cache", "changepoint", "spike")),
    regime_depth("changepoint_curves"),
    regime_depth("agreement"),
    regime_depth("kv_collapse", flags=()),
    regime_depth("onsets", flags=STABLE),
)
