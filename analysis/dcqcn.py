"""DCQCN's numbers and picture for one run, from the raw files the run wrote (testbed.workloads.dcqcn):

* ``dcqcn.csv`` (``host, counter, value``): each host's counters of the eBPF notification and reaction points at
  the run's end (the ``stats`` map: ce_seen, cnp_sent, cnp_suppressed, cnp_received, cnp_ignored, rate_cuts,
  paced_packets, unknown_qp, cnp_failed) and, with pacing, of its fq (fq_drops, fq_throttled, fq_flows_plimit),
  read before the host's own leaf queues came back;
* ``dcqcn_rates.csv``: every mapped QP's rate state every 50 ms (analysis.fairness reads it into Jain's index).

:func:`dcqcn_metrics` is the one definition of the summary's ``dcqcn_*`` keys; :func:`plot_rates` draws each
sending QP's current rate over time above Jain's index over time (the report's DCQCN panel).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from .fairness import jain_index, jain_over_time

#: the counters summed over the hosts into the summary (dcqcn_<name>)
TOTALS = ("ce_seen", "cnp_sent", "cnp_suppressed", "cnp_received", "cnp_ignored", "rate_cuts", "paced_packets",
          "unknown_qp", "cnp_failed", "fq_drops", "fq_throttled", "fq_flows_plimit")
#: Jain's index is summarised over this last fraction of the run's samples (the converged part)
LAST_FRACTION = 1 / 3
#: the dcqcn_rates.csv columns of a QP's rate state: one that changed between two samples means the QP sent
STATE = ("rc_kbps", "rt_kbps", "alpha", "rate_cuts", "cnp_received")
#: Jain's index a bin must reach for its flows to count as sharing fairly (convergence: from then on, every bin)
FAIR_JAIN = 0.9


def flows(rates: pd.DataFrame) -> pd.DataFrame:
    """The rows of QPs that sent into a congested queue (received at least one CNP): the flows DCQCN governed.
    Every mapped QP has a rate state, the receiving end's too, idle at the line rate."""
    if rates.empty:
        return rates
    key = rates["host"].astype(str) + ">" + rates["peer"].astype(str) + "/" + rates["rqpn"].astype(str)
    return rates.assign(flow=key)[key.map(rates.groupby(key)["cnp_received"].max()) > 0]


def sending(rates: pd.DataFrame) -> pd.Series:
    """Per row of :func:`flows`: whether the flow was sending then, i.e. its rate state (Rc, Rt, alpha, cuts, CNPs
    received) changed since its previous sample. The programs advance a QP's state only on its own packets and
    CNPs (their timers are evaluated lazily), so an idle QP's row repeats the one before; the CSV has no per-QP
    packet count. A flow's first sample has nothing to compare with: not sending."""
    numeric = rates[list(STATE)].apply(pd.to_numeric, errors="coerce").assign(flow=rates["flow"], t_s=rates["t_s"])
    state = numeric.sort_values("t_s").groupby("flow")[list(STATE)]
    return state.diff().fillna(0).ne(0).any(axis=1).reindex(rates.index)


def jain_sending(rates: pd.DataFrame, bin_s: float = 0.5, origin_s: float | None = None) -> pd.DataFrame:
    """Jain's index per ``bin_s`` bin over the flows sending in it (:func:`sending` true for one of their samples
    there). Bins start at ``origin_s`` seconds after the first sample (default: the first sample; bins before it
    are left out). A flow counts from its first sending sample to its last (its span: a flow that ended keeps its
    last Rc in the map, a flow not started yet sits at the line rate), and each counted flow's mean Rc is taken
    only over the part of the bin inside every counted flow's span: a bin in which one flow starts or ends
    compares the flows over the time they both ran, not one's solo samples with the other's. Bins with fewer than
    two such flows are left out. Columns: t_s (the bin's start, from the first sample), flows, jain."""
    f = flows(rates)
    out = pd.DataFrame(columns=["t_s", "flows", "jain"])
    if f.empty:
        return out
    t0 = float(rates["t_s"].min())
    origin = 0.0 if origin_s is None else float(origin_s)
    f = f.assign(active=sending(f), bin=((f["t_s"] - t0 - origin) / bin_s + 1e-9) // 1)
    span = f[f["active"]].groupby("flow")["t_s"].agg(["min", "max"])  # from its first sending sample to its last
    f = f[f["flow"].isin(span.index) & (f["bin"] >= 0)]
    f = f[f["t_s"].between(f["flow"].map(span["min"]), f["flow"].map(span["max"]))]
    rows = []
    for b, g in f.groupby("bin"):
        live = g.groupby("flow")["active"].any()
        live = live[live].index
        if len(live) < 2:
            continue
        g = g[g["flow"].isin(live) & g["t_s"].between(span.loc[live, "min"].max(), span.loc[live, "max"].min())]
        rc = g.groupby("flow")["rc_kbps"].mean()
        if len(rc) >= 2:
            rows.append((origin + int(b) * bin_s, len(rc), jain_index(rc)))
    return pd.DataFrame(rows, columns=list(out.columns)) if rows else out


def jain_last(rates: pd.DataFrame, bin_s: float = 0.5, fraction: float = LAST_FRACTION,
              origin_s: float | None = None) -> float:
    """The summary's dcqcn_jain_last: the mean of :func:`jain_sending` (Jain's index of Rc over the flows sending
    in a bin, bins with two or more of them, from ``origin_s``) over the last ``fraction`` of the time those bins
    span. Bins where the flows were idle do not count: their Rc is frozen where the last cut left it (flows all idle
    at R_min would read 1.0). NaN when no bin had two flows sending."""
    return _last(jain_sending(rates, bin_s=bin_s, origin_s=origin_s), fraction)


def _last(j: pd.DataFrame, fraction: float) -> float:
    """The mean Jain's index of the bins of ``j`` in the last ``fraction`` of the time they span (NaN: no bin)."""
    if j.empty:
        return math.nan
    start = float(j["t_s"].min()) + (float(j["t_s"].max()) - float(j["t_s"].min())) * (1 - fraction)
    return float(j[j["t_s"] >= start - 1e-9]["jain"].mean())


def starts(rates: pd.DataFrame) -> pd.Series:
    """Per flow of :func:`flows`, the time (t_s) of its first sample in which it was sending (:func:`sending`),
    earliest first: when its QP began to move data, as far as the 50 ms samples tell (a QP is mapped, and listed
    at the line rate, from its creation on, before it sends)."""
    f = flows(rates)
    if f.empty:
        return pd.Series(dtype=float)
    f = f[sending(f)]
    return f.groupby("flow")["t_s"].min().sort_values()


def lead_rates(rates: pd.DataFrame, window_s: float = 0.5) -> pd.Series:
    """The first flow's Rc samples (kbit/s) in the ``window_s`` before the last flow's QP appeared in the samples
    (mapped, within 50 ms of its creation, before it sends): the rate the first flow had when the last one came.
    Empty with fewer than two flows."""
    s = starts(rates)
    if len(s) < 2:
        return pd.Series(dtype=float)
    f = flows(rates)
    appeared = f.loc[f["flow"] == s.index[-1], "t_s"].min()
    lead = f[(f["flow"] == s.index[0]) & (f["t_s"] < appeared) & (f["t_s"] >= appeared - window_s)]
    return lead["rc_kbps"].reset_index(drop=True)


def cut_and_recovered(rates: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """Per flow of :func:`flows`, from the last flow's start (the join, :func:`starts`) on: its lowest Rc and its
    highest Rc after that lowest (kbit/s), i.e. how deep DCQCN cut it once the port was shared and how far it came
    back. Empty with no flow."""
    s = starts(rates)
    if s.empty:
        return {}
    f = flows(rates)
    out = {}
    for flow, g in f[f["t_s"] >= float(s.iloc[-1])].sort_values("t_s").groupby("flow"):
        rc = g["rc_kbps"].astype(float).reset_index(drop=True)
        out[flow] = (float(rc.min()), float(rc[int(rc.idxmin()):].max()))
    return out


def convergence(rates: pd.DataFrame, bin_s: float = 0.5, fair: float = FAIR_JAIN) -> dict:
    """How flows that start at different times come to share a port: ``stagger_s``, the time from the first flow's
    start to the last one's (:func:`starts`). The *joint bins* are :func:`jain_sending`'s bins of ``bin_s`` counted
    from the last flow's start (the join) on, with two flows or more sending. ``convergence_s``: the time from the
    join to the first joint bin from which every later joint bin has Jain >= ``fair``, in whole bins (0: fair from
    the join on; the samples' times do not resolve it finer), NaN when the last joint bin is below ``fair`` (never
    converged) or there is none. ``joint_bins``: how many; ``jain_join``: Jain's index in the first (how unequal
    the rates were at the join); ``jain_joint_last``: Jain over the last third of them (:func:`jain_last`)."""
    s = starts(rates)
    out = {"stagger_s": math.nan, "convergence_s": math.nan, "joint_bins": 0, "jain_join": math.nan,
           "jain_joint_last": math.nan}
    if len(s) < 2:
        return out
    join = float(s.iloc[-1]) - float(rates["t_s"].min())
    out["stagger_s"] = float(s.iloc[-1] - s.iloc[0])
    j = jain_sending(rates, bin_s=bin_s, origin_s=join)
    out["joint_bins"] = len(j)
    if len(j):
        out["jain_join"] = float(j["jain"].iloc[0])
        out["jain_joint_last"] = _last(j, LAST_FRACTION)
    unfair = j.index[j["jain"] < fair]
    first = 0 if len(unfair) == 0 else int(unfair.max()) + 1
    if first < len(j):
        out["convergence_s"] = round((float(j["t_s"].iloc[first]) - join) / bin_s) * bin_s
    return out


def dcqcn_metrics(counters: pd.DataFrame, rates: pd.DataFrame) -> dict:
    """The summary's dcqcn_* keys: the counters summed over the hosts, per host the CNPs sent/received and the cuts,
    the flows' lowest and last rates (with no flow, i.e. no CNP at all, the lowest is every mapped QP's: a run whose
    queues never reached K still has it), Jain's index over the last third of the bins in which two flows or more
    were sending (:func:`jain_last`), and how staggered flows converged (:func:`convergence`: dcqcn_stagger_s,
    dcqcn_convergence_s, dcqcn_joint_bins, dcqcn_jain_join, dcqcn_jain_joint_last). Empty without dcqcn.csv rows."""
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
    elif len(rates):   # no QP got a CNP, so none was cut: the lowest rate is every mapped QP's, the line rate
        out["dcqcn_rate_kbps_min"] = int(pd.to_numeric(rates["rc_kbps"], errors="coerce").min())
    j = jain_last(rates)
    out["dcqcn_jain_last"] = None if math.isnan(j) else j
    for k, v in convergence(rates).items():
        out[f"dcqcn_{k}"] = None if isinstance(v, float) and math.isnan(v) else v
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


__all__ = ["FAIR_JAIN", "STATE", "TOTALS", "convergence", "dcqcn_metrics", "flows", "jain_last", "jain_sending",
           "lead_rates", "plot_rates", "sending", "starts"]
