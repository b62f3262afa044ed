"""The failure budget for jitter (the seed article, section 04 part 1): how much compute-time variance a
synchronized job absorbs before its throughput falls below a bar (default 0.75, the article's 75-80% efficiency).

A data-parallel step ends when the *last* rank's compute and the collective after it are done, so every rank
waits for the slowest one. Two ways a step's compute varies, each a model with a closed form for the expected
step time (``c`` the configured compute per rank, ``T0`` the measured step without variance, ``N`` ranks):

* **jitter** ``j``: each rank's compute is uniform in ``[c(1-j), c(1+j)]``, independently per iteration; the step
  waits for the maximum of N such draws, whose mean is ``c(1 + j(N-1)/(N+1))`` (the order statistic of a uniform),
  so ``T(j) = T0 + c j (N-1)/(N+1)``;
* **stragglers**: ``s`` straggler ranks, each slowed by ``f`` in an iteration with probability ``p``; the step
  takes ``f c`` when at least one straggles, so ``T(p) = T0 + (1 - (1-p)^s)(f-1) c``.

Efficiency is throughput against the job without variance: ``T0 / T`` on the *mean* step time (a job's
throughput is iterations over total time, so a rare straggler that leaves the median step alone still counts).
Measured efficiency comes from repeated runs: ``analysis.stats.compare`` of each run's mean step at the base and at
the point (the bootstrap interval of the ratio of medians); a point is *absorbed* when the interval's low end is at
or above the bar, *over budget* when its high end is below it, and otherwise *near the bar* (more runs would tell).
The budget of an axis is the largest value absorbed before the first value that is not."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis import stats

ABSORBED = "absorbed"
OVER = "over budget"
NEAR = "near the bar"


def expected_step_jitter_ms(base_step_ms: float, compute_ms: float, ranks: int, jitter: float) -> float:
    """T0 + c j (N-1)/(N+1): the mean of the maximum of N uniform compute times added to the base step."""
    return base_step_ms + compute_ms * jitter * (ranks - 1) / (ranks + 1)


def expected_step_straggler_ms(base_step_ms: float, compute_ms: float, prob: float, factor: float,
                               stragglers: int) -> float:
    """T0 + (1 - (1-p)^s)(f-1) c: the step takes f c whenever at least one of s stragglers straggles."""
    return base_step_ms + (1.0 - (1.0 - prob) ** stragglers) * (factor - 1.0) * compute_ms


def verdict(low: float, high: float, bar: float) -> str:
    if low >= bar:
        return ABSORBED
    if high < bar:
        return OVER
    return NEAR


@dataclass(frozen=True)
class Point:
    """One swept value: its axis ("jitter" or "straggler_prob"), the value, the measured efficiency with its
    interval, what the model expects, and the verdict against the bar."""

    axis: str
    value: float
    step_ms_mean: float
    efficiency: float
    low: float
    high: float
    expected: float
    verdict: str
    runs: int


def measure(axis: str, value: float, base_steps: Sequence[float], steps: Sequence[float], expected_step_ms: float,
            bar: float) -> Point:
    """A point's efficiency (median base mean step / median point mean step, with the bootstrap interval of that
    ratio over the runs) against the bar, and the model's expected efficiency."""
    d = stats.compare(base_steps, steps)
    base = stats.estimate(base_steps).median
    est = stats.estimate(steps)
    expected = base / expected_step_ms if expected_step_ms > 0 else math.nan
    return Point(axis, float(value), est.median, d.ratio, d.ratio_low, d.ratio_high, expected,
                 verdict(d.ratio_low, d.ratio_high, bar), est.n)


@dataclass(frozen=True)
class Budget:
    axis: str
    absorbed: float | None   # the largest value absorbed before the first that is not (None: not even the first)
    breaks: float | None     # the first value over budget (None: none was)
    unsure: float | None     # the first value near the bar before any over budget (None: none)


def budget(points: Iterable[Point]) -> Budget:
    """The knee of one axis, from its points in increasing order."""
    pts = sorted(points, key=lambda p: p.value)
    axis = pts[0].axis if pts else ""
    absorbed = breaks = unsure = None
    for p in pts:
        if p.verdict == ABSORBED and unsure is None and breaks is None:
            absorbed = p.value
        elif p.verdict == NEAR and unsure is None and breaks is None:
            unsure = p.value
        elif p.verdict == OVER and breaks is None:
            breaks = p.value
    return Budget(axis, absorbed, breaks, unsure)


def describe(b: Budget, points: Sequence[Point], bar: float, what: str) -> str:
    """One sentence: how much of ``what`` the job absorbs, where it falls below the bar."""
    by = {p.value: p for p in points if p.axis == b.axis}

    def at(v: float) -> str:
        p = by[v]
        return f"efficiency {p.efficiency:.2f} [{p.low:.2f}, {p.high:.2f}], model {p.expected:.2f}"

    parts = []
    if b.absorbed is not None:
        parts.append(f"absorbs {what} up to {b.absorbed:g} ({at(b.absorbed)})")
    else:
        parts.append(f"absorbs none of the {what} swept")
    if b.unsure is not None:
        parts.append(f"is not yet told from the {bar:.2f} bar at {b.unsure:g} ({at(b.unsure)}; more runs would "
                     "tell)")
    if b.breaks is not None:
        parts.append(f"falls below {bar:.2f} at {b.breaks:g} ({at(b.breaks)})")
    elif b.unsure is None:
        parts.append(f"stays above {bar:.2f} over the whole sweep")
    return "The job " + ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1] + "."


AXIS_LABEL = {"jitter": "compute jitter j (uniform in [1-j, 1+j] x compute_ms)",
              "straggler_prob": "probability a straggler straggles in an iteration"}


def plot(points: Sequence[Point], bar: float, path: str | Path) -> Path:
    """Efficiency against each axis's value: the measured medians with their intervals, the model's expectation
    (dashed) and the bar; one panel per axis."""
    axes = [a for a in ("jitter", "straggler_prob") if any(p.axis == a for p in points)]
    fig = Figure(figsize=(6.5 * max(1, len(axes)), 4.0))
    FigureCanvasAgg(fig)
    for i, axis in enumerate(axes, 1):
        ax = fig.add_subplot(1, len(axes), i)
        pts = sorted((p for p in points if p.axis == axis), key=lambda p: p.value)
        xs = [0.0] + [p.value for p in pts]
        eff = [1.0] + [p.efficiency for p in pts]
        err = [[0.0] + [max(0.0, p.efficiency - p.low) for p in pts], [0.0] + [max(0.0, p.high - p.efficiency)
                                                                                for p in pts]]
        ax.errorbar(xs, eff, yerr=err, fmt="o-", capsize=4, label="measured (median, 95% CI)")
        ax.plot(xs, [1.0] + [p.expected for p in pts], "--", color="grey", label="model (waits for the slowest rank)")
        ax.axhline(bar, color="tab:red", lw=1, label=f"bar {bar:.2f}")
        ax.set_xlabel(AXIS_LABEL[axis])
        ax.set_ylabel("efficiency (step without variance / step)")
        ax.set_ylim(0, 1.1)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


__all__ = ["ABSORBED", "AXIS_LABEL", "Budget", "NEAR", "OVER", "Point", "budget", "describe",
           "expected_step_jitter_ms", "expected_step_straggler_ms", "measure", "plot", "verdict"]
