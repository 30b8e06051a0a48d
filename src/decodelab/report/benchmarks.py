"""Snakemake `benchmark:` files summarised per rule: jobs, wall time and peak memory.

A benchmark file is a TSV with a header (`s`, `h:m:s`, `max_rss` in MB, ...) and one row per
benchmark repeat. Its rule is known from its path: `benchmarks/<host>/<backend>/<experiment>/...`
for `sweep`, `benchmarks/<host>/<backend>/parallelism/...`, `benchmarks/<host>/speculative/...`,
`benchmarks/<host>/verification/<level>.tsv`, `benchmarks/<host>/long/...`, the quantized
backend's `benchmarks/<host>/llama.cpp-.../...`, `benchmarks/prepare_model/<model>.tsv`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from decodelab.core.errors import DecodelabError

COLUMNS = ["rule", "jobs", "expected", "total_s", "median_s", "max_s", "median_rss_mb",
           "max_rss_mb"]
VERIFY_RULES = {"exact": "verify_exact", "monte_carlo": "verify_monte_carlo"}


def rule_of(path: str) -> str:
    """The rule that wrote a benchmark file, from the layout of its path."""
    parts = Path(path).parts
    if "prepare_model" in parts:
        return "prepare_model"
    if "llama.cpp-peer" in parts:
        return "llama_peer"
    if any(part.startswith("llama.cpp-") for part in parts) and "parallelism" in parts:
        return "verify_cost"
    if "speculative" in parts:
        return "speculative"
    if "parallelism" in parts:
        return "parallelism"
    if "verification" in parts:
        stem = Path(path).stem
        prefix = stem.split("_")[0]
        return VERIFY_RULES.get(stem, f"verify_{prefix}" if prefix in ("real", "long") else stem)
    if "long" in parts:
        return "long"
    if "batched" in parts:
        return "batched"
    if "sweep" in parts or "ablation" in parts:
        return "sweep"
    raise DecodelabError(f"benchmark file {path}: no known rule writes to this path")


def read_benchmark(path: str | Path) -> dict:
    try:
        df = pd.read_csv(path, sep="\t")
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as err:
        raise DecodelabError(
            f"benchmark file {path} is not a Snakemake benchmark TSV: {err}") from err
    if not {"s", "max_rss"} <= set(df.columns) or not len(df):
        raise DecodelabError(f"benchmark file {path} lacks the columns 's' and 'max_rss'")
    rss = pd.to_numeric(df["max_rss"], errors="coerce")  # '-' where psutil saw nothing
    return {"path": str(path), "rule": rule_of(str(path)), "s": float(df["s"].mean()),
            "max_rss_mb": float(rss.max()) if rss.notna().any() else float("nan")}


def summarise(paths: list[str]) -> pd.DataFrame:
    """One row per rule over the jobs whose benchmark file exists; `expected` counts them all.

    A job that has not run (or ran before the rule had a `benchmark:`) has no file; it is
    counted as expected and reported on stderr, not guessed.
    """
    present = [p for p in paths if Path(p).is_file()]
    for p in sorted(set(paths) - set(present)):
        print(f"decodelab benchmarks: no benchmark file {p} (job not run here?)",
              file=sys.stderr)
    expected = pd.Series([rule_of(p) for p in paths], dtype=object).value_counts()
    jobs = pd.DataFrame([read_benchmark(p) for p in present],
                        columns=["path", "rule", "s", "max_rss_mb"])
    rows = []
    for rule, count in expected.items():
        g = jobs[jobs["rule"] == rule]
        rows.append({"rule": rule, "jobs": len(g), "expected": int(count),
                     "total_s": g["s"].sum() if len(g) else float("nan"),
                     "median_s": g["s"].median(), "max_s": g["s"].max(),
                     "median_rss_mb": g["max_rss_mb"].median(),
                     "max_rss_mb": g["max_rss_mb"].max()})
    return pd.DataFrame(rows, columns=COLUMNS).sort_values("rule").reset_index(drop=True)


def markdown(summary: pd.DataFrame, host: str) -> str:
    """The per-rule table for ARTIFACT.md, and the total."""
    lines = ["| rule | jobs | total (min) | median per job (s) | max per job (s) | "
             "peak memory, max (MB) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in summary.itertuples():
        if not r.jobs:
            lines.append(f"| `{r.rule}` | 0 of {r.expected} | not benchmarked here | | | |")
            continue
        lines.append(f"| `{r.rule}` | {r.jobs} of {r.expected} | {r.total_s / 60:.1f} | "
                     f"{r.median_s:.1f} | {r.max_s:.1f} | {r.max_rss_mb:.0f} |")
    total = summary["total_s"].sum() / 60
    lines.append(f"| **all measuring rules** | {int(summary['jobs'].sum())} | "
                 f"**{total:.1f}** | | | {summary['max_rss_mb'].max():.0f} |")
    return f"Host `{host}`:\n\n" + "\n".join(lines) + "\n"
