"""The report's Ultra Ethernet panel (matplotlib, Agg canvas): how each host's UET transport recovered its losses,
and, when the switch ports trimmed, what each port trimmed and how full its trimming program's virtual queue got.

* top: per host (uet.csv, :func:`analysis.uet.per_host`), the losses it found by cause, stacked: its retransmission
  timer expired (a loss found by timeout, after at least the timer's floor), RACK's time rule on a SACK, a NACK of
  a trimmed packet (:data:`analysis.uet.CAUSES`); beside them, hatched, the trimmed headers it received as a
  receiver (each should be answered by a NACK and one NACK resend at its sender);
* bottom (trim.csv, :func:`analysis.uet.per_port`): per switch port, the packets its program cut to their headers
  (bars) and its virtual queue's peak (diamonds, right axis, labelled in kB), as a share of the port's own buffer
  with its trimming threshold beside it (a port trims while its virtual queue is above the threshold; the buffer
  caps it) when trim.csv has the buffers of every port drawn, else in kB without the threshold.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .load import Run
from .uet import CAUSES, per_host, per_port

__all__ = ["CAUSE_COLOURS", "MOST_BARS", "MOST_PORTS", "plot_uet", "uet_panel"]

#: colours of the causes (timer: the slow one, red), in :data:`analysis.uet.CAUSES`' order
CAUSE_COLOURS = ("tab:red", "tab:orange", "tab:blue")
#: most hosts drawn (the busiest; the caption's counts say how many there are)
MOST_BARS = 16
#: most switch ports drawn (those that trimmed most, then those whose virtual queue peaked highest)
MOST_PORTS = 8


def _busiest(t: pd.DataFrame, cols: list[str], most: int) -> pd.DataFrame:
    """At most ``most`` rows of ``t``, those with the largest sum over ``cols``, in their original order."""
    if len(t) <= most:
        return t
    keep = t[cols].sum(axis=1).sort_values(ascending=False, kind="stable").index[:most]
    return t[t.index.isin(keep)]


def _hosts(ax, counters: pd.DataFrame, most: int) -> None:
    t = per_host(counters)
    cols = [c for c, _ in CAUSES]
    shown = _busiest(t, [*cols, "trimmed_received"], most)
    x, w = np.arange(len(shown)), 0.4
    bottom = np.zeros(len(shown))
    for (c, what), colour in zip(CAUSES, CAUSE_COLOURS):
        v = shown[c].to_numpy(float)
        ax.bar(x - w / 2, v, w, bottom=bottom, color=colour, label=f"lost, found by {what}")
        bottom += v
    ax.bar(x + w / 2, shown["trimmed_received"].to_numpy(float), w, color="lightgray", edgecolor="dimgray",
           hatch="//", label="trimmed headers received")
    for xi, top, n in zip(x, bottom, shown["rto_events"]):
        if n:  # how often the timer expired: one expiry may find several packets lost
            ax.annotate(f"{n} timer expir{'y' if n == 1 else 'ies'}", (xi - w / 2, top), ha="center", va="bottom",
                        fontsize="x-small", xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, [str(h) for h in shown.index], rotation=30 if len(shown) > 8 else 0, fontsize="small")
    ax.set_ylabel("packets")
    more = f" ({len(shown)} of {len(t)} hosts, the busiest)" if len(shown) < len(t) else ""
    ax.set_title(f"UET per host: losses found by cause, trimmed headers received{more}", fontsize="medium")
    ax.legend(fontsize="small", ncol=2)
    if not (shown[[*cols, "trimmed_received"]].to_numpy().any()):
        ax.text(0.5, 0.5, "no losses, nothing trimmed", ha="center", va="center", transform=ax.transAxes,
                color="gray")


def _ports(ax, trim: pd.DataFrame, most: int) -> bool:
    """Packets trimmed per port (bars) and, on the right axis, its virtual queue's peak (diamonds, labelled in kB):
    as a share of the port's own buffer with its threshold (dark grey dash) when trim.csv has the buffers of every
    port shown (ports of different buffers on one scale), else in kB without the threshold. Returns whether it drew
    the shares (the caption says what was drawn)."""
    t = per_port(trim)
    shown = t.head(most)
    x = np.arange(len(shown))
    ax.bar(x, shown["trimmed_packets"].to_numpy(float), 0.6, color="tab:purple", label="packets trimmed")
    ax.set_xticks(x, shown["port"].tolist(), rotation=30 if len(shown) > 6 else 0, fontsize="small")
    ax.set_ylabel("packets trimmed")
    more = f" ({len(shown)} of {len(t)} ports, most trimmed first)" if len(shown) < len(t) else ""
    ax.set_title(f"switch ports: packets trimmed, virtual queue peak{more}", fontsize="medium")
    right = ax.twinx()
    buf = shown["buffer_bytes"].to_numpy(float)
    share = bool(len(buf)) and bool((buf > 0).all())
    scale = 100 / buf if share else np.full(len(shown), 1e-3)
    peak = shown["vq_peak_bytes"].to_numpy(float)
    right.plot(x, peak * scale, "D", color="black", label="virtual queue peak")
    for xi, y, b in zip(x, peak * scale, peak):
        right.annotate(f"{b / 1e3:.1f} kB", (xi, y), xytext=(6, 0), textcoords="offset points", va="center",
                       fontsize="x-small")
    thr = shown["threshold_bytes"].to_numpy(float)
    if share and (thr > 0).any():
        right.plot(x[thr > 0], (thr * scale)[thr > 0], "_", color="dimgray", markersize=28, markeredgewidth=2.5,
                   label="trimming threshold")
    right.set_ylabel("virtual queue peak (% of the port's buffer)" if share else "virtual queue peak (kB)")
    right.set_ylim(0, 105 if share else None)
    handles = [h for a in (ax, right) for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles, [h.get_label() for h in handles], fontsize="small", loc="upper right")
    return share


def plot_uet(counters: pd.DataFrame, trim: pd.DataFrame, path: str | Path, *, most: int = MOST_BARS,
             most_ports: int = MOST_PORTS) -> tuple[Path, bool]:
    """The UET panel (see the module docstring): one row for uet.csv's hosts, a second for trim.csv's ports when it
    has rows. Returns the PNG's path and whether the ports' row drew its peaks as shares of their buffers with
    their thresholds (False: in kB, or no ports' row)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    rows = 2 if len(trim) else 1
    fig = Figure(figsize=(9.0, 3.3 * rows + 0.4), dpi=100)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(rows, 1, 1 + i) for i in range(rows)]
    _hosts(axes[0], counters, most)
    share = _ports(axes[1], trim, most_ports) if rows == 2 else False
    for ax in axes:  # packet counts (not the twin axis's kB)
        ax.grid(True, axis="y", alpha=0.3)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path, share


def uet_panel(run: Run, path: str | Path) -> tuple[Path, str]:
    """The report's UET panel for a run with uet.csv rows: :func:`plot_uet` and its caption."""
    p, share = plot_uet(run.uet, run.trim, path)
    hosts = run.uet["host"].nunique()
    caption = (f"Ultra Ethernet (uet.csv, {hosts} host{'' if hosts == 1 else 's'}): per host, the losses its senders "
               "found, stacked by how: their retransmission timer expired (red; such a loss waited at least the "
               "timer's floor), the SACK rule (orange), a NACK of a trimmed packet (blue); beside them (hatched) the "
               "trimmed headers it received, each to be answered by one NACK resend at its sender")
    if len(run.trim):
        n = len(per_port(run.trim))
        caption += (f". Below (trim.csv, {n} switch port{' carried' if n == 1 else 's carried'} the trimming "
                    "program): the packets each "
                    "port cut to their headers (bars) and its virtual queue's peak (diamonds, right axis"
                    + (", as a share of the port's own buffer, the virtual queue's cap; dark grey dash: the port's "
                       "trimming threshold" if share else ", in kB") + ")")
    return p, caption
