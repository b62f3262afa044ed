"""A run as a Perfetto / Chrome trace: ``trace.json`` in the Trace Event Format (the JSON object form,
``{"traceEvents": [...]}``), the format PyTorch's profiler and Nsight Systems export and ui.perfetto.dev and
chrome://tracing open unchanged.

What it holds, all on one clock (microseconds since the run's start: the manifest's ``t0_monotonic``, the origin
the report's queue, pause and timeline plots use):

* one process per host (``pid``), one thread (track) per rank on it (``tid``): each op as a slice (``ph: X``)
  with two children, ``wait`` (from the rank's arrival to the last rank's arrival: waiting for the slowest peer to
  join) and ``transfer`` (from then to the rank's completion), and ``compute`` slices between ops
  (:func:`analysis.metrics.rank_op_split`, :func:`analysis.metrics.rank_timeline`);
* a ``fabric`` process with counter tracks (``ph: C``): the backlog in bytes of the :data:`MAX_QUEUE_PORTS`
  ports with the highest peak (queues.csv, summed over classes) and, per (port, priority) that was paused, a 0/1
  PFC pause track (pfc.csv's xoff/xon, :func:`analysis.metrics.pause_intervals`);
* instant events (``ph: i``): every row of events.csv (faults and the fabric's reactions; global scope) and every
  queue sample at which a port's drop counter rose (the drops since the previous sample; fabric scope).

Pure: reads a :class:`analysis.load.Run`, writes one file; no kernel, no plotting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from . import metrics as m
from .load import Run

__all__ = ["MAX_DROP_EVENTS", "MAX_QUEUE_PORTS", "MAX_QUEUE_POINTS", "TRACE_FILE", "trace_events", "write_trace"]

#: the file written into the report's output folder
TRACE_FILE = "trace.json"
#: queue counter tracks: the ports with the highest peak backlog
MAX_QUEUE_PORTS = 8
#: most samples per queue track (beyond it, each time bin keeps its largest backlog, so peaks survive)
MAX_QUEUE_POINTS = 20000
#: most drop instants (the largest increases are kept)
MAX_DROP_EVENTS = 5000


def _us(t_s: float, origin_s: float) -> int | float:
    """Seconds on the run's clock -> whole microseconds since the run's start (nan stays nan). Whole numbers, so that
    a child slice computed from the same instants as its parent ends exactly where it does: a viewer converting
    fractional microseconds to its nanoseconds can round a child 1 ns past its parent and drop it as misnested."""
    us = (float(t_s) - origin_s) * 1e6
    return round(us) if math.isfinite(us) else us


def _slice(name: str, cat: str, start_s: float, end_s: float, pid: int, tid: int, origin_s: float,
           args: dict | None = None) -> dict:
    ts = _us(start_s, origin_s)
    ev = {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": max(_us(end_s, origin_s) - ts, 0),
          "pid": pid, "tid": tid}
    if args:
        ev["args"] = args
    return ev


def _meta(kind: str, pid: int, value, tid: int = 0) -> dict:
    """A metadata event naming or ordering a process (tid 0) or thread; ts 0 as PyTorch's profiler writes them, for
    viewers that want every event to have one."""
    return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid,
            "args": {"sort_index" if kind.endswith("sort_index") else "name": value}}


def _rank_events(run: Run, origin_s: float) -> tuple[list[dict], list[dict], int]:
    """Per-rank slices and the host processes' metadata; returns (events, metadata, next free pid)."""
    ops = run.ops
    if ops.empty:
        return [], [], 1
    host_of = ops.groupby("rank")["host"].first().astype(str)
    hosts = sorted(set(host_of), key=lambda h: (len(h), h))
    pid_of = {h: i + 1 for i, h in enumerate(hosts)}
    meta = []
    for h in hosts:
        meta += [_meta("process_name", pid_of[h], h), _meta("process_sort_index", pid_of[h], pid_of[h])]
    for rank, h in host_of.items():
        meta += [_meta("thread_name", pid_of[h], f"rank {rank}", int(rank) + 1),
                 _meta("thread_sort_index", pid_of[h], int(rank), int(rank) + 1)]
    last_rank = ops.loc[ops.groupby(["iteration", "op_index"])["start_s"].idxmax(), ["iteration", "op_index", "rank"]]
    last_of = {(int(i), int(k)): int(r) for i, k, r in last_rank.itertuples(index=False)}
    ev = []
    for o in m.rank_op_split(ops).itertuples(index=False):
        pid, tid = pid_of[host_of[o.rank]], int(o.rank) + 1
        split = o.start_s + o.arrival_wait_s
        last = last_of[(int(o.iteration), int(o.op_index))]
        ev.append(_slice(str(o.op), "op", o.start_s, o.end_s, pid, tid, origin_s,
                         {"iteration": int(o.iteration), "op_index": int(o.op_index), "last_to_join": f"rank {last}",
                          "wait_ms": round(o.arrival_wait_s * 1e3, 3), "transfer_ms": round(o.transfer_s * 1e3, 3)}))
        if o.arrival_wait_s > 0:
            ev.append(_slice("wait", "wait", o.start_s, split, pid, tid, origin_s, {"waiting_for": f"rank {last}"}))
        if o.transfer_s > 0:
            ev.append(_slice("transfer", "transfer", split, o.end_s, pid, tid, origin_s))
    tl = m.rank_timeline(ops)
    for c in tl[tl["kind"] == "compute"].itertuples(index=False):
        ev.append(_slice("compute", "compute", c.start_s, c.end_s, pid_of[host_of[c.rank]], int(c.rank) + 1,
                         origin_s, {"iteration": int(c.iteration)}))
    return ev, meta, len(hosts) + 1


def _thin(t: np.ndarray, v: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``points`` samples: per time bin its first time and largest value."""
    if t.size <= points:
        return t, v
    bins = np.minimum(((t - t[0]) / ((t[-1] - t[0]) / points)).astype(np.int64), points - 1)
    d = pd.DataFrame({"b": bins, "t": t, "v": v}).groupby("b").agg(t=("t", "min"), v=("v", "max"))
    return d["t"].to_numpy(), d["v"].to_numpy()


def _fabric_events(run: Run, pid: int, origin_s: float, end_s: float) -> list[dict]:
    """Queue backlog and PFC pause counters, drop instants, all in the fabric process."""
    ev = []
    q = run.queues
    if len(q):
        per_t = q.groupby(["node", "port", "t_s"], sort=True)["backlog_bytes"].sum().reset_index()
        peak = per_t.groupby(["node", "port"])["backlog_bytes"].max().sort_values(ascending=False, kind="stable")
        for node, port in peak.index[:MAX_QUEUE_PORTS]:
            d = per_t[(per_t["node"] == node) & (per_t["port"] == port)]
            t, v = _thin(d["t_s"].to_numpy(dtype=float), d["backlog_bytes"].to_numpy(dtype=float), MAX_QUEUE_POINTS)
            ev += [{"name": f"backlog {node}:{port}", "cat": "queue", "ph": "C", "ts": _us(ti, origin_s),
                    "pid": pid, "args": {"bytes": int(vi)}} for ti, vi in zip(t, v)]
        ev += _drop_events(q, pid, origin_s)
    if len(run.pfc):
        for p in m.pause_intervals(run.pfc, end_s).itertuples(index=False):
            name = f"PFC paused {p.node}:{p.port} prio {p.prio}"
            ev += [{"name": name, "cat": "pfc", "ph": "C", "ts": _us(p.start_s, origin_s), "pid": pid,
                    "args": {"paused": 1}},
                   {"name": name, "cat": "pfc", "ph": "C", "ts": _us(p.end_s, origin_s), "pid": pid,
                    "args": {"paused": 0}}]
    return ev


def _drop_events(q: pd.DataFrame, pid: int, origin_s: float) -> list[dict]:
    """An instant wherever a port's cumulative drop counter (any class) rose since its previous sample."""
    d = q.sort_values("t_s", kind="stable")
    inc = d.groupby(["node", "port", "class"], sort=False)["drops"].diff().fillna(0)
    d = d.assign(inc_drops=inc)[inc > 0]
    if d.empty:
        return []
    per = d.groupby(["node", "port", "t_s"], sort=True)["inc_drops"].sum().reset_index()
    if len(per) > MAX_DROP_EVENTS:
        per = per.nlargest(MAX_DROP_EVENTS, "inc_drops")
    return [{"name": f"drops {r.node}:{r.port}", "cat": "drop", "ph": "i", "s": "p", "ts": _us(r.t_s, origin_s),
             "pid": pid, "args": {"drops": int(r.inc_drops)}} for r in per.itertuples(index=False)]


def trace_events(run: Run) -> dict:
    """The trace as a JSON-ready dict: ``traceEvents`` (metadata first, then every other event by time),
    ``displayTimeUnit`` and ``otherData`` (the run, and what ts 0 is)."""
    start, end = run.time_window()
    origin = 0.0 if start is None or math.isnan(start) else float(start)
    end = origin if end is None or math.isnan(end) else float(end)
    ranks, meta, pid = _rank_events(run, origin)
    fabric = _fabric_events(run, pid, origin, end)
    faults = [{"name": f"{r.kind} {r.target}", "cat": "fault", "ph": "i", "s": "g", "ts": _us(r.t_s, origin),
               "pid": pid, "tid": 0, "args": {"detail": str(r.detail)}} for r in run.events.itertuples(index=False)]
    if fabric or faults:
        meta += [_meta("process_name", pid, "fabric"), _meta("process_sort_index", pid, pid),
                 _meta("thread_name", pid, "faults", 0)]
    body = sorted((e for e in ranks + fabric + faults if math.isfinite(e["ts"]) and math.isfinite(e.get("dur", 0.0))),
                  key=lambda e: (e["ts"], -e.get("dur", 0.0)))
    return {"traceEvents": meta + body, "displayTimeUnit": "ms",
            "otherData": {"run": run.name, "scenario": str(run.manifest.get("scenario", "?")),
                          "ts_origin": "the run's start (manifest t0_monotonic), microseconds",
                          "t0_monotonic": origin}}


def write_trace(run: Run, path: str | Path | None = None) -> Path:
    """Write the trace to the file ``path`` (default: :data:`TRACE_FILE` in the run directory) and return it. The file
    itself is written, nothing beside it: ``--out /tmp/t.json`` leaves a ``/tmp/trace.json`` alone."""
    path = Path(path) if path is not None else run.path / TRACE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace_events(run), separators=(",", ":"), allow_nan=False), encoding="utf-8")
    return path
