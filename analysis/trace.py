"""A run as a Perfetto / Chrome trace: ``trace.json`` in the Trace Event Format (the JSON object form,
``{"traceEvents": [...]}``), the format PyTorch's profiler and Nsight Systems export and ui.perfetto.dev and
chrome://tracing open unchanged.

What it holds, all on one clock (microseconds since the run's start: the manifest's ``t0_monotonic``, the origin
the report's queue, pause and timeline plots use):

* one process per host (``pid``), one thread (track) per rank on it (``tid``): each op as a slice (``ph: X``)
  with two children, ``wait`` (from the rank's arrival to the last rank's arrival: waiting for the slowest peer to
  join; for a grouped op, the last of the rank's own group: the manifest's ``op_groups``) and ``transfer`` (from
  then to the rank's completion), and ``compute`` slices between ops (:func:`analysis.metrics.rank_op_split`,
  :func:`analysis.metrics.rank_timeline`);
* a ``fabric`` process: counter tracks (``ph: C``) of the backlog in bytes of the :data:`MAX_QUEUE_PORTS` ports
  with the highest peak (queues.csv, summed over classes) and, per port whose counter rose, its drops and ECN marks
  since the run's start; per (port, priority) that was paused a track of PFC pause slices (pfc.csv's xoff to xon,
  :func:`analysis.metrics.pause_intervals`); instant events (``ph: i``) for every row of events.csv (faults and the
  fabric's reactions; global scope) and every queue sample at which a port's drop counter rose (fabric scope);
* a ``machine`` process with cpu.csv's busy percent of the CPUs every host (namespace) shares, when the run has it.

Every event carries ``ph``, ``name``, ``pid``, ``tid`` and ``ts`` (whole microseconds); slices a ``dur``; counters
numeric ``args``; metadata events (``ph: M``) name and order the processes and threads. Open the file at
https://ui.perfetto.dev (Open trace file) or in chrome://tracing.

Pure: reads a :class:`analysis.load.Run`, writes one file; no kernel, no plotting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from . import metrics as m
from .correlate import op_groups
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
    groups = op_groups(run.manifest)
    # the last rank to join each rank's op, within the rank's own communicator when the op is grouped
    gid = pd.Series(m.group_ids(ops, groups), index=ops.index)
    last_idx = ops["start_s"].groupby([ops["iteration"], ops["op_index"], gid]).transform("idxmax")
    last_of = {(int(r), int(i), int(k)): int(last) for r, i, k, last in
               zip(ops["rank"], ops["iteration"], ops["op_index"], ops.loc[last_idx.to_numpy(), "rank"])}
    ev = []
    for o in m.rank_op_split(ops, groups).itertuples(index=False):
        pid, tid = pid_of[host_of[o.rank]], int(o.rank) + 1
        split = o.start_s + o.arrival_wait_s
        last = last_of[(int(o.rank), int(o.iteration), int(o.op_index))]
        ev.append(_slice(str(o.op), "op", o.start_s, o.end_s, pid, tid, origin_s,
                         {"iteration": int(o.iteration), "op_index": int(o.op_index), "last_to_join": f"rank {last}",
                          "wait_ms": round(o.arrival_wait_s * 1e3, 3), "transfer_ms": round(o.transfer_s * 1e3, 3)}))
        if o.arrival_wait_s > 0:
            ev.append(_slice("wait", "wait", o.start_s, split, pid, tid, origin_s, {"waiting_for": f"rank {last}"}))
        if o.transfer_s > 0:
            ev.append(_slice("transfer", "transfer", split, o.end_s, pid, tid, origin_s))
    tl = m.rank_timeline(ops, groups)
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


def _fabric_events(run: Run, pid: int, origin_s: float, end_s: float) -> tuple[list[dict], list[dict]]:
    """Queue backlog, drop and ECN-mark counter tracks, drop instants and PFC pauses as slices (one track per paused
    port and priority), all in the fabric process; returns (events, thread metadata of the pause tracks)."""
    ev: list[dict] = []
    q = run.queues
    if len(q):
        per_t = q.groupby(["node", "port", "t_s"], sort=True)[["backlog_bytes", "drops", "marks"]].sum().reset_index()
        peak = per_t.groupby(["node", "port"])["backlog_bytes"].max().sort_values(ascending=False, kind="stable")
        for node, port in peak.index[:MAX_QUEUE_PORTS]:
            d = per_t[(per_t["node"] == node) & (per_t["port"] == port)]
            t, v = _thin(d["t_s"].to_numpy(dtype=float), d["backlog_bytes"].to_numpy(dtype=float), MAX_QUEUE_POINTS)
            ev += [_counter(f"backlog {node}:{port}", "queue", ti, origin_s, pid, {"bytes": int(vi)})
                   for ti, vi in zip(t, v)]
        ev += _cumulative_counters(per_t, pid, origin_s)
        ev += _drop_events(q, pid, origin_s)
    meta: list[dict] = []
    if len(run.pfc):
        iv = m.pause_intervals(run.pfc, end_s)
        keys = sorted({(str(p.node), str(p.port), int(p.prio)) for p in iv.itertuples(index=False)})
        tid_of = {k: i + 1 for i, k in enumerate(keys)}  # tid 0 is the faults track
        for k, tid in tid_of.items():
            meta += [_meta("thread_name", pid, f"PFC pause {k[0]}:{k[1]} prio {k[2]}", tid),
                     _meta("thread_sort_index", pid, tid, tid)]
        for p in iv.itertuples(index=False):
            ev.append(_slice("PFC pause", "pfc", p.start_s, p.end_s, pid, tid_of[(str(p.node), str(p.port),
                                                                                  int(p.prio))], origin_s,
                             {"port": f"{p.node}:{p.port}", "prio": int(p.prio), "still_paused_at_end": bool(p.open)}))
    return ev, meta


def _counter(name: str, cat: str, t_s: float, origin_s: float, pid: int, args: dict) -> dict:
    """A counter sample (``ph: C``): each key of ``args`` is one numeric series of the track ``name`` in ``pid``."""
    return {"name": name, "cat": cat, "ph": "C", "ts": _us(t_s, origin_s), "pid": pid, "tid": 0, "args": args}


def _cumulative_counters(per_t: pd.DataFrame, pid: int, origin_s: float) -> list[dict]:
    """Per port whose drop or ECN-mark counter rose: that counter since the run's start (a step at every sample that
    saw it rise, from 0 at the port's first sample), so the viewer shows when and how fast a port dropped or marked."""
    ev = []
    for (node, port), d in per_t.groupby(["node", "port"], sort=True):
        t = d["t_s"].to_numpy(dtype=float)
        for col, name in (("drops", "drops"), ("marks", "ECN marks")):
            v = np.maximum.accumulate(d[col].to_numpy(dtype=float))
            v = v - v[0]
            if not v[-1] > 0:
                continue
            rise = np.flatnonzero(np.diff(v, prepend=0.0) > 0)
            if rise.size > MAX_QUEUE_POINTS:
                rise = rise[np.linspace(0, rise.size - 1, MAX_QUEUE_POINTS).astype(np.int64)]
            ev.append(_counter(f"{name} {node}:{port}", col, t[0], origin_s, pid, {col: 0}))
            ev += [_counter(f"{name} {node}:{port}", col, t[i], origin_s, pid, {col: int(v[i])}) for i in rise]
    return ev


def _cpu_events(run: Run, pid: int, origin_s: float) -> list[dict]:
    """cpu.csv's busy share of the machine's CPUs as a percent counter track: every host is a namespace of one
    kernel, so the hosts share these CPUs and there is one track, not one per host."""
    c = run.cpu
    if c.empty:
        return []
    t, v = _thin(c["t_s"].to_numpy(dtype=float), c["busy_fraction"].to_numpy(dtype=float) * 100, MAX_QUEUE_POINTS)
    return [_counter("CPU busy (all hosts share it)", "cpu", ti, origin_s, pid, {"percent": round(float(vi), 2)})
            for ti, vi in zip(t, v)]


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
             "pid": pid, "tid": 0, "args": {"drops": int(r.inc_drops)}} for r in per.itertuples(index=False)]


def trace_events(run: Run) -> dict:
    """The trace as a JSON-ready dict: ``traceEvents`` (metadata first, then every other event by time),
    ``displayTimeUnit`` and ``otherData`` (the run, and what ts 0 is)."""
    start, end = run.time_window()
    origin = 0.0 if start is None or math.isnan(start) else float(start)
    end = origin if end is None or math.isnan(end) else float(end)
    ranks, meta, pid = _rank_events(run, origin)
    fabric, pause_meta = _fabric_events(run, pid, origin, end)
    faults = [{"name": f"{r.kind} {r.target}", "cat": "fault", "ph": "i", "s": "g", "ts": _us(r.t_s, origin),
               "pid": pid, "tid": 0, "args": {"detail": str(r.detail)}} for r in run.events.itertuples(index=False)]
    if fabric or faults:
        meta += [_meta("process_name", pid, "fabric"), _meta("process_sort_index", pid, pid),
                 _meta("thread_name", pid, "faults", 0), *pause_meta]
    cpu = _cpu_events(run, pid + 1, origin)
    if cpu:
        meta += [_meta("process_name", pid + 1, "machine"), _meta("process_sort_index", pid + 1, pid + 1)]
    body = sorted((e for e in ranks + fabric + faults + cpu
                   if math.isfinite(e["ts"]) and math.isfinite(e.get("dur", 0.0))),
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
