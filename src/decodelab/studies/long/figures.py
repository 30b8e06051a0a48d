"""The long-context study's figures: acceptance against the KV budget per context length,
speedup and cost ratio against the context length, a line per drafter x policy and mode."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib import rc_context

from decodelab.core import tables
from decodelab.report.figures import STYLE, empty_panel, new_figure, save, spec_modes, used_panels
from decodelab.studies.speculative.figures import (
    PARALLELISM_WIDTH_IN,
    REFERENCE,
    ci_handle,
    mode_style,
    pair_colors,
    pair_mode_handles,
    spec_band,
)


def long_line(row) -> str:
    return row.policy if row.drafter == "self" else f"{row.policy} ({row.drafter})"


def long_lines(*tables: pd.DataFrame) -> dict[str, str]:
    """Line label (policy, drafter where not self) -> colour."""
    names = sorted({long_line(r) for t in tables if len(t) for r in t.itertuples()})
    return pair_colors(names)


def long_acceptance_figure(acceptance: pd.DataFrame, out_stem: Path) -> list[Path]:
    """alpha against the KV budget, a panel per context length at the smallest K; the full
    cache (budget-free) as a horizontal line."""
    lengths = sorted(acceptance["length"].unique()) if len(acceptance) else []
    colors, modes = long_lines(acceptance), spec_modes(acceptance)
    with rc_context(STYLE):
        fig, axes = new_figure(1, max(1, len(lengths)), row_in=2.0)
        for i, ax in used_panels(axes, len(lengths)):
            rows = acceptance[(acceptance["length"] == lengths[i])]
            rows = rows[rows["k"] == rows["k"].min()]
            for (label, mode), g in rows.assign(line=[long_line(r) for r in rows.itertuples()]
                                                ).groupby(["line", "mode"]):
                linestyle, marker = mode_style(mode)
                if (g["kv_budget"] == 0).all():
                    ax.axhline(g["alpha"].iloc[0], color=colors[label], linestyle=linestyle)
                    continue
                g = g.sort_values("kv_budget")
                ax.fill_between(g["kv_budget"], g["ci_low"], g["ci_high"], color=colors[label],
                                alpha=0.15, linewidth=0)
                ax.plot(g["kv_budget"], g["alpha"], color=colors[label], linestyle=linestyle,
                        marker=marker, markersize=3)
            ax.set_xscale("log", base=2)
            ax.set_ylim(0, 1.02)
            ax.set_title(f"L = {int(lengths[i])}, K = {int(rows['k'].min())}")
            ax.set_xlabel("KV budget B (tokens)")
            ax.set_ylabel("per-token acceptance alpha")
        handles = [*pair_mode_handles(list(colors), colors, modes), ci_handle()]
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 5))
        return save(fig, out_stem)


def long_by_length_figure(table: pd.DataFrame, y: str, best: bool, labels: tuple[str, str],
                          out_stem: Path) -> list[Path]:
    """`y` against the context length, per line and mode: at the (B, K) of the largest `y`
    with its interval (`best`), else the median over (B, K); 1 drawn for reference."""
    colors, modes = long_lines(table), spec_modes(table)
    with rc_context(STYLE):
        fig, axes = new_figure(1, 1, row_in=2.4, width_in=PARALLELISM_WIDTH_IN)
        ax = axes[0, 0]
        if not len(table):
            empty_panel(ax)
        rows = table.assign(line=[long_line(r) for r in table.itertuples()]) if len(table) \
            else table
        for (label, mode), g in rows.groupby(["line", "mode"]) if len(rows) else ():
            if best:
                g = g.loc[g.groupby("length")[y].idxmax()]
            else:
                g = g.groupby("length", as_index=False)[y].median()
            along = g.drop(columns="k", errors="ignore").rename(columns={"length": "k"})
            spec_band(ax, along, y, colors[label], mode)
        ax.axhline(1.0, linestyle=":", **REFERENCE)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length L (tokens)")
        ax.set_ylabel(labels[0])
        ax.set_title(labels[1])
        handles = [*pair_mode_handles(list(colors), colors, modes), ci_handle()]
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 3))
        return save(fig, out_stem)


def long_figures(stats_dir: Path, out_dir: Path) -> list[Path]:
    """long_acceptance, long_speedup, long_cost (.pdf + .png) from the long tables."""
    t = tables.read_group(stats_dir, "long")
    out_dir = Path(out_dir)
    return [*long_acceptance_figure(t["acceptance"], out_dir / "long_acceptance"),
            *long_by_length_figure(t["speedup"], "speedup", True, (
                "speedup over the target alone", "best (B, K) per context length"),
                out_dir / "long_speedup"),
            *long_by_length_figure(t["speedup"], "cost_ratio", False, (
                "c = draft step / target step", "cost ratio, median over (B, K)"),
                out_dir / "long_cost")]
