"""DCQCN's numbers and picture for one run, from the raw files the run wrote (testbed.workloads.dcqcn):

* ``dcqcn.csv`` (``host, counter, value``): each host's counters of the eBPF notification and reaction points at
  the run's end (the ``stats`` map: ce_seen, cnp_sent, cnp_suppressed, cnp_received, cnp_ignored, rate_cuts,
  paced_packets, unknown_qp, cnp_failed);
* ``dcqcn_rates.csv``: every mapped QP's rate state every 50 ms (analysis.fairness reads it into Jain's index).

:func:`dcqcn_metrics` is the one definition of the summary's ``dcqcn_*`` keys; :func:`plot_rates` draws each
sending QP's current rate over time above Jain's index over time (the report's DCQCN panel).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .fairness import jain_over_time

#: the counters summed over the hosts into the summary (dcqcn_<name>)
TOTALS = ("ce_seen", "cnp_sent", "cnp_suppressed", "cnp_received", "cnp_ignored", "rate_cuts", "paced_packets",
          "unknown_qp", "cnp_failed")
#: Jain's index is summarised over this last fraction of the run's samples (the converged part)
LAST_FRACTION = 1 / 3


def flows(rates: pd.DataFrame) -> pd.DataFrame:
    """The rows of QPs that sent into a congested queue (received at least one CNP): the flows DCQCN governed.
    Every mapped QP has a rate state, the receiving end's too, idle at the line rate."""
    if rates.empty:
        return rates
    key = rates["host"].astype(str) + ">" + rates["peer"].astype(str) + "/" + rates["rqpn"].astype(str)
    return rates.assign(flow=key)[key.map(rates.groupby(key)["cnp_received"].max()) > 0]


def jain_last(rates: pd.DataFrame, bin_s: float = 0.5, fraction: float = LAST_FRACTION) -> float:
    """Mean Jain's index over the bins of the last ``fraction`` of the run with at least two flows (NaN when no
    bin had two)."""
    j = jain_over_time(rates, bin_s=bin_s)
    j = j[j["flows"] >= 2]
    if j.empty:
        return math.nan
    start = float(j["t_s"].min()) + (float(j["t_s"].max()) - float(j["t_s"].min())) * (1 - fraction)
    return float(j[j["t_s"] >= start]["jain"].mean())


def dcqcn_metrics(counters: pd.DataFrame, rates: pd.DataFrame) -> dict:
    """The summary's dcqcn_* keys: the counters summed over the hosts, per host the CNPs sent/received and the
    cuts, the flows' lowest and last rates, Jain's index over the last third. Empty without dcqcn.csv rows."""
    if counters.empty:
        return {}
    by = counters.groupby(["host", "counter"])["value"].sum()
    out: dict = {}
    for name in TOTALS:
        out[f"dcqcn_{name}"] = int(counters.loc[counters["counter"] == name, "value"].sum())
    hosts = sorted(counters["host"].astype(str).unique())
    for name in ("cnp_sent", "cnp_received", "rate_cuts"):
        out[f"dcqcn_{name}_by_host"] = "; ".join(f"{h}={int(by.get((h, name), 0))}" for h in hosts
                                                 if by.get((h, name), 0))
    f = flows(rates)
    out["dcqcn_flows"] = int(f["flow"].nunique()) if len(f) else 0
    if len(f):
        last = f.sort_values("t_s").groupby("flow").tail(1)
        out["dcqcn_rate_kbps_min"] = int(f["rc_kbps"].min())
        out["dcqcn_rate_kbps_last_mean"] = float(last["rc_kbps"].mean())
    j = jain_last(rates)
    out["dcqcn_jain_last"] = None if math.isnan(j) else j
    return out


def plot_rates(rates: pd.DataFrame, path: str | Path, *, t0: float | None = None, bin_s: float = 0.5) -> Path:
    """Each flow's current rate Rc (Mbit/s) over time, and below it Jain's index over the flows per ``bin_s``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    f = flows(rates)
    t0 = float(rates["t_s"].min()) if t0 is None and len(rates) else (t0 or 0.0)
    for name, g in (f.groupby("flow") if len(f) else []):
        top.plot(g["t_s"] - t0, g["rc_kbps"] / 1e3, label=name, linewidth=1)
    top.set_ylabel("Rc (Mbit/s)")
    top.set_title("DCQCN: rate of each QP that received CNPs")
    if len(f) and f["flow"].nunique() <= 8:
        top.legend(fontsize="small")
    j = jain_over_time(rates, bin_s=bin_s)
    if len(j):
        first = float(rates["t_s"].min()) - t0
        bottom.step(j["t_s"] + first, j["jain"], where="post")
    bottom.set_ylim(0, 1.05)
    bottom.set_ylabel("Jain's index")
    bottom.set_xlabel("time (s)")
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


__all__ = ["TOTALS", "dcqcn_metrics", "flows", "jain_last", "plot_rates"]
