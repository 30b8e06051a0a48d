"""The speculative study's figures: acceptance, speedup, verification parallelism and theory
against K, a line per pair and mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.lines import Line2D

from decodelab.core import tables
from decodelab.core.tables import BACKEND_LABELS, ordered_backends
from decodelab.report.figures import (
    LINESTYLES,
    STYLE,
    backend_color,
    band,
    empty_panel,
    log_y,
    new_figure,
    save,
    spec_modes,
    spec_pairs,
    wants_log,
)

PAIR_PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
                "#8C8C8C", "#CCB974", "#64B5CD")


MODE_STYLES = {"sampled": ("-", "o"), "greedy": ("--", "s")}


REFERENCE = {"color": "0.2", "linewidth": 0.8}


PARALLELISM_WIDTH_IN = 4.8  # one panel: the paper shows it at 0.74\linewidth, fonts unscaled


def pair_colors(pair_names: list[str]) -> dict[str, str]:
    return {p: PAIR_PALETTE[i % len(PAIR_PALETTE)] for i, p in enumerate(pair_names)}


def mode_style(mode: str) -> tuple[str, str]:
    return MODE_STYLES.get(mode, (":", "^"))


def k_ticks(ax, ks) -> None:
    ks = sorted({int(k) for k in ks if np.isfinite(k)})
    if ks and len(ks) <= 12:
        ax.set_xticks(ks)


def pair_mode_handles(pair_names: list[str], colors: dict[str, str], modes: list[str]) -> list:
    handles = [Line2D([], [], color=colors[p], label=p) for p in pair_names]
    if len(modes) > 1:
        handles += [Line2D([], [], color="0.3", linestyle=mode_style(m)[0],
                           marker=mode_style(m)[1], label=m) for m in modes]
    return handles


def ci_handle() -> Line2D:
    return Line2D([], [], color="none", marker="s", markerfacecolor="0.6",
                  markeredgecolor="none", alpha=0.5, label="CI band")


def spec_band(ax, rows: pd.DataFrame, y: str, color: str, mode: str, dx: float = 0.0) -> None:
    """Median line of `y` against K with its CI band; `dx` shifts it along K (dodging)."""
    rows = rows.sort_values("k")
    linestyle, marker = mode_style(mode)
    x = rows["k"].to_numpy(dtype=float) + dx
    if {"ci_low", "ci_high"} <= set(rows.columns):
        ax.fill_between(x, rows["ci_low"], rows["ci_high"], color=color, alpha=0.15,
                        linewidth=0)
    ax.plot(x, rows[y], color=color, linestyle=linestyle, marker=marker, markersize=3)


def dodge(pair_names: list[str], width: float = 0.16) -> dict[str, float]:
    """Offsets along K, one per pair: pairs of the same models draw the same acceptance profile,
    and their lines would hide each other."""
    n = len(pair_names)
    step = width / max(1, n - 1)
    return {p: (i - (n - 1) / 2) * step if n > 1 else 0.0 for i, p in enumerate(pair_names)}


def acceptance_figure(acceptance: pd.DataFrame, out_stem: Path,
                      colors: dict[str, str] | None = None) -> list[Path]:
    """Per-token acceptance alpha (band) and accepted / proposed (thin, no band), and tokens per
    target call against K, a line per pair and mode."""
    names = spec_pairs(acceptance)
    colors = colors or pair_colors(names)
    modes = spec_modes(acceptance)
    with rc_context(STYLE):
        fig, axes = new_figure(1, 2, row_in=1.9)
        rate, calls = axes[0]
        if not len(acceptance):
            empty_panel(rate)
            empty_panel(calls)
        else:
            shift = dodge(names)
            for (pair, mode), rows in acceptance.groupby(["pair", "mode"]):
                spec_band(rate, rows, "alpha", colors[pair], mode, dx=shift[pair])
                rows = rows.sort_values("k")
                rate.plot(rows["k"] + shift[pair], rows["proposal_acceptance"],
                          color=colors[pair], linestyle=":", linewidth=0.8)
                calls.plot(rows["k"] + shift[pair], rows["tokens_per_call"], color=colors[pair],
                           linestyle=mode_style(mode)[0], marker=mode_style(mode)[1],
                           markersize=3)
            ks = np.sort(acceptance["k"].unique())
            calls.plot(ks, ks + 1, linestyle=":", **REFERENCE)
            calls.plot(ks, np.ones_like(ks), linestyle="-.", **REFERENCE)
            rate.set_ylim(0, 1.02)
            for ax in (rate, calls):
                k_ticks(ax, ks)
                ax.set_xlabel("draft length K")
        rate.set_title("acceptance: per token (alpha), per proposal (dotted)")
        rate.set_ylabel("acceptance")
        calls.set_title("tokens per target call")
        calls.set_ylabel("tokens per call")
        handles = [*pair_mode_handles(names, colors, modes), ci_handle(),
                   Line2D([], [], linestyle=":", label="K+1 (all accepted)", **REFERENCE),
                   Line2D([], [], linestyle="-.", label="1 (none accepted)", **REFERENCE)]
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 5))
        return save(fig, out_stem)


def hf_speedup(speedup: pd.DataFrame, hf: pd.DataFrame) -> pd.DataFrame:
    """HF assisted generation over the same greedy baseline: autoregressive_s / hf_s."""
    need = {"pair", "k", "hf_s"}
    if not len(hf) or not need <= set(hf.columns) or not len(speedup):
        return pd.DataFrame(columns=["pair", "k", "speedup"])
    base = speedup[speedup["mode"] == "greedy"][["pair", "k", "autoregressive_s"]]
    rows = base.merge(hf[["pair", "k", "hf_s"]], on=["pair", "k"]).dropna()
    rows = rows[rows["hf_s"] > 0]
    return rows.assign(speedup=rows["autoregressive_s"] / rows["hf_s"])


def speedup_figure(speedup: pd.DataFrame, hf: pd.DataFrame, out_stem: Path,
                   colors: dict[str, str] | None = None) -> list[Path]:
    """Wall-clock speedup over autoregressive decoding against K, a panel per mode."""
    names = spec_pairs(speedup)
    colors = colors or pair_colors(names)
    modes = spec_modes(speedup) or ["sampled"]
    theirs = hf_speedup(speedup, hf)
    log = wants_log(speedup["ci_low"].to_numpy(), speedup["ci_high"].to_numpy()) \
        if len(speedup) else False
    with rc_context(STYLE):
        fig, axes = new_figure(1, len(modes), row_in=1.9)
        for ax, mode in zip(axes[0], modes, strict=True):
            rows = speedup[speedup["mode"] == mode] if len(speedup) else speedup
            ax.set_title(f"{mode} decoding")
            ax.set_xlabel("draft length K")
            if not len(rows):
                empty_panel(ax)
                continue
            for pair, g in rows.groupby("pair"):
                spec_band(ax, g, "speedup", colors[pair], mode)
            if mode == "greedy":
                for pair, g in theirs.groupby("pair"):
                    g = g.sort_values("k")
                    ax.plot(g["k"], g["speedup"], color=colors.get(pair, "0.4"), linestyle="none",
                            marker="x", markersize=4)
            ax.axhline(1.0, linestyle=":", **REFERENCE)
            k_ticks(ax, rows["k"])
            if log:
                log_y(ax)
        axes[0, 0].set_ylabel("speedup (autoregressive / speculative)")
        handles = [*pair_mode_handles(names, colors, modes), ci_handle(),
                   Line2D([], [], linestyle=":", label="no speedup", **REFERENCE)]
        if len(theirs):
            handles.append(Line2D([], [], color="0.3", linestyle="none", marker="x",
                                  label="HF assisted (greedy)"))
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 5))
        return save(fig, out_stem)


def parallelism_figure(parallelism: pd.DataFrame, out_stem: Path) -> list[Path]:
    """Target forward time on K+1 tokens over one token, per backend (and model)."""
    df = parallelism
    backends = ordered_backends(df["backend"]) if len(df) else []
    models = sorted(df["model"].unique()) if len(df) else []
    with rc_context(STYLE):
        fig, axes = new_figure(1, 1, row_in=1.9, width_in=PARALLELISM_WIDTH_IN)
        ax = axes[0, 0]
        if not len(df):
            empty_panel(ax)
        else:
            for backend in backends:
                for i, model in enumerate(models):
                    rows = df[(df["backend"] == backend) & (df["model"] == model)]
                    if len(rows):
                        rows = rows.sort_values("k")
                        band(ax, rows["k"].to_numpy(), rows["ratio"], rows["ci_low"],
                             rows["ci_high"], backend_color(backend),
                             LINESTYLES[i % len(LINESTYLES)])
            ks = np.sort(df["k"].unique())
            ax.plot(ks, ks + 1, linestyle=":", **REFERENCE)
            ax.axhline(1.0, linestyle="--", **REFERENCE)
            k_ticks(ax, ks)
            contexts = sorted(df["context"].dropna().unique()) if "context" in df else []
            if len(contexts) == 1:
                ax.set_title(f"verification at a context of {int(contexts[0])} tokens")
        ax.set_xlabel("draft length K (the target scores K+1 tokens)")
        ax.set_ylabel("time(K+1 tokens) / time(1 token)")
        handles = [Line2D([], [], color=backend_color(b), label=BACKEND_LABELS.get(b, b))
                   for b in backends]
        if len(models) > 1:
            handles += [Line2D([], [], color="0.3", linestyle=LINESTYLES[i % len(LINESTYLES)],
                               label=m) for i, m in enumerate(models)]
        handles += [ci_handle(),
                    Line2D([], [], linestyle="--", label="batch-parallel (1)", **REFERENCE),
                    Line2D([], [], linestyle=":", label="serial (K+1)", **REFERENCE)]
        fig.legend(handles=handles, loc="outside right upper")
        return save(fig, out_stem)


PRICED_ALPHA = 0.5  # the theory figure's second prediction, drawn fainter than Leviathan's


def theory_figure(theory: pd.DataFrame, out_stem: Path,
                  colors: dict[str, str] | None = None) -> list[Path]:
    """Leviathan et al.'s predicted speedup against the measured one, and their ratio by K:
    as the formula prices verification (one target step), and priced as the runs measured it
    (faint crosses, where the theory table has `predicted_verify`)."""
    df = theory.copy()
    if len(df):
        df = df[np.isfinite(df["predicted"]) & np.isfinite(df["measured"])
                & (df["predicted"] > 0)]
    names = spec_pairs(df)
    colors = colors or pair_colors(names)
    modes = spec_modes(df)
    with rc_context(STYLE):
        fig, axes = new_figure(1, 2, row_in=1.9)
        scatter, gap = axes[0]
        scatter.set_title("predicted against measured")
        gap.set_title("measured / predicted")
        if not len(df):
            empty_panel(scatter)
            empty_panel(gap)
        else:
            for (pair, mode), rows in df.groupby(["pair", "mode"]):
                rows = rows.sort_values("k")
                linestyle, marker = mode_style(mode)
                scatter.plot(rows["predicted"], rows["measured"], linestyle="none", marker=marker,
                             markersize=3.5, markerfacecolor="none", color=colors[pair])
                gap.plot(rows["k"], rows["measured"] / rows["predicted"], color=colors[pair],
                         linestyle=linestyle, marker=marker, markersize=3)
                if "predicted_verify" in rows:  # the same, verification priced as measured
                    gap.plot(rows["k"], rows["measured"] / rows["predicted_verify"],
                             color=colors[pair], linestyle=linestyle, marker="x", markersize=3,
                             alpha=PRICED_ALPHA)
            values = np.r_[df["predicted"].to_numpy(), df["measured"].to_numpy()]
            lo, hi = 0.9 * values.min(), 1.1 * values.max()
            scatter.plot([lo, hi], [lo, hi], linestyle=":", **REFERENCE)
            scatter.set_xlim(lo, hi)
            scatter.set_ylim(lo, hi)
            gap.axhline(1.0, linestyle=":", **REFERENCE)
            k_ticks(gap, df["k"])
        scatter.set_xlabel("predicted speedup")
        scatter.set_ylabel("measured speedup")
        gap.set_xlabel("draft length K")
        gap.set_ylabel("measured / predicted")
        handles = [*pair_mode_handles(names, colors, modes),
                   Line2D([], [], linestyle=":", label="measured = predicted", **REFERENCE)]
        if "predicted_verify" in df and df["predicted_verify"].notna().any():
            handles.append(Line2D([], [], color="0.3", marker="x", linestyle="none",
                                  alpha=PRICED_ALPHA, label="verification priced as measured"))
        fig.legend(handles=handles, loc="outside upper center", ncol=min(len(handles), 6))
        return save(fig, out_stem)


def speculative_figures(stats_dir: Path, out_dir: Path) -> list[Path]:
    """acceptance, speedup, parallelism and theory (.pdf + .png) from the speculative tables."""
    t = tables.read_group(stats_dir, "speculative")
    out_dir = Path(out_dir)
    colors = pair_colors(spec_pairs(t["acceptance"], t["speedup"], t["theory"], t["hf"]))
    return (acceptance_figure(t["acceptance"], out_dir / "acceptance", colors)
            + speedup_figure(t["speedup"], t["hf"], out_dir / "speedup", colors)
            + parallelism_figure(t["parallelism"], out_dir / "parallelism")
            + theory_figure(t["theory"], out_dir / "theory", colors))
