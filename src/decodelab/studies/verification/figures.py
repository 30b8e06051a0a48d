"""The verification study's figures: observed token frequencies, p-values over seeds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.lines import Line2D

from decodelab.core import tables
from decodelab.report.figures import (
    SAMPLER_ORDER,
    STYLE,
    empty_panel,
    new_figure,
    ordered_samplers,
    save,
    spec_pairs,
    used_panels,
)
from decodelab.studies.speculative.figures import REFERENCE

SAMPLER_COLORS = {"correct": "#55A868", "accept_all": "#C44E52", "resample_from_p": "#DD8452"}


SAMPLER_LABELS = {"correct": "correct", "accept_all": "accept_all (wrong)",
                  "resample_from_p": "resample_from_p (wrong)"}


P_FLOOR = 1e-16           # p-values below this (down to an underflowed 0) are drawn at it


def sampler_color(sampler: str) -> str:
    return SAMPLER_COLORS.get(sampler, "#7F7F7F")


def tokens_figure(tokens: pd.DataFrame, out_stem: Path) -> list[Path]:
    """Speculative against autoregressive frequency of the top tokens of the level-3 table,
    log-log, a panel per sampler (a row per pair); y = x with a two-standard-error band."""
    need = {"pair", "sampler", "autoregressive", "speculative", "n_autoregressive",
            "n_speculative"}
    df = tokens if len(tokens) and need <= set(tokens.columns) else pd.DataFrame()
    if len(df):
        df = df[(df["n_autoregressive"] > 0) & (df["n_speculative"] > 0)]
    samplers = ordered_samplers(df) or list(SAMPLER_ORDER)
    pair_names = spec_pairs(df) or [""]
    with rc_context(STYLE):
        fig, axes = new_figure(len(pair_names), len(samplers), row_in=1.85)
        if len(df):
            x_all = df["autoregressive"] / df["n_autoregressive"]
            y_all = df["speculative"] / df["n_speculative"]
            both = np.r_[x_all[x_all > 0], y_all[y_all > 0]]
            lo, hi = both.min() / 1.6, min(1.0, both.max() * 1.6)
            n_a, n_s = df["n_autoregressive"].median(), df["n_speculative"].median()
        for r, pair in enumerate(pair_names):
            for c, sampler in enumerate(samplers):
                ax = axes[r, c]
                rows = df[(df["pair"] == pair) & (df["sampler"] == sampler)] if len(df) else df
                if r == 0:
                    ax.set_title(SAMPLER_LABELS.get(sampler, sampler))
                if not len(rows):
                    empty_panel(ax)
                    continue
                f = np.geomspace(lo, hi, 200)
                se = np.sqrt(f * (1 - f) * (1 / n_a + 1 / n_s))
                ax.fill_between(f, np.maximum(f - 2 * se, lo), f + 2 * se, color="0.6",
                                alpha=0.25, linewidth=0)
                ax.plot([lo, hi], [lo, hi], linestyle=":", **REFERENCE)
                x = rows["autoregressive"] / rows["n_autoregressive"]
                y = rows["speculative"] / rows["n_speculative"]
                keep = (x > 0) & (y > 0)
                ax.plot(x[keep], y[keep], linestyle="none", marker="o", markersize=2.5,
                        markerfacecolor="none", markeredgewidth=0.6, color=sampler_color(sampler))
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.set_xlim(lo, hi)
                ax.set_ylim(lo, hi)
                ax.set_aspect("equal", adjustable="box")
                if r == len(pair_names) - 1:
                    ax.set_xlabel("autoregressive frequency")
                if c == 0:
                    ax.set_ylabel(f"{pair}\nspeculative frequency" if pair
                                  else "speculative frequency")
        handles = [Line2D([], [], linestyle=":", label="equal frequency", **REFERENCE),
                   Line2D([], [], color="none", marker="s", markerfacecolor="0.6",
                          markeredgecolor="none", alpha=0.5,
                          label="\u00b12 standard errors of the difference")]
        fig.legend(handles=handles, loc="outside upper center", ncol=2)
        return save(fig, out_stem)


def pvalue_panels(pvalues: pd.DataFrame) -> list[tuple[int, str, str]]:
    """(level, check, pair) of every power run, by level, then pair, then check."""
    if not len(pvalues) or not {"level", "check", "pair"} <= set(pvalues.columns):
        return []
    keys = pvalues[["level", "check", "pair"]].drop_duplicates()
    return sorted(keys.itertuples(index=False, name=None), key=lambda k: (k[0], k[2]))


def pvalues_figure(pvalues: pd.DataFrame, out_stem: Path, alpha: float | None = None
                   ) -> list[Path]:
    """p-values over seeds, a strip per sampler and a panel per test (and pair), log x, with the
    level alpha (from the power table when the p-value table lacks it) and the count of seeds
    rejected at it."""
    panels = pvalue_panels(pvalues)
    samplers = ordered_samplers(pvalues)
    if alpha is None and "alpha" in pvalues and pvalues["alpha"].notna().any():
        alpha = float(pvalues["alpha"].dropna().iloc[0])
    ncols = min(2, max(1, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    rng = np.random.default_rng(0)  # jitter only
    with rc_context(STYLE):
        fig, axes = new_figure(nrows, ncols, row_in=1.35)
        for i, ax in used_panels(axes, len(panels)):
            level, check, pair = panels[i]
            rows = pvalues[(pvalues["level"] == level) & (pvalues["check"] == check)
                           & (pvalues["pair"] == pair)]
            ticks = []
            for j, sampler in enumerate(samplers):
                p = rows[rows["sampler"] == sampler]["p_value"].dropna().to_numpy(dtype=float)
                ticks.append(sampler if alpha is None or not len(p)
                             else f"{sampler}\n{int(np.sum(p < alpha))}/{len(p)} rejected")
                if not len(p):
                    continue
                y = j + rng.uniform(-0.18, 0.18, len(p))
                ax.plot(np.clip(p, P_FLOOR, 1), y, linestyle="none", marker="o", markersize=3,
                        markerfacecolor="none", markeredgewidth=0.7, color=sampler_color(sampler))
            if alpha is not None:
                ax.axvline(alpha, linestyle="--", **REFERENCE)
            ax.set_xscale("log")
            ax.set_xlim(P_FLOOR / 3, 3)
            ax.set_ylim(-0.6, len(samplers) - 0.4)
            ax.set_yticks(range(len(samplers)), ticks)
            ax.grid(axis="y", visible=False)
            ax.set_title(f"level {int(level)}: {check}" + (f" ({pair})" if pair else ""))
            if i + ncols >= len(panels):
                ax.set_xlabel("p-value over seeds (floored at 1e-16)")
        handles = [Line2D([], [], color=sampler_color(s), linestyle="none", marker="o",
                          markerfacecolor="none", label=SAMPLER_LABELS.get(s, s))
                   for s in samplers]
        if alpha is not None:
            handles.append(Line2D([], [], linestyle="--", label=f"alpha = {alpha:g}",
                                  **REFERENCE))
        if handles:
            fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 4))
        return save(fig, out_stem)


def verification_figures(stats_dir: Path, out_dir: Path) -> list[Path]:
    """verification_tokens and verification_pvalues (.pdf + .png) from the verification tables."""
    t = tables.read_group(stats_dir, "verification")
    out_dir = Path(out_dir)
    power = t["power"]
    alpha = (float(power["alpha"].dropna().iloc[0])
             if "alpha" in power and power["alpha"].notna().any() else None)
    return (tokens_figure(t["tokens"], out_dir / "verification_tokens")
            + pvalues_figure(t["pvalues"], out_dir / "verification_pvalues", alpha))
