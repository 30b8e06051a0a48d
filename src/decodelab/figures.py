"""Figures from the stats tables: latency vs budget with flagged spikes, and KV-cache speedup.

Drawn on a bare `Figure` with the Agg canvas: no pyplot, no global state, no window.
Every figure is written as `<stem>.pdf` (for LaTeX) and `<stem>.png` (for a quick look).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

BACKEND_ORDER = ("cpu", "cuda", "mps")
BACKEND_COLORS = {"cpu": "#4C72B0", "cuda": "#55A868", "mps": "#C44E52"}
BACKEND_LABELS = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}
LINESTYLES = ("-", "--", ":", "-.")
PHASES = (("total_s", "total"), ("prefill_s", "prefill"), ("decode_s", "decode (all steps)"))
WIDTH_IN = 6.5            # \textwidth of the paper (article, 1in margins on letter/a4)
ROW_IN = 1.45             # height of one row of panels
MAX_HEIGHT_IN = 8.3       # a figure never grows past one page
LOG_Y_SPAN = 10.0         # log-y when a panel's values span more than this factor
STYLE = {
    "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "legend.fontsize": 7,
    "xtick.labelsize": 7, "ytick.labelsize": 7, "lines.linewidth": 1.0, "lines.markersize": 3,
    "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.linewidth": 0.4, "grid.alpha": 0.4, "legend.frameon": False,
    "pdf.fonttype": 42, "savefig.dpi": 200,
}


# -----------------------------------------------------------------------------
# table helpers

def as_bool(series: pd.Series) -> pd.Series:
    """CSV round trips turn booleans into strings; accept both."""
    if series.dtype == bool:
        return series
    return series.astype(str).str.strip().str.lower().isin(["true", "1", "yes"])


def backend_color(backend: str) -> str:
    return BACKEND_COLORS.get(backend, "#7F7F7F")


def ordered_backends(df: pd.DataFrame) -> list[str]:
    present = set(df["backend"]) if len(df) else set()
    return [b for b in BACKEND_ORDER if b in present] + sorted(present - set(BACKEND_ORDER))


def ordered_models(df: pd.DataFrame) -> list[str]:
    if not len(df):
        return []
    if "family" in df:
        pairs = df[["family", "model"]].drop_duplicates().sort_values(["family", "model"])
        return list(dict.fromkeys(pairs["model"]))
    return sorted(df["model"].unique())


def variants(df: pd.DataFrame) -> list[tuple]:
    """(dtype, prompt_len) pairs: one line style each when there is more than one."""
    if not len(df):
        return []
    return sorted(df[["dtype", "prompt_len"]].drop_duplicates().itertuples(index=False, name=None))


def variant_label(variant: tuple, all_variants: list[tuple]) -> str:
    dtype, prompt_len = variant
    one_dtype = len({v[0] for v in all_variants}) == 1
    return f"prompt {prompt_len}" if one_dtype else f"{dtype}, prompt {prompt_len}"


def cache_on_sweep(latency: pd.DataFrame) -> pd.DataFrame:
    df = latency.copy()
    df["use_cache"] = as_bool(df["use_cache"])
    return df[(df["experiment"] == "sweep") & df["use_cache"]]


def spike_budgets(regimes: pd.DataFrame) -> pd.DataFrame:
    """Spikes flagged on total latency in the cache-on sweep."""
    if not len(regimes):
        return regimes.iloc[0:0]
    df = regimes.copy()
    for col in ("use_cache", "spike"):
        df[col] = as_bool(df[col])
    keep = (df["experiment"] == "sweep") & df["use_cache"] & df["spike"]
    return df[keep & (df["metric"] == "total_s")]


# -----------------------------------------------------------------------------
# drawing helpers

def new_figure(nrows: int, ncols: int, row_in: float = ROW_IN) -> tuple[Figure, np.ndarray]:
    height = min(MAX_HEIGHT_IN, 0.75 + row_in * nrows)
    fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def wants_log(low: np.ndarray, high: np.ndarray) -> bool:
    """Log-y when the values span more than LOG_Y_SPAN (spikes, or budgets over decades)."""
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    low, high = low[np.isfinite(low) & (low > 0)], high[np.isfinite(high) & (high > 0)]
    return bool(len(low) and len(high) and high.max() / low.min() > LOG_Y_SPAN)


def log_y(ax) -> None:
    """Log-y with plain tick labels (2, 5, 10, 20 ...), not 10^x."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def band(ax, x, median, low, high, color: str, linestyle: str) -> None:
    ax.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)
    ax.plot(x, median, color=color, linestyle=linestyle, marker="o", markersize=2)


def empty_panel(ax, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def legend_handles(backends: list[str], all_variants: list[tuple], spikes: bool) -> list:
    handles = [Line2D([], [], color=backend_color(b), label=BACKEND_LABELS.get(b, b))
               for b in backends]
    if len(all_variants) > 1:
        handles += [Line2D([], [], color="0.3", linestyle=LINESTYLES[i % len(LINESTYLES)],
                           label=variant_label(v, all_variants))
                    for i, v in enumerate(all_variants)]
    handles.append(Line2D([], [], color="none", marker="s", markerfacecolor="0.6",
                          markeredgecolor="none", alpha=0.5, label="CI band"))
    if spikes:
        handles.append(Line2D([], [], color="none", marker="*", markersize=8,
                              markerfacecolor="white", markeredgecolor="black",
                              label="spike flagged (total)"))
    return handles


def save(fig: Figure, out_stem: Path) -> list[Path]:
    out_stem = Path(out_stem)
    out_stem.parent.mkdir(parents=True, exist_ok=True)
    pdf, png = out_stem.with_suffix(".pdf"), out_stem.with_suffix(".png")
    fig.savefig(pdf, metadata={"CreationDate": None, "ModDate": None})
    fig.savefig(png)
    return [pdf, png]


# -----------------------------------------------------------------------------
# latency vs budget

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
    models, backends, all_variants = ordered_models(sweep), ordered_backends(sweep), variants(sweep)
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


# -----------------------------------------------------------------------------
# KV-cache speedup vs budget

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
    models, backends, all_variants = ordered_models(total), ordered_backends(total), variants(total)
    ncols = min(3, max(1, len(models)))
    nrows = max(1, math.ceil(len(models) / ncols))
    log = wants_log(total["ci_low"].to_numpy(), total["ci_high"].to_numpy())
    with rc_context(STYLE):
        fig, axes = new_figure(nrows, ncols, row_in=1.7)
        for i, ax in enumerate(axes.flat):
            if i >= len(models):
                if models:
                    ax.set_visible(False)
                else:
                    empty_panel(ax)
                continue
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
    read = lambda name: pd.read_csv(stats_dir / f"{name}.csv")  # noqa: E731
    return (latency_figure(read("latency"), read("regimes"), out_dir / "latency")
            + kv_figure(read("kv_speedup"), out_dir / "kv_speedup"))
