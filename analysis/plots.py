"""PNG plots for run analysis (matplotlib, Agg canvas; never touches pyplot's global state).

Each function takes DataFrames / values and an output path, writes one PNG and returns the path.
Times are drawn relative to ``t0`` (default: the earliest timestamp plotted) in seconds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .metrics import GOOD_ABOVE, POOR_BELOW, nearest_rank, pause_intervals, rank_timeline, scaling_verdict, step_times

__all__ = ["plot_cdf", "plot_metric_vs_param", "plot_pause_timeline", "plot_queue_occupancy", "plot_rank_timeline",
           "plot_scaling_efficiency", "shade_faults"]

#: colours of the per-rank timeline (kinds of :func:`analysis.metrics.rank_timeline`)
TIMELINE_COLOURS = {"compute": "tab:green", "wait": "tab:red", "transfer": "tab:blue"}
#: what each colour of the per-rank timeline means, printed under it
TIMELINE_CAPTION = ("green: compute (between ops);  red: in the op, waiting for the last rank to join it;  "
                    "blue: transfer (every rank joined, data moving)")
#: most intervals drawn per rank and kind (closer ones are merged beyond this, as the report merges op phases)
TIMELINE_MAX_BARS = 2000

_VERDICT_COLOURS = {"poor": "tab:red", "marginal": "tab:orange", "good": "tab:green", "n/a": "tab:gray"}


def _new(figsize=(7.0, 4.0)) -> tuple[Figure, object]:
    fig = Figure(figsize=figsize, dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def _empty_note(ax, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def plot_cdf(samples: Sequence[float] | Mapping[str, Sequence[float]], path: str | Path, *,
             xlabel: str = "collective completion time (ms)", title: str = "CDF", mark_tails: bool = True,
             lines: Mapping[str, float] | None = None) -> Path:
    """Empirical CDF of one sample or several (``{label: values}``), with p50/p99 marked per series.

    The legend shows ``n`` for each series: a p99 from fewer than 100 samples is just the max. ``lines``:
    labelled vertical reference lines in black (e.g. ``{"ideal": 32, "ideal + RTOmin": 232}``), each named at
    the top of the axes, so a reader sees which samples sit one retransmission timeout away from the ideal.
    """
    fig, ax = _new()
    for i, (name, x) in enumerate((lines or {}).items()):
        ax.axvline(x, color="black", linestyle=("-", "-.", "--")[i % 3], linewidth=1.0)
        ax.text(x, 0.03, f"{name} {x:g} ", rotation=90, fontsize="small", transform=ax.get_xaxis_transform(),
                va="bottom", ha="right")
    series = samples if isinstance(samples, Mapping) else {"": samples}
    drawn = False
    for label, vals in series.items():
        x = np.sort(np.asarray(vals, dtype=float))
        x = x[~np.isnan(x)]
        if x.size == 0:
            continue
        y = np.arange(1, x.size + 1) / x.size
        line = ax.step(x, y, where="post", label=f"{label} (n={x.size})".strip())[0]
        if mark_tails:
            for q, ls in ((0.5, ":"), (0.99, "--")):
                ax.axvline(nearest_rank(x, q), color=line.get_color(), linestyle=ls, linewidth=0.8)
        drawn = True
    if not drawn:
        _empty_note(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of samples")
    ax.set_ylim(0, 1.02)
    if lines and drawn:
        lo, hi = ax.get_xlim()
        ax.set_xlim(min(lo, *lines.values()) - 0.02 * (hi - lo), max(hi, *(v * 1.08 for v in lines.values())))
    ax.set_title(title + ("  (dotted p50, dashed p99)" if mark_tails and drawn else ""))
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(loc="upper left" if lines else "lower right", fontsize="small")  # upper left: above a CDF
    return _save(fig, path)


def plot_queue_occupancy(queues: pd.DataFrame, path: str | Path, *, ports: Sequence[str] | None = None,
                         ops: pd.DataFrame | None = None, t0: float | None = None, max_ports: int = 4,
                         title: str = "queue occupancy", thresholds: Sequence[tuple[str, float]] = (),
                         events: pd.DataFrame | None = None, faults: pd.DataFrame | None = None,
                         ylim_bytes: float | None = None, phase_name: str = "op lifetimes") -> Path:
    """Backlog (kB, summed over classes) over time per port, with phases (op or round lifetimes) shaded in
    alternating colours so back-to-back phases stay apart.

    ``ports``: ``"node:port"`` labels to draw (default: the ``max_ports`` ports with the highest peak; more than
    ``max_ports`` lines make an unreadable plot). ``ops``: ``start_s``/``end_s`` per phase. ``thresholds``:
    ``(label, bytes)`` drawn as horizontal lines (the buffer, ECN K or RED min/max, PFC XOFF/XON: the levels at
    which the queue drops, marks or pauses). ``events``: ``t_s, kind`` (``drops`` / ``marks``) drawn as ticks
    at the top of the axes at their times. ``ylim_bytes``: the y-range's top (the buffer), so a slow-start spike
    above it does not flatten the rest; a clipped peak is noted in the title. The legend sits outside the axes.
    """
    fig, ax = _new((10.0, 4.2))
    if queues.empty:
        _empty_note(ax)
        return _save(fig, path)
    per_t = queues.groupby(["node", "port", "t_s"], sort=True)["backlog_bytes"].sum().reset_index()
    per_t["label"] = per_t["node"].astype(str) + ":" + per_t["port"].astype(str)
    if ports is None:
        ports = list(per_t.groupby("label")["backlog_bytes"].max().sort_values(ascending=False).index[:max_ports])
    t0 = float(per_t["t_s"].min()) if t0 is None else t0
    if ops is not None and len(ops):
        for k, (s, e) in enumerate(zip(ops["start_s"], ops["end_s"])):
            ax.axvspan(s - t0, e - t0, color="tab:blue" if k % 2 == 0 else "tab:green", alpha=0.10, linewidth=0)
    shade_faults(ax, faults, t0)
    peak = 0.0
    for label in ports:
        d = per_t[per_t["label"] == label]
        peak = max(peak, float(d["backlog_bytes"].max()) if len(d) else 0.0)
        ax.step(d["t_s"] - t0, d["backlog_bytes"] / 1e3, where="post", label=label, linewidth=1)
    styles = ("-", "--", "-.", ":")
    for k, (name, level) in enumerate(thresholds):
        ax.axhline(level / 1e3, color="black", linestyle=styles[k % len(styles)], linewidth=0.9,
                   label=f"{name} ({level / 1e3:g} kB)")
    _event_ticks(ax, events, t0)
    clipped = ""
    if ylim_bytes:  # the ticks (at 0.91-0.97 of the axes) sit above the buffer line (at 1/1.12 = 0.89)
        ax.set_ylim(0, ylim_bytes * 1.12 / 1e3)
        if peak > ylim_bytes * 1.12:
            clipped = f"; peak {peak / 1e3:.0f} kB clipped"
    elif events is not None and len(events):
        ax.set_ylim(0, max(ax.get_ylim()[1], 1e-3) * 1.2)  # room for the ticks above the data
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("backlog (kB)")
    shaded = f"shaded: {phase_name}" if ops is not None and len(ops) else ""
    ax.set_title(title + (f"  ({'; '.join(x for x in (shaded, clipped.lstrip('; ')) if x)})" if shaded or clipped
                          else ""), fontsize="medium")
    ax.grid(True, alpha=0.3)
    if len(ports) or len(thresholds):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)
    return _save(fig, path)


#: how queue events are drawn: (marker, colour, height in axes coordinates)
_EVENT_STYLE = {"drops": ("v", "tab:red", 0.965), "marks": ("|", "tab:orange", 0.915)}


def _event_ticks(ax, events: pd.DataFrame | None, t0: float, most: int = 2000) -> None:
    """Drops and ECN marks as ticks at the top of the axes, one per sampled increase (at most ``most`` per kind:
    the largest increases), labelled with the total."""
    if events is None or events.empty:
        return
    for kind, (marker, colour, y) in _EVENT_STYLE.items():
        e = events[events["kind"] == kind]
        if e.empty:
            continue
        total = float(e["count"].sum()) if "count" in e.columns else len(e)
        if len(e) > most:
            e = e.nlargest(most, "count") if "count" in e.columns else e.iloc[:: len(e) // most + 1]
        ax.plot(e["t_s"] - t0, np.full(len(e), y), linestyle="none", marker=marker, color=colour, markersize=7,
                markeredgewidth=1.5,
                transform=ax.get_xaxis_transform(), label=f"{kind} ({total:g})", clip_on=False)


def plot_pause_timeline(pfc: pd.DataFrame, path: str | Path, *, run_end: float | None = None,
                        t0: float | None = None, title: str = "PFC pause timeline") -> Path:
    """One row per (link, prio); a bar for each pause interval (red if never resumed before ``run_end``)."""
    fig, ax = _new((9.0, 3.5))
    if pfc.empty:
        _empty_note(ax, "no PFC events")
        return _save(fig, path)
    run_end = float(pfc["t_s"].max()) if run_end is None else run_end
    iv = pause_intervals(pfc, run_end)
    t0 = float(pfc["t_s"].min()) if t0 is None else t0
    keys = sorted({(n, p, int(r)) for n, p, r in zip(pfc["node"], pfc["port"], pfc["prio"])})
    for y, (node, port, prio) in enumerate(keys):
        sel = iv[(iv["node"] == node) & (iv["port"] == port) & (iv["prio"] == prio)]
        for s, e, open_ in zip(sel["start_s"], sel["end_s"], sel["open"]):
            ax.broken_barh([(s - t0, max(e - s, 1e-9))], (y - 0.4, 0.8),
                           facecolors="tab:red" if open_ else "tab:orange")
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"{n}:{p} prio {r}" for n, p, r in keys], fontsize="small")
    ax.set_ylim(-0.6, len(keys) - 0.4)
    ax.set_xlim(0, max(run_end - t0, 1e-9))
    ax.set_xlabel("time (s)")
    ax.set_title(title + "  (red: still paused at run end)")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def _merge_bars(bars: list[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    """(start, width) bars merged across the smallest gaps until at most ``limit`` remain (a long run stays
    drawable; every busy instant stays covered)."""
    if len(bars) <= limit:
        return bars
    iv = sorted((s, s + w) for s, w in bars)
    gaps = sorted(iv[i + 1][0] - iv[i][1] for i in range(len(iv) - 1))
    cut = gaps[len(iv) - limit - 1]
    out = [list(iv[0])]
    for s, e in iv[1:]:
        if s - out[-1][1] <= cut:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e - s) for s, e in out]


def shade_faults(ax, faults: pd.DataFrame | None, t0: float) -> None:
    """Draw fault intervals (:func:`analysis.faults.fault_intervals`) as hatched red spans, each labelled at the
    top with its target and what it was (down, withdrawn, slow, impaired)."""
    if faults is None or faults.empty:
        return
    colours = {"down": "tab:red", "withdrawn": "tab:orange", "slow": "tab:purple", "impaired": "tab:brown"}
    for r in faults.itertuples(index=False):
        c = colours.get(r.what, "tab:red")
        ax.axvspan(r.start_s - t0, r.end_s - t0, facecolor=c, alpha=0.12, hatch="//", edgecolor=c, linewidth=0)
        ax.text(r.start_s - t0, 1.0, f" {r.target} {r.what}", transform=ax.get_xaxis_transform(), fontsize="x-small",
                color=c, va="top", rotation=90 if len(faults) > 4 else 0)


def plot_rank_timeline(ops: pd.DataFrame, path: str | Path, *, t0: float | None = None,
                       title: str = "per-rank timeline", faults: pd.DataFrame | None = None,
                       groups: Mapping[str, Sequence[Sequence[int]]] | None = None) -> Path:
    """One row per rank (``broken_barh``): compute (green), waiting for the slowest peer to join the op (red) and
    transfer once every rank has joined (blue), :func:`analysis.metrics.rank_timeline`; dotted lines at each
    iteration's end (the slowest rank's); :data:`TIMELINE_CAPTION` under the axes. A straggler is the row with
    the long green bars and no red, while its peers' red bars grow; in a run without one the ops are all blue.

    ``t0``: the time origin, in the clock of ops.csv; pass the run's start (``Run.time_window()[0]``, the
    manifest's ``t0_monotonic``) to share the axis with the queue and pause plots. Default: the first interval.
    ``groups``: the manifest's ``op_groups``; a rank in a grouped op waits only for its own group's last rank."""
    tl = rank_timeline(ops, groups)
    ranks = sorted(tl["rank"].unique().tolist()) if len(tl) else []
    fig, ax = _new((9.0, max(2.5, 0.45 * len(ranks) + 1.7)))
    if tl.empty:
        _empty_note(ax, "no ops")
        return _save(fig, path)
    at_run_start = t0 is not None
    t0 = float(tl["start_s"].min()) if t0 is None else t0
    for y, rank in enumerate(ranks):
        d = tl[tl["rank"] == rank]
        for kind, colour in TIMELINE_COLOURS.items():
            k = d[d["kind"] == kind]
            bars = [(s - t0, max(e - s, 1e-9)) for s, e in zip(k["start_s"], k["end_s"])]
            if bars:
                ax.broken_barh(_merge_bars(bars, TIMELINE_MAX_BARS), (y - 0.35, 0.7), facecolors=colour)
    shade_faults(ax, faults, t0)
    st = step_times(ops)
    for e in st["end_s"].head(200):
        ax.axvline(e - t0, color="gray", linestyle=":", linewidth=0.7)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks], fontsize="small")
    ax.set_ylim(-0.6, len(ranks) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("time since run start (s)" if at_run_start else "time since the first op (s)")
    ax.set_title(title + ("  (hatched: faults)" if faults is not None and len(faults) else ""), loc="left")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in TIMELINE_COLOURS.items()], loc="lower right",
              bbox_to_anchor=(1.0, 1.0), fontsize="small", ncol=3, frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.text(0.01, 0.01, TIMELINE_CAPTION + "\ndotted lines: iteration ends (the slowest rank's)", fontsize="small",
             color="dimgray")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def plot_metric_vs_param(x: Sequence[float], series: Mapping[str, Sequence[float]] | Sequence[float],
                         path: str | Path, *, xlabel: str = "parameter", ylabel: str = "metric",
                         title: str = "", logx: bool = False) -> Path:
    """A metric (or several, e.g. ``{"p50": ..., "p99": ...}``) against a swept parameter."""
    fig, ax = _new()
    series = series if isinstance(series, Mapping) else {ylabel: series}
    for label, ys in series.items():
        ax.plot(list(x), list(ys), marker="o", label=label)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize="small")
    return _save(fig, path)


def plot_scaling_efficiency(labels: Sequence[str], efficiencies: Sequence[float], path: str | Path, *,
                            title: str = "scaling efficiency") -> Path:
    """Bars of scaling efficiency coloured by verdict, with the 0.75 / 0.80 thresholds drawn."""
    fig, ax = _new()
    effs = [float(e) for e in efficiencies]
    colours = [_VERDICT_COLOURS[scaling_verdict(e)] for e in effs]
    ax.bar(range(len(effs)), [0.0 if math.isnan(e) else e for e in effs], color=colours)
    ax.axhline(POOR_BELOW, color="tab:red", linestyle="--", linewidth=0.8, label=f"{POOR_BELOW:.2f} (poor below)")
    ax.axhline(GOOD_ABOVE, color="tab:green", linestyle="--", linewidth=0.8, label=f"{GOOD_ABOVE:.2f} (good above)")
    ax.set_xticks(range(len(effs)))
    ax.set_xticklabels(list(labels), fontsize="small")
    ax.set_ylabel("efficiency")
    top = max([1.05] + [e * 1.05 for e in effs if not math.isnan(e)])
    ax.set_ylim(0, top)
    ax.set_title(title)
    ax.legend(fontsize="small", loc="lower right")
    return _save(fig, path)
