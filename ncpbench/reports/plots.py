"""The survival figure: every run's Kaplan–Meier curve on one plot, PNG and SVG.

Drawn on matplotlib's Agg canvas directly (`Figure` + `FigureCanvasAgg`, never pyplot), so it
needs no display, touches no global backend state and is safe to call from any thread. Each run
gets its own colour and line style, its step curve, a shaded log-log 95% band, tick marks where
episodes were censored (SURVIVAL at the limit, SUCCESS, ERROR), hollow markers at the published
survival-at-t points (share of scored episodes with turn count >= t; a different estimate from
the Kaplan–Meier line) and a legend entry with its episode and conflict counts. Under the plot, a
number-at-risk table: per run, the episodes whose turn count is at least t.
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


LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (3, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


@dataclass(frozen=True)
class Curve:
    label: str
    km: KaplanMeier
    until: float
    """Where to end the curve (the run's turn limit)."""
    published: tuple[tuple[int, float], ...] = ()
    """(t, share of scored episodes with turn count >= t): the published survival at t, as markers."""


def at_risk(km: KaplanMeier, t: float) -> int:
    """Episodes still under observation at turn t (their turn count is at least t)."""
    keep = km.times >= t
    return int(km.events[keep].sum() + km.censored[keep].sum())


def survival_figure(curves: Sequence[Curve], title: str = "Survival: episodes without a conflict",
                    risk_at: Sequence[int] = ()) -> Figure:
    rows = len(curves) if risk_at else 0
    fig = Figure(figsize=(8.0, 4.8 + 0.22 * (rows + 1) * bool(rows)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    if rows:
        grid = fig.add_gridspec(2, 1, height_ratios=[4.8, 0.22 * (rows + 1) + 0.25])
        ax = fig.add_subplot(grid[0])
        table_ax = fig.add_subplot(grid[1], sharex=ax)
    else:
        ax = fig.add_subplot()
        table_ax = None
    right = max((c.until for c in curves), default=1.0) or 1.0
    published_label = False
    for i, c in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        style = LINESTYLES[i % len(LINESTYLES)]
        x, s, lo, hi = c.km.steps(c.until)
        label = f"{c.label} (n={c.km.n}, {c.km.n_events} conflicts)"
        ax.step(x, s, where="post", color=color, linestyle=style, linewidth=1.9, label=label)
        ax.fill_between(x, lo, hi, step="post", color=color, alpha=0.12, linewidth=0)
        ct, cs = c.km.censor_marks()
        if len(ct):
            ax.plot(ct, cs, linestyle="none", marker="|", markersize=12, markeredgewidth=2.2, color=color,
                    zorder=4)
        if c.published:
            pt, ps = zip(*c.published, strict=True)
            ax.plot(pt, ps, linestyle="none", marker=MARKERS[i % len(MARKERS)], markersize=7, markerfacecolor="white",
                    markeredgewidth=1.6, color=color, zorder=5,
                    label=None if published_label else "published survival@t (share with turns ≥ t), hollow")
            published_label = True
    ax.set_xlim(-0.02 * right, 1.02 * right)  # room for censor ticks at 0 and at the limit
    ax.set_ylim(0, 1.03)
    ax.set_ylabel("share of episodes without a conflict")
    ax.set_title(f"{title}\nlines: Kaplan–Meier (shaded: 95% log-log bands, ticks: censored); "
                 "hollow markers: published survival@t", fontsize=9)
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend(loc="lower left", fontsize=8, frameon=True)
    if table_ax is not None:
        table_ax.set_ylim(-0.5, rows + 0.3)
        labels = [c.label if len(c.label) <= 18 else c.label[:17] + "…" for c in curves]
        table_ax.set_yticks([rows - 1 - i for i in range(rows)], labels, fontsize=8)
        for tick, i in zip(table_ax.get_yticklabels(), range(rows), strict=True):
            tick.set_color(COLORS[i % len(COLORS)])
        for spine in table_ax.spines.values():
            spine.set_visible(False)
        table_ax.tick_params(left=False, bottom=True)
        table_ax.set_xlabel("turn")
        table_ax.text(0, rows, "number at risk (episodes with turn count ≥ t)", fontsize=8, ha="left", va="center",
                      weight="bold")
        for i, c in enumerate(curves):
            y = rows - 1 - i
            color = COLORS[i % len(COLORS)]
            for t in risk_at:
                if t <= c.until:
                    table_ax.text(t, y, str(at_risk(c.km, t)), fontsize=8, ha="center", va="center", color=color)
        ax.tick_params(labelbottom=False)
    else:
        ax.set_xlabel("turn")
    return fig


def render(fig: Figure, fmt: str) -> bytes:
    """The figure as PNG or SVG bytes, without timestamps (same input, same bytes)."""
    buf = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    with mpl.rc_context({"svg.hashsalt": "ncpbench", "svg.fonttype": "path"}):
        fig.savefig(buf, format=fmt, dpi=120, metadata=metadata)
    return buf.getvalue()


def write_survival_plot(curves: Sequence[Curve], out_dir: Path, stem: str = "survival",
                        risk_at: Sequence[int] = ()) -> tuple[Path, Path, bytes]:
    """Write `stem`.png and `stem`.svg; also return the PNG bytes (for embedding)."""
    fig = survival_figure(curves, risk_at=risk_at)
    png, svg = render(fig, "png"), render(fig, "svg")
    png_path, svg_path = out_dir / f"{stem}.png", out_dir / f"{stem}.svg"
    png_path.write_bytes(png)
    svg_path.write_bytes(svg)
    return png_path, svg_path, png
