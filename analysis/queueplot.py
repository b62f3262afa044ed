"""The report's queue plot: one panel per port, each with its own queue's limits and its own events.

A switch port's queue is one kernel qdisc (an HTB leaf's bfifo or pfifo, or RED / step marking): its backlog is
drawn in the unit its buffer is sized in (packets for a pfifo, with an approximate kB axis on the right; kB for a
bfifo), with the levels at which *that* queue acts as horizontal lines (:func:`analysis.references.port_limits`:
buffer, ECN K or RED min/max, PFC XOFF/XON) and ticks at the top for what happened to it
(:func:`analysis.references.queue_ticks`: drops, ECN marks, PFC pauses, a sender's retransmission timeout). Panels
share the time axis (seconds since the run's start, as the per-rank timeline), so one sees which op built which
queue. :func:`queue_panels` is what the figure draws, as data (tested); :func:`plot_queue_ports` draws it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from .plots import shade_faults
from .references import PortLimits

__all__ = ["TICK_STYLE", "plot_queue_ports", "queue_panels"]

#: how each tick kind is drawn: (marker, colour, height in axes coordinates, legend name)
TICK_STYLE = {"drops": ("v", "tab:red", 0.965, "drops"), "marks": ("|", "tab:orange", 0.915, "ECN marks"),
              "pause": ("s", "tab:purple", 0.865, "PFC pause"), "rto": ("x", "black", 0.815, "RTO (sender done)")}
#: most ticks drawn per kind and panel (the largest counts)
MAX_TICKS = 500
_STYLES = ("-", "--", "-.", ":")


def queue_panels(queues: pd.DataFrame, ports: Sequence[str], limits: Mapping[str, PortLimits] | None = None,
                 ticks: pd.DataFrame | None = None) -> list[dict]:
    """Per port of ``ports``: ``port``, ``unit`` (``packets`` or ``kB``), ``t_s`` and ``y`` (the backlog summed over
    classes in that unit), ``lines`` (``(name, level)`` in that unit: only this port's), ``ticks`` (``{kind: t_s
    array}``: this port's and those that name no port; ``totals``: each kind's summed count), ``ylim`` (the buffer
    plus room for the ticks, or the peak's) and ``avpkt_bytes``."""
    has_packets = "backlog_packets" in queues.columns
    cols = ["backlog_bytes"] + (["backlog_packets"] if has_packets else [])
    per_t = queues.groupby(["node", "port", "t_s"], sort=True)[cols].sum().reset_index() if len(queues) else None
    out = []
    for label in ports:
        lim = (limits or {}).get(label) or PortLimits(source="parameters")
        packets = lim.unit == "packets" and has_packets
        if per_t is not None:
            node, _, port = label.partition(":")
            d = per_t[(per_t["node"] == node) & (per_t["port"] == port)]
        else:
            d = pd.DataFrame({"t_s": [], "backlog_bytes": [], "backlog_packets": []})
        y = d["backlog_packets"].to_numpy(float) if packets else d["backlog_bytes"].to_numpy(float) / 1e3
        lines = [(k, v if packets else (v * lim.avpkt_bytes if lim.unit == "packets" else v) / 1e3)
                 for k, v in lim.lines]
        mine: dict[str, np.ndarray] = {}
        totals: dict[str, float] = {}
        if ticks is not None and len(ticks):
            sel = ticks[(ticks["port"] == label) | (ticks["port"].fillna("") == "")]
            for kind, k in sel.groupby("kind", sort=False):
                totals[str(kind)] = float(k["count"].sum())
                k = k.nlargest(MAX_TICKS, "count") if len(k) > MAX_TICKS else k
                mine[str(kind)] = np.sort(k["t_s"].to_numpy(float))
        buf = next((v for k, v in lines if k == "buffer"), None)
        peak = float(y.max()) if y.size else 0.0
        ylim = buf * 1.25 if buf else max(peak, max((v for _, v in lines), default=0.0), 1e-3) * 1.3
        out.append({"port": label, "unit": "packets" if packets else "kB", "t_s": d["t_s"].to_numpy(float), "y": y,
                    "lines": lines, "ticks": mine, "totals": totals, "ylim": ylim, "clipped": peak > ylim, "peak": peak,
                    "avpkt_bytes": lim.avpkt_bytes, "source": lim.source})
    return out


def plot_queue_ports(queues: pd.DataFrame, path: str | Path, *, ports: Sequence[str],
                     limits: Mapping[str, PortLimits] | None = None, ticks: pd.DataFrame | None = None,
                     ops: pd.DataFrame | None = None, t0: float | None = None, faults: pd.DataFrame | None = None,
                     title: str = "queue occupancy", phase_name: str = "", panel_height_in: float = 1.7) -> Path:
    """The figure of :func:`queue_panels`: one panel per port, stacked on one time axis; ``ops``: phases
    (``start_s``/``end_s``) shaded in alternating colours; ``faults``: hatched spans; ``t0``: the time origin (the
    run's start, so the axis matches the per-rank timeline); ``panel_height_in``: each panel's height (inches)."""
    panels = queue_panels(queues, ports, limits, ticks)
    fig = Figure(figsize=(10.0, 1.0 + panel_height_in * max(len(panels), 1)), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(max(len(panels), 1), 1, sharex=True, squeeze=False)[:, 0]
    if not panels:
        axes[0].text(0.5, 0.5, "no data", ha="center", va="center", transform=axes[0].transAxes, color="gray")
    t0 = (float(queues["t_s"].min()) if len(queues) else 0.0) if t0 is None else t0
    for ax, p in zip(axes, panels):
        _panel(ax, p, ops, t0, faults)
    axes[-1].set_xlabel("time since run start (s)")
    shaded = f"shaded: {phase_name}" if ops is not None and len(ops) and phase_name else ""
    fig.suptitle(title + (f"  ({shaded})" if shaded else ""), fontsize="medium", x=0.01, ha="left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _panel(ax, p: dict, ops: pd.DataFrame | None, t0: float, faults: pd.DataFrame | None) -> None:
    """One port: phases, faults, its backlog, its own limits as lines, its events as ticks at the top."""
    if ops is not None and len(ops):
        for k, (s, e) in enumerate(zip(ops["start_s"], ops["end_s"])):
            ax.axvspan(s - t0, e - t0, color="tab:blue" if k % 2 == 0 else "tab:green", alpha=0.10, linewidth=0)
    shade_faults(ax, faults, t0)
    ax.step(p["t_s"] - t0, p["y"], where="post", linewidth=1, color="tab:blue", label="backlog")
    fmt = "{:g} pkt" if p["unit"] == "packets" else "{:g} kB"
    for k, (name, level) in enumerate(p["lines"]):
        ax.axhline(level, color="black", linestyle=_STYLES[k % len(_STYLES)], linewidth=0.9,
                   label=f"{name} ({fmt.format(round(level, 1))})")
    for kind, t in p["ticks"].items():
        marker, colour, y, name = TICK_STYLE.get(kind, ("o", "gray", 0.765, kind))
        total = p["totals"].get(kind, len(t))
        ax.plot(t - t0, np.full(len(t), y), linestyle="none", marker=marker, color=colour, markersize=6,
                markeredgewidth=1.4, transform=ax.get_xaxis_transform(), label=f"{name} ({total:g})", clip_on=False)
    ax.set_ylim(0, p["ylim"])
    ax.set_ylabel("packets" if p["unit"] == "packets" else "backlog (kB)", fontsize="small")
    if p["unit"] == "packets":
        avpkt = p["avpkt_bytes"]
        right = ax.secondary_yaxis("right", functions=(lambda x: x * avpkt / 1e3, lambda kb: kb * 1e3 / avpkt))
        right.set_ylabel(f"~kB ({avpkt:g} B packets)", fontsize="x-small")
    note = "; peak {:g} {} clipped".format(round(p["peak"], 1), p["unit"]) if p["clipped"] else ""
    src = "" if p["source"] == "topology" else " (limits: the run's parameters; this port's own are not recorded)"
    ax.set_title(f"{p['port']}{src}{note}", loc="left", fontsize="small")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.08 if p["unit"] == "packets" else 1.01, 1.0), fontsize="x-small",
              borderaxespad=0)
