"""The latency study's declarations: latency, KV speedup and spike tables, and the regimes in depth.

What the registry (`decodelab.studies`) reads of this study: its tables, where it stands in the
paper, its paper sections and the figures the paper reads."""

from __future__ import annotations

from decodelab.core.tables import CI, REASON, STABLE, SWEEP_KEYS, Table

ORDER = 10
SECTIONS = ("paper", "paper_depth")
FIGURES = ("latency", "kv_speedup", "regime_depth", "changepoints")


GRID_NUMBERS = ("prompt_len", "budget")


def regime_depth(key: str, numeric: tuple[str, ...], flags: tuple[str, ...] = ("use_cache",)
                 ) -> Table:
    return Table(f"regime_{key}", "regime_depth", "regime_depth", "Decode regimes",
                 numeric=numeric, flags=flags)


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
    regime_depth("summary", ("configs", "spikes", "max_ratio", "max_ratio_budget")),
    regime_depth("phases", (*GRID_NUMBERS, "spikes", "n", "ratio_total", "ratio_prefill",
                            "ratio_decode", "decode_share", "statistic", "p_decode", "p_prefill")),
    regime_depth("variance", (*GRID_NUMBERS, "processes", "runs", "var_between", "var_within",
                              "share_between", "f_stat", "p_value")),
    regime_depth("variance_summary", ("configs", "separable", "share_pooled", "share_median",
                                      "share_q25", "share_q75", "significant", "alpha")),
    regime_depth("memory", ("configs", "rho", "p_value", "r2", "slope_per_gib",
                            "rho_given_budget", "p_given_budget"), flags=()),
    regime_depth("changepoints", (*GRID_NUMBERS, "signal", "segment"),
                 flags=("use_cache", "changepoint", "spike")),
    regime_depth("changepoint_curves", ("prompt_len", "sigma", "penalty", "changepoints")),
    regime_depth("agreement", ("curves", "changepoints", "curves_with_changepoint", "spikes",
                               "spikes_coinciding", "changepoints_at_spikes")),
    regime_depth("kv_collapse", (*GRID_NUMBERS, "spikes", "n", "ratio_total", "speedup",
                                 "speedup_trend", "speedup_ratio", "statistic", "p_value",
                                 "control_ratio"), flags=()),
    regime_depth("onsets", (*GRID_NUMBERS, "repeat", "inner", "steps", "onset", "step_up",
                            "launch_up", "launch_cpu_up"), flags=STABLE),
)
