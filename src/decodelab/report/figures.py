"""What every study's figures share: the style, the sizes, colours per backend, bands and log
axes, the legend handles, saving, and the orders of pairs, modes and samplers that the paper
reads too. Each study draws its own figures (`decodelab.studies.<name>.figures`).

Drawn on a bare `Figure` with the Agg canvas: no pyplot, no global state, no window.
Every figure is written as `<stem>.pdf` (for LaTeX) and `<stem>.png` (for a quick look).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from decodelab.core.io import as_bool
from decodelab.core.tables import BACKEND_LABELS

BACKEND_COLORS = {"cpu": "#4C72B0", "cuda": "#55A868", "mps": "#C44E52"}
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

def backend_color(backend: str) -> str:
    return BACKEND_COLORS.get(backend, "#7F7F7F")


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

def new_figure(nrows: int, ncols: int, row_in: float = ROW_IN,
               width_in: float = WIDTH_IN) -> tuple[Figure, np.ndarray]:
    height = min(MAX_HEIGHT_IN, 0.75 + row_in * nrows)
    fig = Figure(figsize=(width_in, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def used_panels(axes: np.ndarray, n: int):
    """(index, axis) of the first n panels; the rest hidden, or one 'no data' panel if n is 0."""
    for i, ax in enumerate(axes.flat):
        if i < n:
            yield i, ax
        elif n:
            ax.set_visible(False)
        else:
            empty_panel(ax)


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


# -----------------------------------------------------------------------------
# KV-cache speedup vs budget


# -----------------------------------------------------------------------------
# regimes in depth: variance between processes, memory, prefill vs decode, change points


# -----------------------------------------------------------------------------
# speculative decoding: acceptance, speedup, verification parallelism, theory

MODE_ORDER = ("sampled", "greedy")


def spec_pairs(*tables: pd.DataFrame) -> list[str]:
    """Pair names over all tables, sorted: the order of colours, legends and table rows."""
    return sorted({p for t in tables if "pair" in t for p in t["pair"].dropna().astype(str)})


def spec_modes(df: pd.DataFrame) -> list[str]:
    present = set(df["mode"]) if len(df) and "mode" in df else set()
    return [m for m in MODE_ORDER if m in present] + sorted(present - set(MODE_ORDER))


# -----------------------------------------------------------------------------
# the long-context study: acceptance vs KV budget per context length, speedup and cost ratio
# vs context length, a line per drafter x policy and mode


# -----------------------------------------------------------------------------
# batched speculation: each mode over batched autoregressive decoding against the batch size,
# and where verification stops being nearly free (overhead and ceiling against the batch size)


# -----------------------------------------------------------------------------
# equivalence verification: observed token frequencies, p-values over seeds

SAMPLER_ORDER = ("correct", "accept_all", "resample_from_p")


def ordered_samplers(*tables: pd.DataFrame) -> list[str]:
    present = {s for t in tables if "sampler" in t for s in t["sampler"].astype(str)}
    return [s for s in SAMPLER_ORDER if s in present] + sorted(present - set(SAMPLER_ORDER))


