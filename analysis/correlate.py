"""Explain slow collectives: what the fabric was doing during each op's lifetime.

For every collective op (an ``(iteration, op_index)`` group of ops.csv) and its lifetime ``[start, end]``
(first rank's start to last rank's end) this looks at the queue samples and PFC events of the watched links:

* ``drops`` / ``marks``: increase of the cumulative counters between the last sample at or before
  ``start`` and the first sample at or after ``end`` (the bracketing samples; the counters' resolution
  is the sampling interval, so this may include events up to one interval either side of the op);
* ``peak_backlog_bytes``: largest backlog (summed over classes) among samples inside ``[start, end]``;
  nan when no sample falls inside (an op shorter than the sampling interval);
* ``paused_ms``: time the most-paused link spent paused inside ``[start, end]`` (pauses of different
  priorities on a port count once);
* ``arrival_skew_ms`` / ``late_rank`` / ``late_host``: how long after the first rank the last one joined the op,
  and which rank that was (a synchronous collective cannot finish before its last rank joins; no network can
  shorten this part). For a grouped op (every tensor-parallel group's all-reduce of a layer at once: the
  manifest's ``op_groups``, or the ``groups`` argument), per group, and the op's is its most skewed group's; the
  groups do not wait for each other, so a skew across them says nothing.

When the fabric did nothing during the slowest op and its skew is a large part of it, :func:`explain_op` names the
late rank as the cause.

Pure pandas/numpy; reads no files itself (give it DataFrames or a loaded ``Run``).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from .faults import describe, fault_intervals, overlapping
from .metrics import group_ids, nearest_rank, op_table, pause_intervals, percentiles, step_times
from .metrics.samples import _union_length

__all__ = ["LATE_SHARE", "OP_NETWORK_COLUMNS", "correlate_ops", "correlate_run", "explain_op", "explain_slowest",
           "explain_slowest_step", "op_groups", "op_skews", "port_label", "step_ops"]

OP_NETWORK_COLUMNS = ["iteration", "op_index", "op", "collective", "start_s", "end_s", "cct_ms",
                      "peak_backlog_bytes", "peak_port", "drops", "drop_port", "drop_port_drops", "marks",
                      "paused_ms", "pause_port", "worst_port", "faults", "arrival_skew_ms", "late_rank", "late_host",
                      "groups"]
#: the late rank is named as an op's cause when its arrival skew is at least this share of the op (as the story's
#: :data:`analysis.story.LATE_SHARE`)
LATE_SHARE = 0.25


def port_label(node: str, port: str) -> str:
    """``"node:port"``, the link naming used in every output of this module."""
    return f"{node}:{port}"


def _normalise_links(links: Iterable | None) -> set[str] | None:
    if links is None:
        return None
    out = set()
    for link in links:
        out.add(port_label(*link) if isinstance(link, (tuple, list)) else str(link))
    return out


def _port_series(queues: pd.DataFrame, links: set[str] | None) -> dict[str, dict[str, np.ndarray]]:
    """Per port label: sample times and per-time sums over classes of backlog and counters."""
    out: dict[str, dict[str, np.ndarray]] = {}
    if queues.empty:
        return out
    cols = ["backlog_bytes", "drops", "marks"]
    per_t = queues.groupby(["node", "port", "t_s"], sort=True)[cols].sum().reset_index()
    for (node, port), d in per_t.groupby(["node", "port"], sort=True):
        label = port_label(node, port)
        if links is not None and label not in links:
            continue
        out[label] = {"t": d["t_s"].to_numpy(dtype=float), **{c: d[c].to_numpy(dtype=float) for c in cols}}
    return out


def _bracket_delta(t: np.ndarray, v: np.ndarray, start: float, end: float) -> float:
    """Increase of cumulative counter v between the samples bracketing [start, end] (resets tolerated)."""
    if t.size < 2:
        return 0.0
    i = max(int(np.searchsorted(t, start, side="right")) - 1, 0)
    j = min(int(np.searchsorted(t, end, side="left")), t.size - 1)
    if j <= i:
        return 0.0
    seg = v[i:j + 1]
    d = np.diff(seg)
    return float(np.where(d < 0, seg[1:], d).sum())


def op_groups(manifest: Mapping) -> dict[str, list[list[int]]]:
    """The manifest's ``op_groups`` (op name -> its communicators, disjoint lists of ranks; the collective scenario
    writes it for grouped ops), checked: {} when absent or malformed."""
    raw = manifest.get("op_groups") if isinstance(manifest, Mapping) else None
    if not isinstance(raw, Mapping):
        return {}
    out = {}
    for name, groups in raw.items():
        if isinstance(groups, list) and all(isinstance(g, list) and all(isinstance(r, int) for r in g) for g in groups):
            out[str(name)] = [list(g) for g in groups]
    return out


def op_skews(ops: pd.DataFrame, groups: Mapping[str, list[list[int]]] | None = None) -> pd.DataFrame:
    """Per ``(iteration, op_index)``: ``arrival_skew_ms`` (last minus first rank's start, within each group of the
    op's ``groups`` entry, the largest of them; the whole op is one group when it has none), ``late_rank`` and
    ``late_host`` (the last to join that group; -1 and "" when the op has one rank) and ``groups`` (how many)."""
    cols = ["iteration", "op_index", "arrival_skew_ms", "late_rank", "late_host", "groups"]
    if ops.empty:
        return pd.DataFrame({c: pd.Series([], dtype="int64" if c in ("iteration", "op_index", "late_rank", "groups")
                                          else (object if c == "late_host" else float)) for c in cols})
    d = ops.assign(_g=group_ids(ops, groups),
                   _h=ops["host"].astype(str) if "host" in ops.columns else "")
    key = ["iteration", "op_index", "_g"]
    first = d.groupby(key, sort=False)["start_s"].transform("min")
    last_idx = d.groupby(key, sort=False)["start_s"].idxmax()
    per = d.loc[last_idx.to_numpy()].assign(skew=(d.loc[last_idx.to_numpy(), "start_s"]
                                                  - first.loc[last_idx.to_numpy()]) * 1e3)
    size = d.groupby(key, sort=False)["rank"].transform("size").loc[last_idx.to_numpy()]
    per = per.assign(_n=size.to_numpy())
    n_groups = per.groupby(["iteration", "op_index"])["_g"].transform("size")
    per = per.assign(_ng=n_groups.to_numpy()).sort_values("skew", ascending=False, kind="stable")
    top = per.drop_duplicates(["iteration", "op_index"]).sort_values(["iteration", "op_index"], kind="stable")
    return pd.DataFrame({"iteration": top["iteration"].astype("int64").to_numpy(),
                         "op_index": top["op_index"].astype("int64").to_numpy(),
                         "arrival_skew_ms": top["skew"].to_numpy(float),
                         "late_rank": [int(r) if n > 1 else -1 for r, n in zip(top["rank"], top["_n"])],
                         "late_host": [str(h) if n > 1 else "" for h, n in zip(top["_h"], top["_n"])],
                         "groups": top["_ng"].astype("int64").to_numpy()})


def correlate_ops(ops: pd.DataFrame, queues: pd.DataFrame, pfc: pd.DataFrame, *,
                  links: Iterable | None = None, run_end: float | None = None,
                  events: pd.DataFrame | None = None, groups: Mapping[str, list[list[int]]] | None = None
                  ) -> pd.DataFrame:
    """One row per collective op with what the watched links did during it.

    ``links``: iterable of ``"node:port"`` strings or ``(node, port)`` tuples; None watches every port found
    in queues.csv / pfc.csv. ``run_end`` closes pauses that never got an xon (default: the latest
    timestamp in ops/queues/pfc). Columns (:data:`OP_NETWORK_COLUMNS`): iteration, op_index, op, collective,
    start_s, end_s, cct_ms, peak_backlog_bytes, peak_port, drops (sum over watched ports), drop_port (most
    drops), drop_port_drops, marks (sum), paused_ms (on the most-paused link), pause_port, worst_port
    (pause_port if any pause, else drop_port if any drop, else peak_port), faults (the fault intervals of
    ``events``, events.csv, that overlapped the op: "leaf1-spine1 down for 120 ms, ..."), arrival_skew_ms,
    late_rank, late_host and groups (:func:`op_skews` with ``groups``). Port fields are "" when nothing
    qualifies.
    """
    ot = op_table(ops)
    wanted = _normalise_links(links)
    series = _port_series(queues, wanted)
    if run_end is None:
        candidates = [float(df[c].max()) for df, c in ((ops, "end_s"), (queues, "t_s"), (pfc, "t_s")) if len(df)]
        run_end = max(candidates) if candidates else 0.0
    iv = pause_intervals(pfc, run_end)
    fault_iv = fault_intervals(events, run_end) if events is not None else fault_intervals(None)
    pauses: dict[str, list[tuple[float, float]]] = {}
    for row in iv.itertuples(index=False):
        label = port_label(row.node, row.port)
        if wanted is None or label in wanted:
            pauses.setdefault(label, []).append((row.start_s, row.end_s))

    skews = {(int(k.iteration), int(k.op_index)): k for k in op_skews(ops, groups).itertuples(index=False)}
    rows = []
    for op in ot.itertuples(index=False):
        s, e = float(op.start_s), float(op.end_s)
        sk = skews[(int(op.iteration), int(op.op_index))]
        peak, peak_port, drops_total, drop_port, drop_port_drops, marks_total = _queues_during(series, s, e)
        paused, pause_port = 0.0, ""
        for label, ivs in pauses.items():
            p = _union_length(ivs, s, e)
            if p > paused:
                paused, pause_port = p, label
        worst = pause_port or drop_port or peak_port
        rows.append({"iteration": int(op.iteration), "op_index": int(op.op_index), "op": op.op,
                     "collective": op.collective, "start_s": s, "end_s": e, "cct_ms": (e - s) * 1e3,
                     "peak_backlog_bytes": peak, "peak_port": peak_port, "drops": drops_total,
                     "drop_port": drop_port, "drop_port_drops": drop_port_drops, "marks": marks_total,
                     "paused_ms": paused * 1e3, "pause_port": pause_port, "worst_port": worst,
                     "faults": describe(overlapping(fault_iv, s, e)), "arrival_skew_ms": float(sk.arrival_skew_ms),
                     "late_rank": int(sk.late_rank), "late_host": sk.late_host, "groups": int(sk.groups)})
    df = pd.DataFrame(rows, columns=OP_NETWORK_COLUMNS)
    if df.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("op", "collective", "peak_port", "drop_port",
                                                                     "pause_port", "worst_port", "faults",
                                                                     "late_host") else
                                          ("int64" if c in ("iteration", "op_index", "late_rank", "groups")
                                           else float))
                             for c in OP_NETWORK_COLUMNS})
    return df


def _queues_during(series: dict[str, dict[str, np.ndarray]], s: float, e: float
                   ) -> tuple[float, str, float, str, float, float]:
    """What the watched queues did in [s, e]: (peak backlog, its port, drops summed over ports, the port with most
    drops, its drops, marks summed over ports)."""
    peak, peak_port = math.nan, ""
    drops_total, marks_total = 0.0, 0.0
    drop_port, drop_port_drops = "", 0.0
    for label, ser in series.items():
        t = ser["t"]
        inside = (t >= s) & (t <= e)
        if inside.any():
            b = float(ser["backlog_bytes"][inside].max())
            if math.isnan(peak) or b > peak:
                peak, peak_port = b, label
        dr = _bracket_delta(t, ser["drops"], s, e)
        drops_total += dr
        marks_total += _bracket_delta(t, ser["marks"], s, e)
        if dr > drop_port_drops:
            drop_port, drop_port_drops = label, dr
    return peak, peak_port, drops_total, drop_port, drop_port_drops, marks_total


def correlate_run(run, links: Iterable | None = None) -> pd.DataFrame:
    """:func:`correlate_ops` on a loaded ``Run`` (pauses still open are closed at the run's end)."""
    end = run.time_window()[1]
    return correlate_ops(run.ops, run.queues, run.pfc, links=links,
                         run_end=None if (end is None or math.isnan(end)) else end, events=run.events,
                         groups=op_groups(run.manifest))


def _fmt_q(q: float) -> str:
    s = f"{q * 100:.6g}"
    return "p" + s


def explain_op(row: pd.Series | dict, prefix: str = "op") -> str:
    """One-line sentence for one row of :func:`correlate_ops`."""
    where = "" if row["op"] == "step" else f", op {int(row['op_index'])}"
    head = f"{prefix} (iteration {int(row['iteration'])}{where}, {row['cct_ms']:.1f} ms)"
    parts = []
    faults = row.get("faults", "") if hasattr(row, "get") else ""
    if isinstance(faults, str) and faults:
        parts.append(faults)
    if row["paused_ms"] > 0:
        parts.append(f"{row['paused_ms']:.1f} ms of pauses on {row['pause_port']}")
    if row["drop_port_drops"] > 0:
        parts.append(f"{int(row['drop_port_drops'])} drops on {row['drop_port']}")
    if row["marks"] > 0:
        parts.append(f"{int(row['marks'])} ECN marks")
    late = _late_clause(row)
    if parts:
        body = " and ".join(parts) if len(parts) <= 2 else ", ".join(parts[:-1]) + " and " + parts[-1]
        return f"{head} coincided with {body}" + (f"; besides, {late}" if late else "")
    quiet = f"{head} coincided with no pauses, drops or marks on the watched links"
    if late:
        return f"{quiet}: the cause is its late rank, {late}"
    if not (isinstance(row["peak_backlog_bytes"], float) and math.isnan(row["peak_backlog_bytes"])):
        return f"{quiet} (peak backlog {int(row['peak_backlog_bytes'])} B on {row['peak_port']})"
    return f"{quiet} (no queue sample inside it)"


def _late_clause(row) -> str:
    """"rank 2 (h3) joined 600.0 ms after the first rank (arrival skew: 97% of the op)" when the op's arrival skew
    is at least :data:`LATE_SHARE` of it; "" otherwise (or when the row has no skew columns)."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: d)
    skew, rank, cct = get("arrival_skew_ms"), get("late_rank", -1), row["cct_ms"]
    if skew is None or (isinstance(skew, float) and math.isnan(skew)) or rank is None or int(rank) < 0 or \
            not cct > 0 or skew < LATE_SHARE * cct:
        return ""
    host = get("late_host", "")
    of = " of its group" if int(get("groups", 1) or 1) > 1 else ""
    return (f"rank {int(rank)}{f' ({host})' if host else ''} joined {skew:.1f} ms after the first rank{of} "
            f"(arrival skew: {skew / cct:.0%} of the op)")


def explain_slowest(run, q: float = 0.99, links: Iterable | None = None,
                    table: pd.DataFrame | None = None) -> str:
    """One-line sentence explaining the op at the q-th CCT percentile (nearest rank, so an actual op).

    E.g. ``"p99 op (iteration 7, op 2, 41.3 ms) coincided with 3.0 ms of pauses on spine1:eth2 and 12 drops
    on leaf1:eth3 [median 10.2 ms, n=40 ops: p99 is the max]"``. Pass a precomputed :func:`correlate_ops`
    ``table`` to skip recomputation (``run`` is then unused and may be None).
    """
    t = table if table is not None else correlate_run(run, links)
    label = _fmt_q(q)
    if t.empty:
        return f"{label} op: no collective ops in this run"
    target = nearest_rank(t["cct_ms"], q)
    row = t[t["cct_ms"] == target].iloc[0]
    pct = percentiles(t["cct_ms"])
    note = f"median {pct.p50:.1f} ms, n={pct.n} ops"
    if not pct.resolves(q):
        note += f": {label} is the max"
    return f"{explain_op(row, prefix=f'{label} op')} [{note}]"


def step_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """Each training step of ops.csv as one op (``op = step``) spanning it, barrier to barrier as
    :func:`analysis.metrics.step_times` defines it (from the previous step's end, or the job's origin, to the
    slowest rank's end of this one): what :func:`correlate_ops` takes to join whole steps with the fabric."""
    st = step_times(ops)
    return pd.DataFrame({"iteration": st["iteration"].astype("int64"), "op": "step", "op_index": 0,
                         "collective": "step", "rank": 0, "host": "", "start_s": st["end_s"] - st["step_s"],
                         "end_s": st["end_s"], "bytes_sent": 0, "bytes_recv": 0, "wait_s": 0.0})


def explain_slowest_step(run, q: float = 0.99, links: Iterable | None = None) -> str:
    """:func:`explain_slowest` for whole steps (:func:`step_ops`): what the fabric did during the step at the q-th
    step-time percentile, e.g. a program's slowest training step and the drops it met."""
    end = run.time_window()[1]
    t = correlate_ops(step_ops(run.ops), run.queues, run.pfc, links=links,
                      run_end=None if (end is None or math.isnan(end)) else end, events=run.events)
    label = _fmt_q(q)
    if t.empty:
        return f"{label} step: no steps in this run"
    row = t[t["cct_ms"] == nearest_rank(t["cct_ms"], q)].iloc[0]
    pct = percentiles(t["cct_ms"])
    note = f"median {pct.p50:.1f} ms, n={pct.n} steps" + ("" if pct.resolves(q) else f": {label} is the max")
    return f"{explain_op(row, prefix=f'{label} step')} [{note}]"
