"""The artifact-evaluation parts of the paper: hosts, the reference comparison, benchmarks.

    generated/tab_hosts.tex       every host whose results the paper merges, local or imported
    generated/tab_reference.tex   this run against each committed reference run, with ratios
    generated/tab_benchmarks.tex  wall time and peak memory per measuring rule and host
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.analysis.selection import spec_label
from decodelab.core import tables
from decodelab.report import reference as rf
from decodelab.report.section import Section
from decodelab.report.settings import PARALLEL_K
from decodelab.report.tex import (
    NONE,
    camel,
    human_list,
    integer,
    long_tabular,
    percent,
    pval,
    sig,
    tabular,
    tex_escape,
    tt,
)
from decodelab.studies.verification.paper import WRONG_SAMPLERS


def text(value) -> str:
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


# -----------------------------------------------------------------------------
# hosts

def hosts_macros(hosts: pd.DataFrame) -> tuple[dict[str, str], dict[str, bool]]:
    imported = hosts[hosts["role"] == "imported"] if len(hosts) else hosts
    return ({"NumHosts": str(len(hosts)),
             "HostNames": human_list([tt(h) for h in hosts["host"]]) if len(hosts) else NONE,
             "NumHostsImported": str(len(imported)),
             "HostsImported": human_list([tt(h) for h in imported.get("host", [])])},
            {"MultiHost": len(hosts) > 1})


def hosts_table(hosts: pd.DataFrame) -> str:
    rows = [[tt(r["host"]), tex_escape(r["role"]),
             tex_escape(text(r["backends"]).replace(" ", ", ")),
             tex_escape(text(r["devices"]), breakable=True),
             tex_escape(text(r["imported_at"]) or "--")] for _, r in hosts.iterrows()]
    header = [r"Host & Role & Backends & Devices & Imported at \\"]
    return tabular(r"@{}lllXl@{}", header, rows, "no host", tabularx=True)


# -----------------------------------------------------------------------------
# the reference comparison

def quantity_value(quantity: str, value) -> str:
    if value is None or pd.isna(value):
        return NONE
    if quantity == "decode_s":
        return sig(float(value) * 1e3)
    if quantity == "acceptance":
        return percent(value)
    if quantity in ("spikes", "step_ups"):
        return f"{float(value):g}"
    if quantity in rf.NO_RATIO:
        return pval(value)
    return sig(value)


QUANTITY_LABELS = {"decode_s": "decode (ms)", "kv_speedup": r"KV speedup",
                   "spikes": "spikes flagged", "max_ratio": "max ratio to trend", "spec_speedup":
                   "best spec.\\ speedup", "acceptance": "acceptance",
                   "parallelism": "verif.\\ parallelism", "hf_ratio": "speed vs.\\ HF assisted",
                   "chi2": r"$\chi^2$", "chi2_p": r"$\chi^2$ $p$", "log_ratio_p": "log-ratio $p$",
                   "step_ups": "runs stepping up", "long_speedup": "long-context speedup",
                   "long_alpha": "long-context alpha", "quant_verify_cost":
                   "quantized verify cost", "quant_verify_stable": "its verdict (1 stable)",
                   "quant_speedup": "quantized speedup", "quant_speedup_low": "its CI, low",
                   "quant_speedup_high": "its CI, high", "quant_agree": "greedy equal",
                   "quant_diverged": "greedy diverged", "quant_first_divergence":
                   "first divergence", "quant_min_margin": "its logit margin"}


def ratio_cell(r) -> str:
    if r["n"] > 1 and pd.notna(r["ratio_min"]) and r["ratio_min"] != r["ratio_max"]:
        return f"{sig(r['ratio'])} [{sig(r['ratio_min'])}, {sig(r['ratio_max'])}]"
    return sig(r["ratio"])


def ref_name(ref: str) -> str:
    """A reference's name that may wrap after '/' (default-cpu/quantized) in its narrow column."""
    return f"\\texttt{{{tex_escape(ref, breakable=True)}}}"


def row_head(ref: str, r: pd.Series) -> list[str]:
    """Reference, quantity, configuration and n: the cells every compared row starts with."""
    return [ref_name(ref), QUANTITY_LABELS.get(r["quantity"], tex_escape(r["quantity"])),
            tex_escape(r["subject"], breakable=True), str(int(r["n"]))]


def reference_rows(summary: pd.DataFrame) -> list:
    rows = []
    for ref, g in summary.groupby("reference", sort=False):
        if rows:
            rows.append(None)
        matched = g[g["status"] == "matched"]
        for _, r in matched.iterrows():
            rows.append([*row_head(ref, r), quantity_value(r["quantity"], r["local"]),
                         quantity_value(r["quantity"], r["reference_value"]), ratio_cell(r)])
        for _, r in g[g["status"] == "only reference"].iterrows():
            rows.append([*row_head(ref, r), NONE, reference_cell(r), r"\emph{not comparable}"])
        rest = g[g["status"] == "only local"]
        if len(rest):
            subjects = human_list(sorted({tex_escape(s) for s in rest["subject"]}))
            rows.append([ref_name(ref), f"\\multicolumn{{6}}{{p{{0.78\\linewidth}}}}{{\\emph{{not "
                         f"comparable, only in this run:}} {subjects}}}"])
    return rows


def reference_cell(r) -> str:
    """A reference-only group's median, with its range over budgets or K when it has one."""
    value = quantity_value(r["quantity"], r["reference_value"])
    if r["n"] > 1 and r["reference_min"] != r["reference_max"]:
        low, high = (quantity_value(r["quantity"], r[c]) for c in ("reference_min",
                                                                    "reference_max"))
        return f"{value} [{low}, {high}]"
    return value


def reference_table(summary: pd.DataFrame) -> str:
    header = [r"Reference & Quantity & Configu\-ration & $n$ & This run & Reference & "
              r"This / reference \\"]
    # a sub-study's name (default-cpu/quantized) wraps after its '/' rather than widen the table
    return long_tabular(r"@{}>{\raggedright\arraybackslash}p{0.13\linewidth}l"
                        r">{\raggedright\arraybackslash}Xrrrl@{}", header,
                        reference_rows(summary), "no reference run in results/reference/",
                        r"\caption{\RefTableCaption}\label{tab:reference}")


def reference_macros(comparison: pd.DataFrame) -> tuple[dict[str, str], dict[str, bool]]:
    names = list(dict.fromkeys(comparison["reference"])) if len(comparison) else []
    matched = comparison[comparison["status"] == "matched"] if len(comparison) else comparison
    none_matched = [n for n in names if not (matched["reference"] == n).any()]
    cuda = cuda_rows(comparison)
    return ({"NumReferences": str(len(names)),
             "ReferenceNames": human_list([tt(n) for n in names]),
             "RefNumMatched": str(len(matched)),
             "RefNumUnmatched": str(len(comparison) - len(matched)),
             "RefNotComparable": human_list([tt(n) for n in none_matched]),
             **cuda_reference_macros(comparison)},
            {"AnyReference": bool(names), "RefAnyMatched": len(matched) > 0,
             "RefAnyNotComparable": bool(none_matched),
             "RefAnyCuda": bool((cuda["backend"] == "cuda").any()),
             "RefAnyCudaSpec": bool((cuda["quantity"] == "spec_speedup").any()),
             "RefCudaSpecSelected": bool((cuda["quantity"] == "spec_selected").any()),
             "RefAnyCudaVerification": bool(cuda["quantity"].isin(rf.NO_RATIO).any())})


def cuda_rows(comparison: pd.DataFrame) -> pd.DataFrame:
    """The references' rows measured on CUDA: a CUDA backend, or a pair with a CUDA side."""
    comparison = comparison.reindex(columns=rf.COLUMNS)  # an older table may lack a key
    pair = comparison["pair"].fillna("").astype(str)
    on_cuda = (comparison["backend"] == "cuda") | pair.str.contains("cuda")
    return comparison[on_cuda & (comparison["status"] != "only local")]


def cuda_reference_macros(comparison: pd.DataFrame) -> dict[str, str]:
    """What the references measured on CUDA: the regime verdict and the speculative and
    verification results that the seed's claims are about (over every CUDA reference but the
    sub-studies `<name>/<study>`, whose rows are their sections': `studies.long.paper`,
    `studies.quantized.paper`)."""
    rows = cuda_rows(comparison)
    rows = rows[~rows["reference"].astype(str).str.contains("/")]

    def values(quantity: str) -> pd.DataFrame:
        return rows[rows["quantity"] == quantity]

    spikes, ratios, step_ups = (values(q)["reference_value"]
                                for q in ("spikes", "max_ratio", "step_ups"))
    spec, hf, parallel = values("spec_speedup"), values("hf_ratio"), values("parallelism")
    best = spec.loc[spec["reference_value"].idxmax()] if len(spec) else None
    at_k = parallel[parallel["k"] == PARALLEL_K]["reference_value"]
    macros = {
        "RefCudaNames": human_list([tt(n) for n in dict.fromkeys(rows["reference"])])
        if len(rows) else NONE,
        "RefCudaSpikes": integer(spikes.sum()) if len(spikes) else NONE,
        "RefCudaStepUps": integer(step_ups.sum()) if len(step_ups) else NONE,
        "RefCudaConfigs": integer(len(values("decode_s"))) if len(rows) else NONE,
        "RefCudaMaxRatio": sig(ratios.max()) if len(ratios) else NONE,
        "RefCudaSpecBest": sig(best["reference_value"]) if best is not None else NONE,
        "RefCudaSpecBestOn": tt(f"{best['pair']}, {best['mode']}") if best is not None else NONE,
        **selected_spec_macros(rows),
        "RefCudaParallelK": str(PARALLEL_K),
        "RefCudaParallel": sig(at_k.median()) if len(at_k) else NONE,
        "RefCudaHfMin": sig(hf["reference_value"].min()) if len(hf) else NONE,
        "RefCudaHfMax": sig(hf["reference_value"].max()) if len(hf) else NONE,
    }
    for quantity, name in (("chi2_p", "Chi"), ("log_ratio_p", "LogRatio")):
        checks = values(quantity)
        for sampler in ("correct", *WRONG_SAMPLERS):
            p = checks[checks["sampler"] == sampler]["reference_value"]
            macros[f"RefCuda{name}P{camel(sampler)}"] = pval(p.median()) if len(p) \
                else NONE
    return macros


def selected_spec_macros(rows: pd.DataFrame) -> dict[str, str]:
    """The first CUDA reference's speculative best chosen on one half of its runs and
    estimated on the other (`reference.SELECTED`), with its interval."""
    chosen = rows[rows["quantity"] == "spec_selected"].head(1)
    if not len(chosen):
        return dict.fromkeys(("RefCudaSpecSel", "RefCudaSpecSelLow", "RefCudaSpecSelHigh",
                              "RefCudaSpecSelOn"), NONE)
    row = chosen.iloc[0]
    same = rows[(rows["reference"] == row["reference"]) & (rows["pair"] == row["pair"])
                & (rows["mode"] == row["mode"]) & (rows["k"] == row["k"])]

    def value(quantity: str) -> str:
        return sig(same[same["quantity"] == quantity]["reference_value"].iloc[0])

    return {"RefCudaSpecSel": value("spec_selected"),
            "RefCudaSpecSelLow": value("spec_selected_low"),
            "RefCudaSpecSelHigh": value("spec_selected_high"),
            "RefCudaSpecSelOn": tt(spec_label((row["pair"], row["mode"], row["k"])))}


# -----------------------------------------------------------------------------
# benchmarks

def benchmark_rows(bench: pd.DataFrame) -> list:
    rows = []
    multi = "host" in bench and bench["host"].nunique() > 1
    for _, r in bench.iterrows():
        rows.append(([tt(r["host"])] if multi else [])
                    + [tt(r["rule"]), f"{integer(r['jobs'])} of {integer(r['expected'])}",
                       sig(r["total_s"]), sig(r["median_s"]), sig(r["max_s"]),
                       sig(r["max_rss_mb"])])
    return rows


def benchmarks_table(bench: pd.DataFrame) -> str:
    multi = "host" in bench and len(bench) and bench["host"].nunique() > 1
    header = [("Host & " if multi else "") + r"Rule & Jobs & Total (s) & Median (s) & "
              r"Max (s) & Peak RSS (MB) \\"]
    spec = ("l" if multi else "") + "llrrrr"
    return tabular(f"@{{}}{spec}@{{}}", header, benchmark_rows(bench),
                   "no benchmark files were found")


def benchmark_macros(bench: pd.DataFrame) -> tuple[dict[str, str], dict[str, bool]]:
    ok = bench[bench["jobs"] > 0] if len(bench) else bench
    slowest = ok.loc[ok["total_s"].idxmax()] if len(ok) else None
    return ({"BenchNumRules": str(len(ok)),
             "BenchNumJobs": integer(ok["jobs"].sum()) if len(ok) else "0",
             "BenchTotalMin": sig(ok["total_s"].sum() / 60) if len(ok) else NONE,
             "BenchMaxRssMb": sig(ok["max_rss_mb"].max()) if len(ok) else NONE,
             "BenchSlowestRule": tt(slowest["rule"]) if slowest is not None else NONE,
             "BenchSlowestMin": sig(slowest["total_s"] / 60) if slowest is not None else NONE},
            {"BenchmarksReady": len(ok) > 0})


def parts(stats_dir: Path, settings: dict) -> Section:
    hosts, comparison, bench = (tables.read(stats_dir, name)
                                for name in ("hosts", "reference_comparison", "benchmarks"))
    macros, flags = {}, {}
    for m, f in (hosts_macros(hosts), reference_macros(comparison), benchmark_macros(bench)):
        macros.update(m)
        flags.update(f)
    return Section(macros, flags, {"tab_hosts.tex": hosts_table(hosts),
                                   "tab_reference.tex": reference_table(rf.summary(comparison)),
                                   "tab_benchmarks.tex": benchmarks_table(bench)})
