"""The run's metrics, computed once, from the files the run wrote: what summary.json, the report and compare show.

One vocabulary: every metric name below has one definition (in :mod:`analysis.metrics`) and one value per run.
The scenarios write their CSVs, load the run directory and call these functions for the numbers they put in
summary.json, so ``summary.json``, ``testbed report`` and ``testbed compare`` agree by construction.

* :func:`collective_metrics` (ops.csv): ``cct_ms_p50/p95/p99/p999/max/mean`` + ``cct_samples`` over the
  *headline* ops (:func:`headline_ops`), ``ops_n`` (every op), ``step_ms_p50/p95/p99/max/mean`` + ``step_n``,
  ``step_cv``, ``comm_wait_fraction``, ``nccl_size_bytes``, ``algbw_gbps``, ``busbw_gbps``, and for a parallel
  job ``comm_ms_<dim>`` / ``comm_fraction_<dim>`` per dimension (:mod:`analysis.dimensions`);
* :func:`nccl_table` (ops.csv): one nccl-tests row per op name (sweep.csv);
* :func:`round_metrics` (rounds.csv): ``rounds_n``, ``round_ms_p50/p95/p99/max``, ``round_goodput_mbps``;
* :func:`queue_metrics` (queues.csv, every sampled port): ``drops``, ``marks``, ``loss_rate`` (the port with the
  most drops), ``ecn_mark_fraction``, ``backlog_peak_bytes``, ``queue_sample_times``;
  :func:`port_backlog` (one port, a time window) for a scenario's bottleneck;
* :func:`tcp_metrics` (tcp.csv, every host recorded): ``tcp_retrans_segs``, ``tcp_timeouts``, ``retransmit_rate``;
* :func:`pfc_metrics` (pfc.csv): ``pauses``, ``pause_fraction_max``; :func:`cpu_metrics`: ``cpu_busy_mean``.

:func:`data_metrics` is all of these that the data supports; :func:`summarize` merges them over summary.json's
numeric values (the recomputed value wins: a stored value that differs is listed by :func:`stale_keys`).
Percentiles are nearest-rank (:func:`analysis.metrics.nearest_rank`), always with their sample count.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pandas as pd

from . import metrics as m
from .dimensions import comm_by_dimension
from .dcqcn import dcqcn_metrics
from .load import IncompleteRunWarning, Run, load_run

__all__ = ["HEADLINE", "collective_metrics", "cpu_metrics", "data_metrics", "headline_ops", "load_quietly",
           "nccl_table", "numeric", "pfc_metrics", "port_backlog", "queue_metrics", "round_metrics", "stale_keys",
           "summarize", "tcp_metrics"]

#: the few numbers a report opens with, in this order (those the run has)
HEADLINE = ["cct_ms_p50", "cct_ms_p99", "cct_samples", "step_ms_p50", "step_ms_p99", "step_cv",
            "comm_wait_fraction", "busbw_gbps", "round_ms_p50", "round_ms_p99", "rounds_n", "round_goodput_mbps",
            "goodput_mbps", "drops", "loss_rate", "tcp_retrans_segs", "pauses", "pause_fraction_max"]


def load_quietly(run: Run | str | Path) -> Run:
    """:func:`analysis.load.load_run` without the incomplete-run warning (a run computing its own summary is
    still incomplete); a loaded :class:`Run` is returned as it is."""
    if isinstance(run, Run):
        return run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteRunWarning)
        return load_run(run)


def _pct(prefix: str, p: m.Percentiles, keys=("p50", "p95", "p99", "p999", "max", "mean")) -> dict:
    return {f"{prefix}_{k}": getattr(p, k) for k in keys}


# --------------------------------------------------------------------------- collectives (ops.csv)

def headline_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """The ops a collective run's headline CCT describes: every op when every iteration runs the same op names
    (one collective, or gradient buckets), else (a size sweep: iterations of one size, then the next) the ops of
    the op name with the largest nccl-tests size."""
    if ops.empty:
        return ops
    names = ops.groupby("iteration")["op"].agg(lambda s: tuple(sorted(set(s))))
    if names.nunique() <= 1:
        return ops
    t = m.op_table(ops)
    size = t.groupby("op")["size_bytes"].max()
    if size.isna().all():
        size = ops.groupby("op")["bytes_sent"].max().astype(float)
    return ops[ops["op"] == size.idxmax()]


def nccl_table(ops: pd.DataFrame) -> pd.DataFrame:
    """nccl-tests rows per op name in first-seen order: ``op, collective, ranks, size`` (nccl-tests size, bytes),
    ``time_us`` (mean CCT, as nccl-tests reports), ``algbw_gbps`` = size / mean CCT, ``busbw_gbps`` = algbw x
    :func:`analysis.metrics.busbw_factor`, ``cct_us_p50``, ``cct_us_p99`` (nearest rank) and ``n`` (ops)."""
    cols = ["op", "collective", "ranks", "size", "time_us", "algbw_gbps", "busbw_gbps", "cct_us_p50", "cct_us_p99",
            "n"]
    if ops.empty:
        return pd.DataFrame(columns=cols)
    t = m.op_table(ops)
    rows = []
    for name in pd.unique(ops["op"]):
        g = t[t["op"] == name]
        coll, n = str(g["collective"].iloc[0]), int(g["n_ranks"].max())
        size = float(g["size_bytes"].max())
        mean = float(g["cct_s"].mean())
        alg = m.algbw(size, mean) * 8 / 1e9 if not math.isnan(size) else math.nan
        try:
            bus = alg * m.busbw_factor(coll, n)
        except ValueError:
            bus = math.nan
        p = m.percentiles(g["cct_s"] * 1e6)
        rows.append({"op": name, "collective": coll, "ranks": n, "size": size, "time_us": mean * 1e6,
                     "algbw_gbps": alg, "busbw_gbps": bus, "cct_us_p50": p.p50, "cct_us_p99": p.p99, "n": p.n})
    return pd.DataFrame(rows, columns=cols)


def collective_metrics(ops: pd.DataFrame) -> dict:
    """CCT tails of the headline ops, step times, step CV, comm-wait fraction, algbw and busbw (module docstring).

    Step time (:func:`analysis.metrics.step_times`): barrier to barrier, end(i) - end(i-1), the first measured
    iteration from the job's measurement origin (ops.csv ``iter_start_s``: the end of the warm-up), so every step
    includes its compute phase and warm-up iterations (never in ops.csv) count nowhere. ``step_cv`` is the sample
    CV of those steps; ``comm_wait_fraction`` = sum of wait_s / sum of each rank's own steps. Bandwidths: the
    headline op name's nccl-tests row; gradient buckets (several op names per iteration): the mean over them,
    with ``nccl_size_bytes`` their total.
    """
    if ops.empty:
        return {}
    out: dict = {}
    head = headline_ops(ops)
    t = m.op_table(head)
    cct = m.percentiles(t["cct_s"] * 1e3)
    out.update(_pct("cct_ms", cct))
    out["cct_samples"] = cct.n
    out["ops_n"] = int(len(m.op_table(ops)))
    st = m.step_times(ops)
    step = m.percentiles(st["step_s"] * 1e3)
    out.update(_pct("step_ms", step, ("p50", "p95", "p99", "max", "mean")))
    out["step_n"] = step.n
    out["step_cv"] = m.cv(st["step_s"])
    out["comm_wait_fraction"] = m.comm_wait_fraction(ops)[0]
    out.update(comm_by_dimension(ops))  # comm_ms_tp, comm_fraction_dp, ... (a parallel job's op names)
    rows = nccl_table(head)
    if len(rows):
        out["nccl_size_bytes"] = float(rows["size"].sum())
        out["algbw_gbps"] = float(rows["algbw_gbps"].mean())
        out["busbw_gbps"] = float(rows["busbw_gbps"].mean())
    return out


# --------------------------------------------------------------------------- incast rounds (rounds.csv)

def round_metrics(rounds: pd.DataFrame) -> dict:
    """``rounds_n``, ``round_ms_p50/p95/p99/max`` (nearest rank; a round lasts from its first sender's start to its
    last sender's end) and ``round_goodput_mbps`` = all bytes / summed round time."""
    if rounds.empty:
        return {}
    rt = m.round_times(rounds)
    p = m.percentiles(rt["round_s"] * 1e3)
    out = {"rounds_n": p.n, **_pct("round_ms", p, ("p50", "p95", "p99", "max"))}
    busy = float(rt["round_s"].sum())
    out["round_goodput_mbps"] = m.goodput(float(rt["bytes"].sum()) * 8 / 1e6, busy)
    return out


# --------------------------------------------------------------------------- queues (queues.csv)

def queue_metrics(queues: pd.DataFrame, *, port_deltas: pd.DataFrame | None = None,
                  queue_stats: pd.DataFrame | None = None) -> dict:
    """Over every sampled port: ``drops`` and ``marks`` (counter increases, summed), ``loss_rate`` at the port
    with the most drops (:func:`analysis.metrics.incast_loss_rate`), ``ecn_mark_fraction`` = marks / sent packets,
    ``backlog_peak_bytes`` (largest sampled backlog of any port) and ``queue_sample_times`` (distinct sample
    instants). ``port_deltas`` / ``queue_stats``: precomputed, they are the expensive part of a long run."""
    if queues.empty:
        return {}
    d = m.port_counter_deltas(queues) if port_deltas is None else port_deltas
    top = d.sort_values(["drops", "sent_packets"], ascending=False, kind="stable").iloc[0]
    offered = float(top["drops"] + top["sent_packets"])
    sent = float(d["sent_packets"].sum())
    qs = m.queue_stats(queues) if queue_stats is None else queue_stats
    return {"drops": float(d["drops"].sum()), "marks": float(d["marks"].sum()),
            "loss_rate": float(top["drops"]) / offered if offered > 0 else math.nan,
            "ecn_mark_fraction": float(d["marks"].sum()) / sent if sent > 0 else math.nan,
            "backlog_peak_bytes": float(qs["max_bytes"].max()),
            "queue_sample_times": int(queues["t_s"].nunique())}


def port_backlog(queues: pd.DataFrame, node: str, port: str, t_start: float | None = None,
                 t_end: float | None = None) -> dict:
    """One port's samples in ``[t_start, t_end]`` (backlog summed over classes per sample): ``bytes_*`` and
    ``packets_*`` with ``median`` (numpy's, interpolated), ``p90`` (nearest rank), ``max``, ``mean``, and ``n``;
    plus the counter increases ``drops``, ``marks``, ``sent_packets``, ``sent_bytes`` over the whole run's samples
    of that port. Zeros (n=0) without samples."""
    q = queues[(queues["node"] == node) & (queues["port"] == port)]
    win = q
    if t_start is not None:
        win = win[win["t_s"] >= t_start]
    if t_end is not None:
        win = win[win["t_s"] <= t_end]
    per_t = win.groupby("t_s", sort=True)[["backlog_bytes", "backlog_packets"]].sum()
    out: dict = {"n": int(len(per_t))}
    for what, col in (("bytes", "backlog_bytes"), ("packets", "backlog_packets")):
        x = per_t[col].astype(float)
        out.update({f"{what}_median": float(x.median()) if len(x) else 0.0,
                    f"{what}_p90": m.nearest_rank(x, 0.90) if len(x) else 0.0,
                    f"{what}_max": float(x.max()) if len(x) else 0.0,
                    f"{what}_mean": float(x.mean()) if len(x) else 0.0})
    d = m.port_counter_deltas(q)
    for c in ("drops", "marks", "sent_packets", "sent_bytes"):
        out[c] = int(d[c].sum()) if len(d) else 0
    return out


# --------------------------------------------------------------------------- hosts, PFC, CPU

def tcp_metrics(tcp: pd.DataFrame) -> dict:
    """Over every host in tcp.csv: ``tcp_retrans_segs`` (sum of TcpRetransSegs increases), ``tcp_timeouts``
    (TcpExtTCPTimeouts, when recorded) and ``retransmit_rate`` (:func:`analysis.metrics.retransmit_rate`)."""
    td = m.tcp_deltas(tcp) if len(tcp) else None
    if td is None or td.empty:
        return {}
    out = {"tcp_retrans_segs": int(td.loc[td["counter"] == "TcpRetransSegs", "delta"].sum())}
    if (td["counter"] == "TcpExtTCPTimeouts").any():
        out["tcp_timeouts"] = int(td.loc[td["counter"] == "TcpExtTCPTimeouts", "delta"].sum())
    out["retransmit_rate"] = m.retransmit_rate(tcp)
    return out


def pfc_metrics(run: Run) -> dict:
    """``pauses`` (pause intervals, all links) and ``pause_fraction_max`` (the most-paused link's share of the run)."""
    if not len(run.pfc):
        return {}
    start, end = run.time_window()
    pf = m.pause_fraction(run.pfc, start, end)
    return {"pauses": int(pf["pauses"].sum()) if len(pf) else 0,
            "pause_fraction_max": float(pf["fraction"].max()) if len(pf) else 0.0}


def server_metrics(servers: pd.DataFrame) -> dict:
    """A fabric split over servers (servers.csv): ``servers``, ``tunnel_datagrams`` (VXLAN frames the servers
    received from each other) and ``tunnel_drops`` (frames a server's stack dropped on receipt: receive-buffer and
    input errors)."""
    if not len(servers):
        return {}
    return {"servers": int(len(servers)), "tunnel_datagrams": int(servers["udp_in_datagrams"].sum()),
            "tunnel_drops": int(servers["udp_rcvbuf_errors"].sum() + servers["udp_in_errors"].sum())}


def clock_metrics(clocks: pd.DataFrame) -> dict:
    """A run over servers that are machines (clocks.csv): ``clock_uncertainty_us_max``, the largest bound on any
    rank's clock against the reference's (what to allow when comparing times of ranks on different servers), and
    ``clock_servers``, how many servers' clocks its ranks ran on."""
    if not len(clocks):
        return {}
    return {"clock_uncertainty_us_max": float(clocks["uncertainty_s"].max()) * 1e6,
            "clock_servers": int(clocks["server"].nunique())}


def cpu_metrics(cpu: pd.DataFrame) -> dict:
    """``cpu_busy_mean``: mean of cpu.csv's busy_fraction samples."""
    return {"cpu_busy_mean": float(cpu["busy_fraction"].mean())} if len(cpu) else {}


# --------------------------------------------------------------------------- the run

def data_metrics(run: Run | str | Path, *, queue_stats: pd.DataFrame | None = None,
                 port_deltas: pd.DataFrame | None = None) -> dict:
    """Every metric above that the run's files support (nothing for a table without rows)."""
    run = load_quietly(run)
    out: dict = {}
    out.update(round_metrics(run.rounds))
    out.update(collective_metrics(run.ops))
    out.update(queue_metrics(run.queues, port_deltas=port_deltas, queue_stats=queue_stats))
    out.update(tcp_metrics(run.tcp))
    out.update(pfc_metrics(run))
    out.update(cpu_metrics(run.cpu))
    out.update(balancing_metrics(run.balancing))
    out.update(server_metrics(run.servers))
    out.update(clock_metrics(run.clocks))
    # the numeric ones (the per-host texts and the "on" flag stay summary.json's, written by the run)
    out.update({k: v for k, v in dcqcn_metrics(run.dcqcn, run.dcqcn_rates).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return out


def balancing_metrics(balancing: pd.DataFrame) -> dict:
    """The flowlet balancer's work over the run: ``flowlets`` started (a new path choice each), and
    ``flowlet_moved_fraction``, the share of balanced packets sent up another uplink than ECMP's hash chose."""
    if not len(balancing):
        return {}
    packets = int(balancing["packets"].sum())
    return {"flowlets": int(balancing["flowlets"].sum()),
            "flowlet_moved_fraction": float(balancing["moved_packets"].sum()) / packets if packets else 0.0}


def numeric(summary: dict) -> dict[str, float]:
    """The numeric values of a summary.json (bools as 0/1; strings, None, lists dropped)."""
    out: dict[str, float] = {}
    for k, v in summary.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def summarize(run: Run | str | Path, *, data: dict | None = None) -> dict[str, tuple[float, str]]:
    """``{metric: (value, source)}`` for the run, one value per name: summary.json's numeric values (source
    ``summary``: what the run knew that is in no file, e.g. kernel counters read before/after, parameters) and
    every :func:`data_metrics` value (source ``data``; it wins over a stored value of the same name). The report
    and compare show exactly this; a scenario's summary.json holds the same ``data`` values (it computed them
    with these functions). ``data``: precomputed :func:`data_metrics`."""
    run = load_quietly(run)
    data = data_metrics(run) if data is None else data
    out = {k: (v, "summary") for k, v in numeric(run.summary or {}).items() if k not in data}
    out.update({k: (float(v), "data") for k, v in data.items()})
    return out


def stale_keys(run: Run, data: dict, rel: float = 1e-6) -> list[tuple[str, float, float]]:
    """``(metric, stored, recomputed)`` for every summary.json number that differs from the value recomputed from
    the files (a run written by an older version, or a hand-edited summary.json)."""
    out = []
    for k, v in numeric(run.summary or {}).items():
        if k in data:
            r = float(data[k])
            if math.isnan(r) and math.isnan(v):
                continue
            if not math.isclose(v, r, rel_tol=rel, abs_tol=1e-12):
                out.append((k, v, r))
    return out
