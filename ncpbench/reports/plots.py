"""The survival figure: every run's Kaplan–Meier curve on one plot, PNG and SVG.

Drawn on matplotlib's Agg canvas directly (`Figure` + `FigureCanvasAgg`, never pyplot), so it
needs no display, touches no global backend state and is safe to call from any thread. Each run
gets its step curve, a shaded log-log 95% band, tick marks where episodes were censored
(SURVIVAL at the limit, SUCCESS, ERROR) and a legend entry with its episode and conflict counts.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib as mpl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ncpbench.survival import KaplanMeier

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Curve:
    label: str
    km: KaplanMeier
    until: float
    """Where to end the curve (the run's turn limit)."""


def survival_figure(curves: Sequence[Curve], title: str = "Survival: episodes without a conflict") -> Figure:
    fig = Figure(figsize=(8.0, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    right = max((c.until for c in curves), default=1.0) or 1.0
    for i, c in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        x, s, lo, hi = c.km.steps(c.until)
        label = f"{c.label} (n={c.km.n}, {c.km.n_events} conflicts)"
        ax.step(x, s, where="post", color=color, linewidth=1.8, label=label)
        ax.fill_between(x, lo, hi, step="post", color=color, alpha=0.18, linewidth=0)
        ct, cs = c.km.censor_marks()
        if len(ct):
            ax.plot(ct, cs, linestyle="none", marker="|", markersize=9, markeredgewidth=1.5, color=color)
    ax.set_xlim(-0.02 * right, 1.02 * right)  # room for censor ticks at 0 and at the limit
    ax.set_ylim(0, 1.03)
    ax.set_xlabel("turn")
    ax.set_ylabel("share of episodes without a conflict")
    ax.set_title(f"{title}\nKaplan–Meier, shaded: 95% log-log bands, ticks: censored", fontsize=10)
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend(loc="lower left", fontsize=8, frameon=True)
    return fig


def render(fig: Figure, fmt: str) -> bytes:
    """The figure as PNG or SVG bytes, without timestamps (same input, same bytes)."""
    buf = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    with mpl.rc_context({"svg.hashsalt": "ncpbench", "svg.fonttype": "path"}):
        fig.savefig(buf, format=fmt, dpi=120, metadata=metadata)
    return buf.getvalue()


def write_survival_plot(curves: Sequence[Curve], out_dir: Path, stem: str = "survival") -> tuple[Path, Path, bytes]:
    """Write `stem`.png and `stem`.svg; also return the PNG bytes (for embedding)."""
    fig = survival_figure(curves)
    png, svg = render(fig, "png"), render(fig, "svg")
    png_path, svg_path = out_dir / f"{stem}.png", out_dir / f"{stem}.svg"
    png_path.write_bytes(png)
    svg_path.write_bytes(svg)
    return png_path, svg_path, png
