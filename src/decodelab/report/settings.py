"""The settings the DAG ran with (the `settings` rule's JSON): the protocol's macros and
generated/tab_settings.tex. Every other section reads its settings through here."""

from __future__ import annotations

from pathlib import Path

from decodelab.report.section import Section
from decodelab.report.tex import (
    NONE,
    budget_list,
    human_list,
    integer,
    keyvalue,
    label,
    percent,
    plain,
    tex_escape,
    tt,
)

PARALLEL_K = 8            # the text quotes verification parallelism at this K (or the largest
                          # K below it that was measured), here and in the references


def init_models(settings: dict) -> list[str]:
    return [m for m, spec in settings.get("models", {}).items() if spec.get("source") == "init"]


def dtype_names(settings: dict) -> list[str]:
    dtype = settings.get("dtype", NONE)
    return [dtype] if isinstance(dtype, str) else list(dtype)


def confidence(settings: dict) -> str:
    """The confidence level of every interval, as a percentage: 95\\%."""
    return percent(settings.get("stats", {}).get("confidence"), plain)


def spec_settings(settings: dict) -> dict:
    return settings.get("speculative") or {}


def requested_pairs(settings: dict) -> dict[str, dict]:
    return dict(spec_settings(settings).get("pairs") or {})


def settings_macros(settings: dict) -> dict[str, str]:
    budgets = sorted(int(b) for b in settings.get("budgets", []))
    prompts = sorted(int(p) for p in settings.get("prompt_lengths", []))
    models = settings.get("models", {})
    regimes, stats = settings.get("regimes", {}), settings.get("stats", {})
    consistency = float(regimes.get("consistency", float("nan")))
    return {
        "HostName": tex_escape(settings.get("host", NONE)),
        "BackendsRequested": human_list([label(b) for b in settings.get("backends", [])]),
        "NumBackendsRequested": str(len(settings.get("backends", []))),
        "NumModels": str(len(models)),
        "NumInitModels": str(len(init_models(settings))),
        "ModelNames": human_list([f"\\texttt{{{tex_escape(m)}}}" for m in models]),
        "Dtype": human_list([f"\\texttt{{{tex_escape(d)}}}" for d in dtype_names(settings)]),
        "PromptLengths": human_list([str(p) for p in prompts], empty=NONE),
        "Budgets": budget_list(budgets),
        "BudgetMin": str(budgets[0]) if budgets else NONE,
        "BudgetMax": str(budgets[-1]) if budgets else NONE,
        "NumBudgets": str(len(budgets)),
        "Repeats": str(settings.get("repeats", NONE)),
        "InnerRepeats": str(settings.get("inner_repeats", NONE)),
        "Warmup": str(settings.get("warmup", NONE)),
        "ShuffleSeed": str(settings.get("shuffle_seed", NONE)),
        "RegimeWindow": str(regimes.get("window", NONE)),
        "RegimeThreshold": plain(regimes.get("threshold")),
        "RegimeConsistency": (percent(consistency, plain) if consistency <= 1
                              else plain(consistency)),
        "RegimeAlpha": plain(regimes.get("alpha")),
        "RegimeMetric": f"\\texttt{{{tex_escape(regimes.get('metric', 'total_s'))}}}",
        "Confidence": confidence(settings),
        "BootstrapResamples": integer(stats.get("bootstrap_resamples")),
        "StatsSeed": str(stats.get("seed", NONE)),
    }


def spec_settings_macros(settings: dict) -> dict[str, str]:
    """The speculative stage's settings (the speculative section quotes them)."""
    spec = spec_settings(settings)
    par = spec.get("parallelism") or {}
    ks = sorted(int(k) for k in spec.get("ks", []))
    par_ks = sorted(int(k) for k in par.get("ks", []))
    return {
        "SpecKs": budget_list(ks),
        "SpecModes": human_list(list(spec.get("modes", [])), empty=NONE),
        "SpecTemperature": plain(spec.get("temperature")),
        "SpecTopK": "off" if spec.get("top_k") in (None, 0) else str(spec["top_k"]),
        "SpecTopP": "off" if spec.get("top_p") in (None, 1, 1.0) else plain(spec["top_p"]),
        "SpecPrompts": str(spec.get("prompts", NONE)),
        "SpecPromptLen": str(spec.get("prompt_len", NONE)),
        "SpecBudget": str(spec.get("budget", NONE)),
        "SpecRepeats": str(spec.get("repeats", NONE)),
        "SpecParallelKs": budget_list(par_ks),
        "SpecParallelContext": str(par.get("context", NONE)),
        "SpecParallelInner": str(par.get("inner", NONE)),
        "SpecParallelKRef": str(PARALLEL_K),
    }


# -----------------------------------------------------------------------------
# the protocol table

def model_spec(spec: dict) -> str:
    parts = [tex_escape(spec.get("source", "?"))]
    parts += [f"{tex_escape(k)} \\texttt{{{tex_escape(v, breakable=True)}}}"
              for k, v in spec.items() if k != "source"]
    return "; ".join(parts)


def spec_settings_rows(settings: dict, m: dict[str, str]) -> list:
    spec = spec_settings(settings)
    if not spec:
        return []
    pairs = [(f"Speculative pair {tt(name)}",
              f"draft {tt(p.get('draft', '?'))} on {label(p.get('draft_device', '?'))}, "
              f"target {tt(p.get('target', '?'))} on {label(p.get('target_device', '?'))}"
              + (f", {tt(p['dtype'])}" if p.get("dtype") else ""))
             for name, p in requested_pairs(settings).items()]
    return [
        None,
        *pairs,
        ("Draft lengths $K$", m["SpecKs"]),
        ("Modes", m["SpecModes"]),
        ("Temperature / top-$k$ / top-$p$",
         f"{m['SpecTemperature']} / {m['SpecTopK']} / {m['SpecTopP']}"),
        ("Prompts $\\times$ tokens, budget", f"{m['SpecPrompts']} $\\times$ {m['SpecPromptLen']}, "
                                              f"{m['SpecBudget']} tokens"),
        ("Speculative processes", m["SpecRepeats"]),
        ("HF assisted peer", "yes" if spec.get("hf_assisted") else "no"),
        ("Parallelism $K$s / context / inner", f"{m['SpecParallelKs']} / "
                                               f"{m['SpecParallelContext']} / "
                                               f"{m['SpecParallelInner']}"),
    ]


def settings_table(settings: dict, m: dict[str, str]) -> str:
    """The protocol: the settings' macros `m` (with the speculative stage's) and the models."""
    rows = [("Host", m["HostName"]), ("Backends requested", m["BackendsRequested"]), None]
    rows += [(f"Model \\texttt{{{tex_escape(name)}}}", model_spec(spec))
             for name, spec in settings.get("models", {}).items()]
    rows += [
        ("Data type", m["Dtype"]),
        ("Prompt lengths (tokens)", m["PromptLengths"]),
        ("Decoding budgets (tokens)", m["Budgets"]),
        None,
        ("Processes per configuration", m["Repeats"]),
        ("Repeats inside a process", m["InnerRepeats"]),
        ("Warm-up runs per process", m["Warmup"]),
        ("Shuffle seed", m["ShuffleSeed"]),
        None,
        ("Regime metric", m["RegimeMetric"]),
        ("Regime window (budgets)", m["RegimeWindow"]),
        ("Regime threshold (ratio)", m["RegimeThreshold"]),
        ("Regime consistency (repeats)", m["RegimeConsistency"]),
        ("Regime test level", m["RegimeAlpha"]),
        None,
        ("Confidence level", m["Confidence"]),
        ("Bootstrap resamples", m["BootstrapResamples"]),
        ("Bootstrap seed", m["StatsSeed"]),
    ]
    return keyvalue(rows + spec_settings_rows(settings, m))


def parts(stats_dir: Path, settings: dict) -> Section:
    """Reads no table: everything here is the settings."""
    macros = settings_macros(settings)
    table = settings_table(settings, {**macros, **spec_settings_macros(settings)})
    return Section(macros, {"AnyInitWeights": bool(init_models(settings))},
                   {"tab_settings.tex": table})
