"""Figures from the stats tables: latency vs budget with flagged spikes, and KV-cache speedup;
for the speculative stage, acceptance, speedup, verification parallelism and theory against K;
for the equivalence verification, observed token frequencies and p-values over seeds.

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

from decodelab.core import tables
from decodelab.core.io import as_bool
from decodelab.core.tables import BACKEND_LABELS, ordered_backends

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


# -----------------------------------------------------------------------------
# regimes in depth: variance between processes, memory, prefill vs decode, change points

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


# -----------------------------------------------------------------------------
# speculative decoding: acceptance, speedup, verification parallelism, theory

PAIR_PALETTE = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
                "#8C8C8C", "#CCB974", "#64B5CD")
MODE_ORDER = ("sampled", "greedy")
MODE_STYLES = {"sampled": ("-", "o"), "greedy": ("--", "s")}
REFERENCE = {"color": "0.2", "linewidth": 0.8}
PARALLELISM_WIDTH_IN = 4.8  # one panel: the paper shows it at 0.74\linewidth, fonts unscaled


def spec_pairs(*tables: pd.DataFrame) -> list[str]:
    """Pair names over all tables, sorted: the order of colours, legends and table rows."""
    return sorted({p for t in tables if "pair" in t for p in t["pair"].dropna().astype(str)})


def pair_colors(pair_names: list[str]) -> dict[str, str]:
    return {p: PAIR_PALETTE[i % len(PAIR_PALETTE)] for i, p in enumerate(pair_names)}


def spec_modes(df: pd.DataFrame) -> list[str]:
    present = set(df["mode"]) if len(df) and "mode" in df else set()
    return [m for m in MODE_ORDER if m in present] + sorted(present - set(MODE_ORDER))


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


QUANT_COLORS = {"F16": "#8172B2", "Q8_0": "#DD8452", "Q4_0": "#937860"}
QUANT_STYLES = {"cpu": "-", "cuda": "--", "metal": ":"}


def verify_cost_panel(ax, parallelism: pd.DataFrame, verify: pd.DataFrame) -> None:
    """Ratio against K: a band per GGUF type and device (a line style per device), the PyTorch
    backends' curves thin beside them, and the serial and batch-parallel references."""
    both = [t for t in (parallelism, verify) if len(t)]
    if not both:
        empty_panel(ax)
        return
    for (backend, _), rows in parallelism.groupby(["backend", "model"]) if len(parallelism) else ():
        rows = rows.sort_values("k")
        ax.plot(rows["k"], rows["ratio"], color=backend_color(backend), alpha=0.6)
    for (quant, device, _), rows in (verify.groupby(["quantization", "device", "model"])
                                     if len(verify) else ()):
        rows = rows.sort_values("k")
        band(ax, rows["k"].to_numpy(), rows["ratio"], rows["ci_low"], rows["ci_high"],
             QUANT_COLORS.get(quant, "0.4"), QUANT_STYLES.get(device, "-."))
    ks = np.sort(pd.concat([t["k"] for t in both]).unique())
    ax.plot(ks, ks + 1, linestyle=":", **REFERENCE)
    ax.axhline(1.0, linestyle="--", **REFERENCE)
    k_ticks(ax, ks)


def quantized_handles(parallelism: pd.DataFrame, verify: pd.DataFrame) -> list:
    quants = set(verify["quantization"]) if len(verify) else set()
    devices = set(verify["device"]) if len(verify) else set()
    backends = ordered_backends(parallelism["backend"]) if len(parallelism) else []
    return ([Line2D([], [], color=c, label=q) for q, c in QUANT_COLORS.items() if q in quants]
            + [Line2D([], [], color="0.3", linestyle=s, label=f"llama.cpp {d}")
               for d, s in QUANT_STYLES.items() if d in devices]
            + [Line2D([], [], color=backend_color(b), alpha=0.6,
                      label=f"PyTorch {BACKEND_LABELS.get(b, b)}") for b in backends])


def quantized_figure(parallelism: pd.DataFrame, verify: pd.DataFrame, spec: pd.DataFrame,
                     out_stem: Path) -> list[Path]:
    """Left: verify cost (K+1 tokens over 1) per GGUF type and device beside the PyTorch
    backends; right: the speedup of the pairs with a llama.cpp role against K."""
    names = spec_pairs(spec) if len(spec) else []
    colors = pair_colors(names)
    with rc_context(STYLE):
        fig, axes = new_figure(1, 2, row_in=2.1)
        cost, speed = axes[0]
        cost.set_title("verify cost")
        speed.set_title("speedup, pairs with a llama.cpp role")
        verify_cost_panel(cost, parallelism, verify)
        cost.set_xlabel("draft length K (the target scores K+1 tokens)")
        cost.set_ylabel("time(K+1 tokens) / time(1 token)")
        if not len(spec):
            empty_panel(speed)
        for (pair, mode), rows in spec.groupby(["pair", "mode"]) if len(spec) else ():
            spec_band(speed, rows.sort_values("k"), "speedup", colors[pair], mode)
        speed.axhline(1.0, linestyle=":", **REFERENCE)
        speed.set_xlabel("draft length K")
        speed.set_ylabel("speedup over the target alone")
        handles = [*quantized_handles(parallelism, verify),
                   *(pair_mode_handles(names, colors, spec_modes(spec)) if names else [])]
        fig.legend(handles=handles or [ci_handle()], loc="outside upper center",
                   ncol=min(len(handles), 5) or 1)
        return save(fig, out_stem)


def quantized_figures(stats_dir: Path, out_dir: Path) -> list[Path]:
    """quantized (.pdf + .png) from the quantized tables and the PyTorch parallelism table."""
    t = tables.read_group(stats_dir, "quantized")
    parallelism = tables.read(stats_dir, "speculative_parallelism")
    return quantized_figure(parallelism, t["verify_cost"], t["speculative"],
                            Path(out_dir) / "quantized")


# -----------------------------------------------------------------------------
# the long-context study: acceptance vs KV budget per context length, speedup and cost ratio
# vs context length, a line per drafter x policy and mode

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


# -----------------------------------------------------------------------------
# batched speculation: each mode over batched autoregressive decoding against the batch size,
# and where verification stops being nearly free (overhead and ceiling against the batch size)

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


# -----------------------------------------------------------------------------
# equivalence verification: observed token frequencies, p-values over seeds

SAMPLER_ORDER = ("correct", "accept_all", "resample_from_p")
SAMPLER_COLORS = {"correct": "#55A868", "accept_all": "#C44E52", "resample_from_p": "#DD8452"}
SAMPLER_LABELS = {"correct": "correct", "accept_all": "accept_all (wrong)",
                  "resample_from_p": "resample_from_p (wrong)"}
P_FLOOR = 1e-16           # p-values below this (down to an underflowed 0) are drawn at it


def ordered_samplers(*tables: pd.DataFrame) -> list[str]:
    present = {s for t in tables if "sampler" in t for s in t["sampler"].astype(str)}
    return [s for s in SAMPLER_ORDER if s in present] + sorted(present - set(SAMPLER_ORDER))


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
