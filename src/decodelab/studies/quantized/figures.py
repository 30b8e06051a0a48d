"""The quantized study's figure: llama.cpp's verification cost per extra token beside the
PyTorch engine's, and the quantized pairs' speedups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.lines import Line2D

from decodelab.core import tables
from decodelab.core.tables import BACKEND_LABELS, ordered_backends
from decodelab.report.figures import (
    STYLE,
    backend_color,
    band,
    empty_panel,
    new_figure,
    save,
    spec_modes,
    spec_pairs,
)
from decodelab.studies.speculative.figures import (
    REFERENCE,
    ci_handle,
    k_ticks,
    pair_colors,
    pair_mode_handles,
    spec_band,
)

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
