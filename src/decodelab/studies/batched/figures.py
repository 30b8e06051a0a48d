"""The batched study's figures: each mode over batched autoregressive decoding against the
batch size, and where verification stops being nearly free."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib import rc_context
from matplotlib.lines import Line2D

from decodelab.core import tables
from decodelab.core.tables import BACKEND_LABELS, ordered_backends
from decodelab.report.figures import STYLE, empty_panel, new_figure, save, used_panels
from decodelab.studies.speculative.figures import REFERENCE, ci_handle, pair_colors

BATCHED_MODES = {"synchronized": "synchronized (draft model)",
                 "self_synchronized": "synchronized self-speculation",
                 "unsynchronized": "non-synchronized", "refreshed": "non-synchronized + refresh"}


def batch_axis(ax, batches) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted({int(b) for b in batches})
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.set_xlabel("batch size B")


def batched_panels(table: pd.DataFrame, by: str) -> list[tuple]:
    """(backend, value of `by`) per panel, backends in their usual order."""
    if not len(table):
        return []
    return [(b, v) for b in ordered_backends(table["backend"].unique())
            for v in sorted(table.loc[table["backend"] == b, by].unique())]


def batched_speedup_figure(throughput: pd.DataFrame, out_stem: Path) -> list[Path]:
    """Throughput over batched autoregressive decoding against B, a panel per backend and
    context, a line per mode with its interval over runs; 1 drawn for reference."""
    panels = batched_panels(throughput, "context")
    modes = [m for m in BATCHED_MODES if len(throughput) and m in set(throughput["mode"])]
    colors = pair_colors(list(BATCHED_MODES))
    with rc_context(STYLE):
        ncols = min(2, max(1, len(panels)))
        fig, axes = new_figure(max(1, math.ceil(len(panels) / ncols)), ncols, row_in=2.0)
        for i, ax in used_panels(axes, len(panels)):
            backend, context = panels[i]
            rows = throughput[(throughput["backend"] == backend)
                              & (throughput["context"] == context)]
            for mode in modes:
                g = rows[rows["mode"] == mode].sort_values("batch")
                ax.fill_between(g["batch"], g["ci_low"], g["ci_high"], color=colors[mode],
                                alpha=0.15, linewidth=0)
                ax.plot(g["batch"], g["speedup"], color=colors[mode], marker="o", markersize=3)
            ax.axhline(1.0, linestyle=":", **REFERENCE)
            batch_axis(ax, rows["batch"])
            ax.set_title(f"{BACKEND_LABELS.get(backend, backend)}, L = {int(context)}")
            ax.set_ylabel("throughput / autoregressive")
        handles = [Line2D([], [], color=colors[m], label=BATCHED_MODES[m]) for m in modes]
        fig.legend(handles=[*handles, ci_handle()], loc="outside upper center", ncol=3)
        return save(fig, out_stem)


def batched_overhead_figure(costs: pd.DataFrame, out_stem: Path) -> list[Path]:
    """Per backend: the verification overhead t_verify(B, L, K+1) / t_draft(B, L) of the fitted
    costs (lines) and as measured at the widest timed forward (markers) against B, a line per
    context; beside it the ceiling (K+1) / overhead, the speedup of a free draft that is always
    accepted."""
    backends = ordered_backends(costs["backend"].unique()) if len(costs) else []
    contexts = sorted(costs["context"].unique()) if len(costs) else []
    colors = pair_colors([str(int(c)) for c in contexts])
    with rc_context(STYLE):
        fig, axes = new_figure(max(1, len(backends)), 2, row_in=2.0)
        if not backends:
            for ax in axes.flat:
                empty_panel(ax)
        for row, backend in enumerate(backends):
            rows = costs[costs["backend"] == backend]
            over, ceiling = axes[row]
            for context, g in rows.groupby("context"):
                g, color = g.sort_values("batch"), colors[str(int(context))]
                over.plot(g["batch"], g["overhead"], color=color)
                over.plot(g["batch"], g["measured_overhead"], color=color, linestyle="none",
                          marker="o", markersize=3)
                ceiling.plot(g["batch"], g["ceiling"], color=color, marker="o", markersize=3)
            k = int(rows["k"].max())
            over.set_ylabel(f"t_verify(K+1 = {k + 1}) / t_draft")
            ceiling.set_ylabel("ceiling (K+1) / overhead")
            for ax, title in ((over, "verification overhead"), (ceiling, "ceiling")):
                ax.axhline(1.0, linestyle=":", **REFERENCE)
                batch_axis(ax, rows["batch"])
                ax.set_title(f"{BACKEND_LABELS.get(backend, backend)}: {title}")
        handles = [Line2D([], [], color=colors[str(int(c))], label=f"L = {int(c)}")
                   for c in contexts]
        widths = sorted({int(w) for w in costs["verify_tokens"]}) if len(costs) else []
        handles += [Line2D([], [], color="0.3", label="fitted"),
                    Line2D([], [], color="0.3", linestyle="none", marker="o", markersize=3,
                           label=f"measured, {'/'.join(map(str, widths))} tokens")]
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 4))
        return save(fig, out_stem)


def batched_figures(stats_dir: Path, out_dir: Path) -> list[Path]:
    """batched_speedup and batched_overhead (.pdf + .png) from the batched tables."""
    t = tables.read_group(stats_dir, "batched")
    out_dir = Path(out_dir)
    return [*batched_speedup_figure(t["throughput"], out_dir / "batched_speedup"),
            *batched_overhead_figure(t["costs"], out_dir / "batched_overhead")]
