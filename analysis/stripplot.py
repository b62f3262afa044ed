"""Distributions of a metric over repeated runs, side by side: a box (quartiles, whiskers to the extremes) with
every run drawn on it as a dot, and the median's confidence interval as a bar. One number per side hides what
decides whether a difference is real: how far apart the runs of one side already are.

matplotlib, Agg canvas only (never pyplot's global state), like :mod:`analysis.plots`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .stats import estimate

__all__ = ["plot_distributions"]

_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red")


def _panel(ax, metric: str, sides: Mapping[str, Sequence[float]], verdict: str) -> None:
    labels = list(sides)
    data = [np.asarray([v for v in sides[s] if v is not None and math.isfinite(v)], dtype=float) for s in labels]
    shown = [(i, d) for i, d in enumerate(data) if d.size]
    if shown:
        ax.boxplot([d for _, d in shown], positions=[i for i, _ in shown], widths=0.5, whis=(0, 100),
                   showfliers=False, medianprops={"color": "black"})
    rng = np.random.default_rng(1)  # a fixed jitter: the same folders give the same picture
    for i, d in shown:
        colour = _COLOURS[i % len(_COLOURS)]
        ax.scatter(i + rng.uniform(-0.12, 0.12, d.size), d, s=18, color=colour, alpha=0.8, zorder=3)
        e = estimate(d)
        if e.n >= 2:
            ax.errorbar(i + 0.33, e.median, yerr=[[e.median - e.low], [e.high - e.median]], fmt="D", color=colour,
                        capsize=3, markersize=4)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([f"{s}\n(n={d.size})" for s, d in zip(labels, data)], fontsize="small")
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_title(f"{metric}\n{verdict}" if verdict else metric, fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)


def plot_distributions(panels: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path, *,
                       verdicts: Mapping[str, str] | None = None, title: str = "") -> Path:
    """One panel per metric (``{metric: {side label: [value per run]}}``): box, runs as dots, the median's CI as a
    bar beside them; ``verdicts`` titles each panel (e.g. ``A > B``). Writes one PNG and returns its path."""
    names = list(panels)
    cols = min(3, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    fig = Figure(figsize=(3.6 * cols, 3.2 * rows), dpi=100)
    FigureCanvasAgg(fig)
    for k, metric in enumerate(names):
        ax = fig.add_subplot(rows, cols, k + 1)
        _panel(ax, metric, panels[metric], (verdicts or {}).get(metric, ""))
    if not names:
        ax = fig.add_subplot(1, 1, 1)
        ax.text(0.5, 0.5, "no metrics", ha="center", va="center", transform=ax.transAxes, color="gray")
    if title:
        fig.suptitle(title, fontsize="medium")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
