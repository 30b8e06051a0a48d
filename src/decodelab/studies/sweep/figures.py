"""The latency study's figures: latency against the budget with flagged spikes, the KV-cache
speedup, and the regimes in depth (variance between processes, memory, prefill against decode,
change points)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.lines import Line2D

from decodelab.core import tables
from decodelab.core.tables import BACKEND_LABELS, ordered_backends
from decodelab.report.figures import (
    LINESTYLES,
    PHASES,
    STYLE,
    backend_color,
    band,
    cache_on_sweep,
    empty_panel,
    legend_handles,
    log_y,
    new_figure,
    ordered_models,
    save,
    spike_budgets,
    used_panels,
    variants,
    wants_log,
)


def draw_latency_panel(ax, rows: pd.DataFrame, spikes: pd.DataFrame, backends: list[str],
                       all_variants: list[tuple], log: bool) -> None:
    for backend in backends:
        for i, variant in enumerate(all_variants):
            dtype, prompt_len = variant
            line = rows[(rows["backend"] == backend) & (rows["dtype"] == dtype)
                        & (rows["prompt_len"] == prompt_len)].sort_values("budget")
            if not len(line):
                continue
            x = line["budget"].to_numpy()
            ms = [line[c].to_numpy() * 1e3 for c in ("median", "ci_low", "ci_high")]
            band(ax, x, *ms, backend_color(backend), LINESTYLES[i % len(LINESTYLES)])
            flagged = spikes[(spikes["backend"] == backend) & (spikes["dtype"] == dtype)
                             & (spikes["prompt_len"] == prompt_len)]
            hit = line[line["budget"].isin(flagged["budget"])]
            ax.plot(hit["budget"], hit["median"] * 1e3, linestyle="none", marker="*",
                    markersize=8, markerfacecolor="white", markeredgecolor=backend_color(backend),
                    markeredgewidth=1.0, zorder=5)
    if log:
        log_y(ax)


def latency_figure(latency: pd.DataFrame, regimes: pd.DataFrame, out_stem: Path) -> list[Path]:
    """Cache-on latency vs budget: one row per model; total, prefill and decode side by side."""
    sweep = cache_on_sweep(latency)
    spikes = spike_budgets(regimes)
    models, all_variants = ordered_models(sweep), variants(sweep)
    backends = ordered_backends(sweep["backend"])
    with rc_context(STYLE):
        fig, axes = new_figure(max(1, len(models)), len(PHASES))
        for c, (metric, title) in enumerate(PHASES):
            phase = sweep[sweep["metric"] == metric]
            log = wants_log(phase["ci_low"].to_numpy(), phase["ci_high"].to_numpy())
            for r, model in enumerate(models or [None]):
                ax = axes[r, c]
                rows = phase[phase["model"] == model]
                if not len(rows):
                    empty_panel(ax)
                else:
                    draw_latency_panel(ax, rows, spikes[spikes["model"] == model], backends,
                                       all_variants, log)
                if r == 0:
                    ax.set_title(title)
                if c == 0:
                    ax.set_ylabel(f"{model}\nlatency (ms)" if model else "latency (ms)")
                if r == len(axes) - 1:
                    ax.set_xlabel("decoding budget (tokens)")
        handles = legend_handles(backends, all_variants, spikes=len(spikes) > 0)
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 6))
        return save(fig, out_stem)


def draw_kv_panel(ax, rows: pd.DataFrame, backends: list[str], all_variants: list[tuple],
                  log: bool) -> None:
    for backend in backends:
        for i, (dtype, prompt_len) in enumerate(all_variants):
            line = rows[(rows["backend"] == backend) & (rows["dtype"] == dtype)
                        & (rows["prompt_len"] == prompt_len)].sort_values("budget")
            if len(line):
                cols = [line[c].to_numpy() for c in ("speedup", "ci_low", "ci_high")]
                band(ax, line["budget"].to_numpy(), *cols, backend_color(backend),
                     LINESTYLES[i % len(LINESTYLES)])
    ax.axhline(1.0, color="0.2", linestyle=":", linewidth=0.8)
    if log:
        log_y(ax)


def kv_figure(kv: pd.DataFrame, out_stem: Path) -> list[Path]:
    """KV-cache speedup on total latency (cache off / cache on) vs budget, a panel per model."""
    total = kv[kv["metric"] == "total_s"] if len(kv) else kv
    models, all_variants = ordered_models(total), variants(total)
    backends = ordered_backends(total["backend"])
    ncols = min(3, max(1, len(models)))
    nrows = max(1, math.ceil(len(models) / ncols))
    log = wants_log(total["ci_low"].to_numpy(), total["ci_high"].to_numpy())
    with rc_context(STYLE):
        fig, axes = new_figure(nrows, ncols, row_in=1.7)
        for i, ax in used_panels(axes, len(models)):
            draw_kv_panel(ax, total[total["model"] == models[i]], backends, all_variants, log)
            ax.set_title(models[i])
            if i % ncols == 0:
                ax.set_ylabel("KV speedup (cache off / on)")
            if i + ncols >= len(models):
                ax.set_xlabel("decoding budget (tokens)")
        handles = legend_handles(backends, all_variants, spikes=False)
        handles.append(Line2D([], [], color="0.2", linestyle=":", label="no speedup"))
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 6))
        return save(fig, out_stem)


def draw_all(stats_dir: Path, out_dir: Path) -> list[Path]:
    """Both figures from a stats directory (the `figures` rule's job)."""
    stats_dir, out_dir = Path(stats_dir), Path(out_dir)
    latency, regimes = tables.read(stats_dir, "latency"), tables.read(stats_dir, "regimes")
    return (latency_figure(latency, regimes, out_dir / "latency")
            + kv_figure(tables.read(stats_dir, "kv_speedup"), out_dir / "kv_speedup")
            + regime_depth_figures(stats_dir, out_dir))


MEMORY_LABELS = {"mem_cuda_peak_bytes": "CUDA\nalloc.", "mem_mps_current_bytes": "MPS\nalloc.",
                 "mem_mps_driver_bytes": "MPS\ndriver", "rss_bytes": "RSS"}


def variance_panel(ax, summary: pd.DataFrame) -> None:
    """Between-process share of the variance of log total latency, cache-on sweep."""
    rows = summary[(summary["metric"] == "total_s") & (summary["experiment"] == "sweep")
                   & summary["use_cache"]].dropna(subset=["share_pooled"])
    if not len(rows):
        empty_panel(ax, "no configuration with\nseveral processes and\ninner repeats")
        return
    families, backends = sorted(rows["family"].unique()), ordered_backends(rows["backend"])
    width = 0.8 / len(backends)
    for j, backend in enumerate(backends):
        part = rows[rows["backend"] == backend].set_index("family")
        shift = (j - (len(backends) - 1) / 2) * width
        x = np.array([families.index(f) for f in part.index]) + shift
        med = part["share_median"].to_numpy()
        ax.bar(x, part["share_pooled"], width * 0.9, color=backend_color(backend), alpha=0.8)
        ax.errorbar(x, med, yerr=[med - part["share_q25"], part["share_q75"] - med],
                    fmt="o", color="0.15", markersize=2, linewidth=0.8, capsize=1.5)
    ax.set_xticks(range(len(families)), families)
    ax.set_ylim(0, 1)
    ax.set_ylabel("between-process share\nof variance (log total)")
    ax.set_title("(a) variance between processes")


def memory_panel(ax, memory: pd.DataFrame) -> None:
    """R^2 of the latency excess on each memory column, per backend; n/a where not recorded."""
    ok = memory[memory["status"] == "ok"]
    columns = [c for c in MEMORY_LABELS if c in set(memory["column"])]
    backends = ordered_backends(memory["backend"])
    if not len(memory):
        empty_panel(ax)
        return
    width = 0.8 / max(1, len(backends))
    for j, backend in enumerate(backends):
        for i, column in enumerate(columns):
            x = i + (j - (len(backends) - 1) / 2) * width
            hit = ok[(ok["backend"] == backend) & (ok["column"] == column)]
            if len(hit):
                ax.bar(x, hit["r2"].iloc[0], width * 0.9, color=backend_color(backend), alpha=0.8)
                ax.text(x, hit["r2"].iloc[0] + 0.02, f"ρ={hit['rho'].iloc[0]:.2f}", ha="center",
                        va="bottom", fontsize=5.5, rotation=90)
            else:
                ax.text(x, 0.02, "n/a", ha="center", va="bottom", fontsize=6, color="0.4",
                        rotation=90)
    ax.set_xticks(range(len(columns)), [MEMORY_LABELS[c] for c in columns], fontsize=6)
    ax.set_ylim(0, 1)
    ax.set_ylabel("$R^2$ of log excess\non memory")
    ax.set_title("(b) memory vs. latency excess")


def phases_panel(ax, phases: pd.DataFrame) -> None:
    """Share of each flagged spike's excess (seconds) that sits in decode, per backend."""
    spikes = phases[phases["scope"] == "spike"].dropna(subset=["decode_share"])
    ax.set_title("(c) excess in decode at spikes")
    if not len(spikes):
        empty_panel(ax, "no spike flagged:\nprefill/decode test\nnot applicable")
        return
    backends = ordered_backends(spikes["backend"])
    for j, backend in enumerate(backends):
        y = spikes.loc[spikes["backend"] == backend, "decode_share"].to_numpy()
        x = j + np.linspace(-0.15, 0.15, len(y)) if len(y) > 1 else np.array([j])
        ax.plot(x, y, linestyle="none", marker="o", markersize=3, color=backend_color(backend))
    ax.axhline(0.5, **REFERENCE_LINE)
    ax.set_xticks(range(len(backends)), [BACKEND_LABELS.get(b, b) for b in backends])
    ax.set_xlim(-0.6, len(backends) - 0.4)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("share of excess in decode")


REFERENCE_LINE = {"color": "0.2", "linestyle": ":", "linewidth": 0.8}


def regime_depth_figure(t: dict[str, pd.DataFrame], out_stem: Path) -> list[Path]:
    """Three panels: variance between processes, memory R^2, decode share of spike excess."""
    with rc_context(STYLE):
        fig, axes = new_figure(1, 3, row_in=2.0)
        variance_panel(axes[0, 0], t["variance_summary"])
        memory_panel(axes[0, 1], t["memory"])
        phases_panel(axes[0, 2], t["phases"])
        backends = ordered_backends([*t["memory"]["backend"],
                                     *t["variance_summary"]["backend"]])
        handles = [Line2D([], [], color=backend_color(b), linewidth=4,
                          label=BACKEND_LABELS.get(b, b)) for b in backends]
        if handles:
            fig.legend(handles=handles, loc="outside upper center", ncol=len(handles))
        return save(fig, out_stem)


def changepoints_figure(points: pd.DataFrame, out_stem: Path) -> list[Path]:
    """Decode latency per token vs budget, a row per model, cache on (sweep) and off
    (ablation); dashed lines where a change point starts a segment, stars at flagged spikes."""
    columns = (("sweep", True, "cache on (sweep)"), ("ablation", False, "cache off (ablation)"))
    models, backends = ordered_models(points), ordered_backends(points["backend"])
    with rc_context(STYLE):
        fig, axes = new_figure(max(1, len(models)), len(columns))
        for c, (experiment, cache, title) in enumerate(columns):
            for r, model in enumerate(models or [None]):
                ax = axes[r, c]
                rows = points[(points["model"] == model) & (points["experiment"] == experiment)
                              & (points["use_cache"] == cache)] if len(points) else points
                if not len(rows):
                    empty_panel(ax)
                for backend in backends:
                    line = rows[rows["backend"] == backend].sort_values("budget")
                    if not len(line):
                        continue
                    color = backend_color(backend)
                    ax.plot(line["budget"], line["signal"] * 1e3, color=color, marker="o",
                            markersize=2)
                    for b in line.loc[line["changepoint"], "budget"]:
                        ax.axvline(b, color=color, linestyle="--", linewidth=0.9)
                    hit = line[line["spike"]]
                    ax.plot(hit["budget"], hit["signal"] * 1e3, linestyle="none", marker="*",
                            markersize=8, markerfacecolor="white", markeredgecolor=color)
                if r == 0:
                    ax.set_title(title)
                if c == 0:
                    ax.set_ylabel(f"{model}\nms per token" if model else "ms per token")
                if r == len(axes) - 1:
                    ax.set_xlabel("decoding budget (tokens)")
        handles = [Line2D([], [], color=backend_color(b), label=BACKEND_LABELS.get(b, b))
                   for b in backends]
        handles += [Line2D([], [], color="0.3", linestyle="--", label="change point (PELT)"),
                    Line2D([], [], color="none", marker="*", markersize=8,
                           markerfacecolor="white", markeredgecolor="black",
                           label="spike flagged (total)")]
        fig.legend(handles=handles, loc="outside upper center", ncol=len(handles))
        return save(fig, out_stem)


def regime_depth_figures(stats_dir: Path, out_dir: Path) -> list[Path]:
    """regime_depth and changepoints figures; none when the regime_depth tables are absent."""
    t = tables.read_group(stats_dir, "regime_depth")
    if t is None:
        return []
    return (regime_depth_figure(t, Path(out_dir) / "regime_depth")
            + changepoints_figure(t["changepoints"], Path(out_dir) / "changepoints"))
