"""This run against committed reference runs (`results/reference/<name>/stats/`), as ratios.

Each side is reduced to key numbers, one row per quantity and configuration:

    decode_s        median decode latency (all steps, cache on, sweep) per backend, model,
                    dtype, prompt length and budget
    kv_speedup      KV-cache speedup on total latency, same keys
    spikes          budgets the regime rule flagged on total latency (cache-on sweep) per
                    backend, model, dtype
    max_ratio       the largest ratio to the local trend there
    step_ups        cache-on sweep runs that step up part-way through (`onsets`) per backend,
                    model, dtype
    spec_speedup    best speculative speedup over K per pair and mode (each side at its own K),
                    with spec_c, spec_alpha and spec_fit (measured over Leviathan's prediction)
                    there
    spec_selected   the best pair, mode and K chosen on half of the prompts and its speedup
                    estimated on the other half (`selection`), with spec_selected_low/_high,
                    its interval
    acceptance      acceptance per pair, mode and K
    parallelism     the target's forward time on K+1 tokens over one token per backend,
                    model, context and K
    hf_ratio        HF assisted generation's time over our speculative decoding's, per pair
                    and K
    chi2            the level-3 two-sample chi-square of the correct rule per pair
    chi2_p          its p-value per pair and acceptance rule (the correct one and the two
                    wrong ones it must reject); log_ratio_p the same for the log-ratio test
    long_speedup    the long-context study's speedup over the target alone per backend,
                    drafter, policy, KV budget, context length, mode and K, with
                    long_speedup_low/_high, its interval; long_alpha (per-token acceptance)
                    likewise
    quant_*         the quantized study (llama.cpp): quant_verify_cost, the target's time on K+1
                    tokens over one per GGUF backend, model, context and K, and
                    quant_verify_stable (1 or 0); quant_speedup per pair, mode and K with
                    quant_speedup_low/_high, its interval, and in greedy mode quant_agree,
                    quant_diverged, quant_first_divergence and quant_min_margin

A reference's sub-study directories (`results/reference/<name>/<study>/stats/`, such as
cuda-h200/long) are references of their own, named `<name>/<study>`.

Speculative rows also carry the trained models' names and sizes. Rows match only on identical
keys; the ratio is local / reference. A configuration that only one side has is kept with status
'only local' or 'only reference' and no ratio: a CPU run is not divided by a CUDA reference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from decodelab.analysis.selection import spec_key
from decodelab.core import tables
from decodelab.core.io import as_bool

SWEEP_KEYS = ["backend", "model", "dtype", "prompt_len", "budget"]
LONG_KEYS = ["backend", "drafter", "policy", "kv_budget", "length", "mode", "k"]
KEYS = ["quantity", "backend", "model", "dtype", "prompt_len", "budget", "pair", "models", "mode",
        "k", "sampler", "drafter", "policy", "kv_budget", "length"]
TEXT_KEYS = ("backend", "model", "dtype", "pair", "models", "mode", "sampler", "drafter",
             "policy")
NUMERIC_KEYS = ("prompt_len", "budget", "k", "kv_budget", "length")
COLUMNS = ["reference", *KEYS, "local", "reference_value", "ratio", "status",
           "local_device", "reference_device"]
QUANTITIES = {"decode_s": "median decode latency (s)", "kv_speedup": "KV-cache speedup",
              "spikes": "spikes flagged", "max_ratio": "largest ratio to the local trend",
              "spec_speedup": "best speculative speedup", "acceptance": "acceptance",
              "parallelism": "verification parallelism (K+1 tokens over 1)",
              "hf_ratio": "speed against HF assisted generation",
              "chi2": "two-sample chi-square (correct rule)", "chi2_p": "chi-square p-value",
              "log_ratio_p": "log-ratio t-test p-value",
              "step_ups": "cache-on runs stepping up mid-decode",
              "spec_selected": "best speculative speedup, chosen on half of the runs",
              "spec_selected_low": "its interval, lower end",
              "spec_selected_high": "its interval, upper end",
              "long_speedup": "long-context speedup", "long_speedup_low": "its interval, lower end",
              "long_speedup_high": "its interval, upper end",
              "long_alpha": "long-context per-token acceptance",
              "long_alpha_low": "its interval, lower end",
              "long_alpha_high": "its interval, upper end",
              "quant_verify_cost": "quantized verify cost (K+1 tokens over 1)",
              "quant_verify_stable": "quantized verify cost stable (1) or not (0)",
              "quant_speedup": "quantized pair's speedup", "quant_speedup_low":
              "its interval, lower end", "quant_speedup_high": "its interval, upper end",
              "quant_agree": "greedy sequences equal to the quantized target's own",
              "quant_diverged": "greedy sequences that diverged",
              "quant_first_divergence": "earliest divergence (position)",
              "quant_min_margin": "smallest top-2 logit margin there",
              "spec_c": "draft step over target step at the best K",
              "spec_alpha": "per-token acceptance at the best K",
              "spec_fit": "measured over predicted speedup at the best K"}
# speculative_theory at a pair and mode's best K -> {its column: quantity}
THEORY = {"cost_ratio": "spec_c", "alpha": "spec_alpha", "fit": "spec_fit"}
SELECTED = {"estimate": "spec_selected", "ci_low": "spec_selected_low",
            "ci_high": "spec_selected_high"}
NO_RATIO = {"chi2_p", "log_ratio_p"}
# long-context table -> {its column: quantity}
LONG = {"long_speedup": {"speedup": "long_speedup", "ci_low": "long_speedup_low",
                         "ci_high": "long_speedup_high"},
        "long_acceptance": {"alpha": "long_alpha", "ci_low": "long_alpha_low",
                            "ci_high": "long_alpha_high"}}
# quantized table -> (its keys, {its column: quantity})
QUANTIZED = {"quantized_verify_cost": (["backend", "model", "prompt_len", "k"],
                                       {"ratio": "quant_verify_cost",
                                        "stable": "quant_verify_stable"}),
             "quantized_speculative": (["pair", "mode", "k"],
                                       {"speedup": "quant_speedup", "ci_low": "quant_speedup_low",
                                        "ci_high": "quant_speedup_high", "agree": "quant_agree",
                                        "diverged": "quant_diverged",
                                        "first_divergence": "quant_first_divergence",
                                        "min_margin": "quant_min_margin"})}
LEVEL3_CHECKS = {"chi2_p": "chi-square", "log_ratio_p": "log-ratio"}


def read(stats_dir: Path, name: str) -> pd.DataFrame:
    """A declared table as written, no rows when absent or empty (a reference may predate it)."""
    try:
        return pd.read_csv(tables.path(stats_dir, name))
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame()


def frame(rows: pd.DataFrame, quantity: str, value: str) -> pd.DataFrame:
    out = rows.assign(quantity=quantity).rename(columns={value: "value"})
    for key in KEYS:
        if key not in out:
            out[key] = "" if key in TEXT_KEYS else -1
    out = out[[*KEYS, "value"]].copy()
    for key in NUMERIC_KEYS:
        out[key] = pd.to_numeric(out[key]).fillna(-1).astype(int)
    for key in TEXT_KEYS:
        out[key] = out[key].fillna("").astype(str)
    return out


def trained_models(stats_dir: Path) -> str:
    """The trained models' names and sizes: speculative rows match only between runs of the same
    pair of models (a tiny CPU pair is not a GPU-sized one of the same name)."""
    models = read(stats_dir, "models")
    if not len(models) or "source" not in models:
        return ""
    trained = models[models["source"] == "train"]
    return ",".join(f"{m}:{p}" for m, p in sorted(zip(trained["model"], trained["parameters"],
                                                        strict=True)))


def key_numbers(stats_dir: Path) -> pd.DataFrame:
    """One row per quantity and configuration: KEYS + value."""
    parts = []
    pair_models = trained_models(stats_dir)
    latency = read(stats_dir, "latency")
    if len(latency):
        on = latency[(latency["experiment"] == "sweep") & as_bool(latency["use_cache"])
                     & (latency["metric"] == "decode_s")]
        parts.append(frame(on[SWEEP_KEYS + ["median"]], "decode_s", "median"))
    kv = read(stats_dir, "kv_speedup")
    if len(kv):
        parts.append(frame(kv[kv["metric"] == "total_s"][SWEEP_KEYS + ["speedup"]],
                           "kv_speedup", "speedup"))
    regimes = read(stats_dir, "regimes")
    if len(regimes):
        on = regimes[(regimes["experiment"] == "sweep") & as_bool(regimes["use_cache"])
                     & (regimes["metric"] == "total_s")]  # the rule's metric; phases apart
        verdict = on.groupby(["backend", "model", "dtype", "prompt_len"]).agg(
            spikes=("spike", lambda s: int(as_bool(s).sum())), max_ratio=("ratio_median", "max"))
        verdict = verdict.reset_index()
        parts += [frame(verdict[SWEEP_KEYS[:-1] + [q]], q, q) for q in ("spikes", "max_ratio")]
    onsets = read(stats_dir, "regime_onsets")
    if len(onsets):
        on = onsets[onsets["experiment"] == "sweep"]
        ups = on.assign(step_ups=on["onset"] >= 0).groupby(SWEEP_KEYS[:-1])["step_ups"].sum()
        parts.append(frame(ups.reset_index(), "step_ups", "step_ups"))
    speedup = read(stats_dir, "speculative_speedup")
    if len(speedup):
        best = speedup.loc[speedup.groupby(["pair", "mode"])["speedup"].idxmax()]
        parts.append(frame(best[["pair", "mode", "speedup"]].assign(models=pair_models),
                           "spec_speedup", "speedup"))
        parts += theory_at_best(read(stats_dir, "speculative_theory"), best, pair_models)
    parts += selected_spec(stats_dir)
    acceptance = read(stats_dir, "speculative_acceptance")
    if len(acceptance):
        # accepted / proposed; older tables name it `acceptance`
        acceptance = acceptance.rename(columns={"acceptance": "proposal_acceptance"})
        parts.append(frame(acceptance[["pair", "mode", "k", "proposal_acceptance"]]
                           .assign(models=pair_models), "acceptance", "proposal_acceptance"))
    parallelism = read(stats_dir, "speculative_parallelism")
    if len(parallelism):
        rows = parallelism.rename(columns={"context": "prompt_len"})
        parts.append(frame(rows[["backend", "model", "prompt_len", "k", "ratio"]]
                           .assign(models=pair_models), "parallelism", "ratio"))
    hf = read(stats_dir, "speculative_hf")
    if len(hf):
        hf = hf.dropna(subset=["ours_over_hf"])
        parts.append(frame(hf[["pair", "k", "ours_over_hf"]].assign(models=pair_models),
                           "hf_ratio", "ours_over_hf"))
    levels = read(stats_dir, "verification_levels")
    if len(levels):
        three = levels[levels["level"] == 3]
        chi = three[(three["sampler"] == "correct")
                    & three["check"].astype(str).str.contains("chi-square")]
        parts.append(frame(chi[["pair", "statistic"]].assign(models=pair_models), "chi2",
                           "statistic"))
        for quantity, check in LEVEL3_CHECKS.items():
            rows = three[three["check"].astype(str).str.contains(check)]
            parts.append(frame(rows[["pair", "sampler", "p_value"]].assign(models=pair_models),
                               quantity, "p_value"))
    parts += long_numbers(stats_dir, pair_models)
    parts += quantized_numbers(stats_dir, pair_models)
    if not parts:
        return pd.DataFrame(columns=[*KEYS, "value"])
    return pd.concat(parts, ignore_index=True)


def theory_at_best(theory: pd.DataFrame, best: pd.DataFrame, models: str
                   ) -> list[pd.DataFrame]:
    """c, alpha and measured over predicted at each pair and mode's best K (`THEORY`)."""
    if not len(theory):
        return []
    rows = best[["pair", "mode", "k"]].merge(theory, on=["pair", "mode", "k"])
    rows = rows.assign(fit=rows["measured"] / rows["predicted"], models=models)
    return [frame(rows[["pair", "mode", "models", column]], quantity, column)
            for column, quantity in THEORY.items()]


def long_numbers(stats_dir: Path, models: str) -> list[pd.DataFrame]:
    """The long-context study's speedups and acceptances with their intervals (`LONG`), keyed
    by LONG_KEYS and the trained models."""
    parts = []
    for name, columns in LONG.items():
        rows = read(stats_dir, name)
        if len(rows):
            parts += [frame(rows[[*LONG_KEYS, column]].assign(models=models), quantity, column)
                      for column, quantity in columns.items()]
    return parts


def quantized_numbers(stats_dir: Path, models: str) -> list[pd.DataFrame]:
    """The quantized study's verify costs and pair speedups (`QUANTIZED`); rows without a value
    (sampled mode has no greedy agreement) are left out."""
    parts = []
    for name, (keys, columns) in QUANTIZED.items():
        rows = read(stats_dir, name).rename(columns={"context": "prompt_len"})
        if not len(rows):
            continue
        if "stable" in rows:
            rows["stable"] = as_bool(rows["stable"]).astype(float)
        for column, quantity in columns.items():
            values = rows[[*keys, column]].dropna(subset=[column]).assign(models=models)
            parts.append(frame(values, quantity, column))
    return parts


def selected_spec(stats_dir: Path) -> list[pd.DataFrame]:
    """The speculative best of `selection` (chosen on one half, estimated on the other) as the
    quantities of SELECTED, keyed by its pair, mode and K; none where it was not estimated."""
    selection = read(stats_dir, "selection")
    if not len(selection):
        return []
    best = selection[(selection["claim"] == "speculative_best") & selection["estimate"].notna()]
    if not len(best):
        return []
    pair, mode, k = spec_key(best["label"].iloc[0])
    row = best.iloc[[0]].assign(pair=pair, mode=mode, k=k, models=trained_models(stats_dir))
    return [frame(row[["pair", "mode", "k", "models", column]], quantity, column)
            for column, quantity in SELECTED.items()]


def devices(stats_dir: Path) -> dict[str, str]:
    env = read(stats_dir, "environment")
    if not len(env):
        return {}
    return dict(zip(env["backend"].astype(str), env["device_name"].astype(str), strict=True))


def pair_backends(pair: str) -> list[str]:
    """[draft device, target device] of a pair named `<draft>-<target>` or
    `<target model>.<draft>-<target>` (the model's name may hold '-' and '.': gpt2-xl, opt-1.3b)."""
    return pair.rsplit(".", 1)[-1].split("-")


def row_device(row: pd.Series, by_backend: dict[str, str]) -> str:
    """The device of a row's backend (a llama.cpp backend `llama.cpp-<type>-<device>` by its
    device), or of both devices of its pair."""
    backends = [row["backend"]] if row["backend"] else pair_backends(str(row["pair"]))
    found = (by_backend.get(b) or by_backend.get(b.rsplit("-", 1)[-1], "") for b in backends if b)
    return " / ".join(dict.fromkeys(d for d in found if d))


def compare_one(local: pd.DataFrame, ref: pd.DataFrame, name: str, local_dev: dict[str, str],
                ref_dev: dict[str, str]) -> pd.DataFrame:
    """Outer join on KEYS; a ratio only where both sides have the configuration."""
    both = local.merge(ref, on=KEYS, how="outer", suffixes=("", "_ref"), indicator=True)
    both = both.rename(columns={"value": "local", "value_ref": "reference_value"})
    both["status"] = both["_merge"].map({"both": "matched", "left_only": "only local",
                                         "right_only": "only reference"}).astype(str)
    has_ratio = (both["status"] == "matched") & ~both["quantity"].isin(NO_RATIO)
    with np.errstate(divide="ignore", invalid="ignore"):
        both["ratio"] = np.where(has_ratio, both["local"] / both["reference_value"], np.nan)
    both["reference"] = name
    status = both["status"]
    both["local_device"] = [row_device(r, local_dev) if s != "only reference" else ""
                            for (_, r), s in zip(both.iterrows(), status, strict=True)]
    both["reference_device"] = [row_device(r, ref_dev) if s != "only local" else ""
                                for (_, r), s in zip(both.iterrows(), status, strict=True)]
    return both[COLUMNS]


def reference_dirs(root: Path) -> dict[str, Path]:
    """name -> stats dir of every results/reference/<name>/stats/ that exists, and of every
    sub-study's, results/reference/<name>/<study>/stats/ (named `<name>/<study>`)."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {p.parent.relative_to(root).as_posix(): p for p in sorted(root.glob("**/stats"))
            if p.is_dir()}


def own_quantities(local: pd.DataFrame, ref: pd.DataFrame) -> pd.DataFrame:
    """The local rows of the quantities a sub-study measured: it is compared on its own."""
    return local[local["quantity"].isin(set(ref["quantity"]))]


def reference_devices(name: str, references: dict[str, Path]) -> dict[str, str]:
    """A reference's devices; a sub-study without an environment table (`<name>/<study>`) ran
    on its reference's machine and takes its devices."""
    own = devices(references[name])
    parent = references.get(name.split("/")[0])
    return own or (devices(parent) if parent is not None else {})


def compare(local_stats: Path, references: dict[str, Path]) -> pd.DataFrame:
    """Every reference with key numbers against the local run (a sub-study's tables may hold
    none: batched speculation has no quantity here), a sub-study on its own quantities only;
    no references -> a header-only table."""
    local = key_numbers(local_stats)
    local_dev = devices(local_stats)
    numbers = {name: key_numbers(stats) for name, stats in references.items()}
    parts = [compare_one(own_quantities(local, numbers[name]) if "/" in name else local,
                         numbers[name], name, local_dev, reference_devices(name, references))
             for name in references if len(numbers[name])]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(parts, ignore_index=True)


def measured(comparison: pd.DataFrame, columns: dict[str, str], keys: list[str],
             reference: str | None = None) -> pd.DataFrame:
    """What one reference measured of `columns`' quantities (quantity -> column name): one row
    per configuration (`keys`), with reference and reference_device; `reference`'s rows, else
    those of the first reference that has any. None: an empty frame with those columns."""
    index = ["reference", "reference_device", *keys]
    empty = pd.DataFrame(columns=[*index, *columns.values()])
    comparison = comparison.reindex(columns=COLUMNS)  # a table from before some keys
    rows = comparison[comparison["quantity"].isin(columns)
                      & (comparison["status"] != "only local")]
    if reference is None and len(rows):
        reference = rows["reference"].iloc[0]
    rows = rows[rows["reference"] == reference]
    if not len(rows):
        return empty
    rows = rows.assign(**{k: rows[k].fillna("") for k in index
                          if not pd.api.types.is_numeric_dtype(rows[k])})
    wide = rows.pivot_table(index=index, columns="quantity", values="reference_value",
                            aggfunc="first").reset_index()
    return wide.rename(columns=columns).reindex(columns=empty.columns)


def subject(row: pd.Series) -> str:
    """backend/model for a sweep row, pair[/mode][/sampler] for a speculative one."""
    def given(col: str) -> bool:  # a key read back from CSV is NaN where it was ""
        return pd.notna(row.get(col)) and str(row.get(col)) != ""

    cols = ("backend", "model") if given("backend") else ("pair", "mode", "sampler")
    return "/".join(str(row[c]) for c in cols if given(c))


def summary(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per reference, quantity and backend/model or pair/mode: matched rows, the medians of each
    side and the median of the ratios; unmatched groups keep their status and no ratio."""
    if not len(comparison):
        return pd.DataFrame(columns=["reference", "quantity", "subject", "status", "n",
                                     "local", "reference_value", "reference_min",
                                     "reference_max", "ratio", "ratio_min", "ratio_max",
                                     "local_device", "reference_device"])
    df = comparison.copy()
    df["subject"] = df.apply(subject, axis=1)
    rows = []
    order = {q: i for i, q in enumerate(QUANTITIES)}
    for (ref, quantity, name, status), g in df.groupby(
            ["reference", "quantity", "subject", "status"], sort=False):
        rows.append({"reference": ref, "quantity": quantity, "subject": name,
                     "status": status, "n": len(g), "local": g["local"].median(),
                     "reference_value": g["reference_value"].median(),
                     "reference_min": g["reference_value"].min(),
                     "reference_max": g["reference_value"].max(),
                     "ratio": g["ratio"].median(), "ratio_min": g["ratio"].min(),
                     "ratio_max": g["ratio"].max(),
                     "local_device": next((d for d in g["local_device"] if d), ""),
                     "reference_device": next((d for d in g["reference_device"] if d), "")})
    out = pd.DataFrame(rows)
    out["_q"] = out["quantity"].map(order)
    return out.sort_values(["reference", "_q", "status", "subject"]).drop(columns="_q") \
        .reset_index(drop=True)
