"""Faults from a run's ``events.csv`` (written by the fault timeline, testbed.faults.timeline): when each was in effect,
how fast routing reacted, and the numbers the summary carries.

Interval of a fault = from its start event to the matching end event on the same target (a link that never came
back, or a port still slow, is open until the run's end):

    link_down -> link_up               the link carried nothing
    routes_withdrawn -> routes_restored  routing routed around it (from detection to re-detection)
    port_slow -> port_restored         the port ran below its rate
    netem_set -> netem_cleared         the link lost / delayed / corrupted packets
    pause_storm -> pause_storm_end     the port's link peer kept pausing it (PFC; pfc_watchdog events in between)
    cpu_throttled -> cpu_restored      the host's processes ran under a CPU limit (a straggler)
    host_changed -> host_restored      the host ran with another MTU / RTOmin
    host_config                        the host had its own congestion control / ECN setting (the whole run)

A slowed port with a trimming program has a ``trim_rate`` event after its port_slow and after its port_restored
(the rate its program drains at from then, and the packets it had trimmed so far): :func:`trimmed_while_slow`.
"""

from __future__ import annotations

import math

import pandas as pd

#: start event -> (end event, the interval's name in outputs)
PAIRS = {"link_down": ("link_up", "down"), "routes_withdrawn": ("routes_restored", "withdrawn"),
         "port_slow": ("port_restored", "slow"), "netem_set": ("netem_cleared", "impaired"),
         "pause_storm": ("pause_storm_end", "storming"), "cpu_throttled": ("cpu_restored", "throttled"),
         "host_changed": ("host_restored", "reconfigured"),
         "host_config": ("host_config_end", "configured differently")}
INTERVAL_COLUMNS = ["what", "target", "start_s", "end_s"]


def fault_intervals(events: pd.DataFrame, run_end: float | None = None) -> pd.DataFrame:
    """One row per fault interval: what (down, withdrawn, slow, impaired), target, start_s, end_s (monotonic
    seconds). Open intervals end at ``run_end`` (default: the last event; ``math.inf``: open for good)."""
    if events is None or events.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("what", "target") else float)
                             for c in INTERVAL_COLUMNS})
    ev = events.sort_values("t_s", kind="stable")
    end_all = float(run_end) if run_end is not None and not math.isnan(run_end) else float(ev["t_s"].max())
    open_: dict[tuple[str, str], float] = {}
    ends = {end: start for start, (end, _) in PAIRS.items()}
    rows = []
    for e in ev.itertuples(index=False):
        if e.kind in PAIRS:
            open_.setdefault((e.kind, e.target), float(e.t_s))
        elif e.kind in ends:
            start_kind = ends[e.kind]
            if e.target == "all":  # the timeline put everything back at its close
                keys = [k for k in open_ if k[0] == start_kind]
            else:
                keys = [(start_kind, e.target)] if (start_kind, e.target) in open_ else []
            for k in keys:
                rows.append((PAIRS[start_kind][1], k[1], open_.pop(k), float(e.t_s)))
    for (kind, target), t in open_.items():
        rows.append((PAIRS[kind][1], target, t, max(end_all, t)))
    rows.sort(key=lambda r: (r[2], r[1]))
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


def reaction_ms(events: pd.DataFrame) -> list[float]:
    """Per withdrawal: ms from the link's going down to routing's withdrawing it (the detection delay the
    emulation achieved: the configured detect_ms plus the timer's lateness)."""
    out = []
    if events is None or events.empty:
        return out
    down: dict[str, float] = {}
    for e in events.sort_values("t_s", kind="stable").itertuples(index=False):
        if e.kind == "link_down":
            down[e.target] = float(e.t_s)
        elif e.kind == "routes_withdrawn" and e.target in down:
            out.append((float(e.t_s) - down[e.target]) * 1e3)
    return out


def fault_summary(events: pd.DataFrame, run_end: float | None = None) -> dict:
    """The summary's fault numbers (empty without events): counts, total time down / withdrawn / slow /
    impaired, routing's reaction time, steps the workload ended before, frames the dead links swallowed (the
    timeline's closing ``dead_link_frames`` event)."""
    if events is None or events.empty:
        return {}
    iv = fault_intervals(events, run_end)
    kinds = events["kind"].value_counts()
    out = {"fault_events": int(len(events)),
           "link_down_events": int(kinds.get("link_down", 0)),
           "routes_withdrawn_events": int(kinds.get("routes_withdrawn", 0)),
           "faults_not_reached": int(kinds.get("fault_not_reached", 0)),
           "pfc_watchdog_fired": int(kinds.get("pfc_watchdog", 0)),
           "fault_errors": int(kinds.get("fault_error", 0))}
    for what in ("down", "withdrawn", "slow", "impaired", "storming", "throttled"):
        sel = iv[iv["what"] == what]
        out[f"{what}_ms_total"] = float(((sel["end_s"] - sel["start_s"]) * 1e3).sum()) if len(sel) else 0.0
    restored = events[events["kind"] == "cpu_restored"]["detail"]
    out["cpu_throttled_ms_kernel"] = float(sum(_field(d, "throttled_ms") for d in restored))
    r = reaction_ms(events)
    out["route_reaction_ms_max"] = max(r) if r else math.nan
    lost = events[events["kind"] == "dead_link_frames"]["detail"]
    out["dead_link_frames"] = int(sum(int(str(d).rpartition("=")[2] or 0) for d in lost))
    out["trim_rate_events"] = int(kinds.get("trim_rate", 0))
    out["trimmed_while_slow_packets"] = int(sum(trimmed_while_slow(events).values()))
    return out


def trimmed_while_slow(events: pd.DataFrame) -> dict[str, int]:
    """Per slowed port (target): the packets its trimming program trimmed while the port was slow, from the
    ``trim_rate`` event that followed its port_slow to the one that followed its port_restored (the program's count
    at each). A slow interval that trimming outlived is not counted: the run finished trimming (trim.csv, its
    totals) before the port was restored."""
    out: dict[str, int] = {}
    if events is None or events.empty:
        return out
    slow: set[str] = set()
    since: dict[str, float] = {}
    for e in events.sort_values("t_s", kind="stable").itertuples(index=False):
        if e.kind == "port_slow":
            slow.add(e.target)
        elif e.kind == "port_restored":
            slow.discard(e.target)
        elif e.kind == "trim_rate" and e.target in slow:
            since.setdefault(e.target, _field(e.detail, "trimmed_packets"))
        elif e.kind == "trim_rate" and e.target in since:
            n = _field(e.detail, "trimmed_packets") - since.pop(e.target)
            out[e.target] = out.get(e.target, 0) + int(n)
    return out


def configured_rate_mbps(events: pd.DataFrame | None, port: str, planned_mbps: float,
                         spans: list[tuple[float, float]]) -> float:
    """``port``'s (node:ifname) configured rate averaged over ``spans`` ((start_s, end_s) on the events' clock): its
    planned rate, and from each slow-port step on it (port_slow, a later one replacing the rate) until its restore
    (port_restored of the port or of "all") the step's ``rate_mbps``. What a busy port could have sent in those
    spans: a check of how busy a bottleneck was must not count a fault's slowing as the machine's."""
    total = sum(max(0.0, b - a) for a, b in spans)
    if total <= 0:
        return planned_mbps
    steps = [(-math.inf, planned_mbps)]  # (from t_s, rate) in time order
    if events is not None and len(events):
        for e in events.sort_values("t_s", kind="stable").itertuples(index=False):
            if e.kind == "port_slow" and e.target == port:
                steps.append((float(e.t_s), _field(e.detail, "rate_mbps")))
            elif e.kind == "port_restored" and e.target in (port, "all"):
                steps.append((float(e.t_s), planned_mbps))
    megabits = 0.0
    for a, b in spans:
        for (t, rate), (t_next, _) in zip(steps, steps[1:] + [(math.inf, 0.0)]):
            megabits += rate * max(0.0, min(b, t_next) - max(a, t))
    return megabits / total


def faulted_elsewhere(events: pd.DataFrame | None, port: str, spans: list[tuple[float, float]]) -> list[str]:
    """The targets other than ``port`` of fault intervals (a link down, routes withdrawn, a slow port, netem, a pause
    storm) that overlap ``spans``: what can starve ``port`` upstream, so that its idling is the fault's, not the
    machine's."""
    if events is None or not len(events):
        return []
    iv = fault_intervals(events, run_end=math.inf)
    return sorted({r.target for r in iv.itertuples(index=False) if r.target != port
                   and any(min(b, r.end_s) > max(a, r.start_s) for a, b in spans)})


def _field(detail, key: str) -> float:
    """The number after ``key=`` in an event's ``a=1;b=2`` detail (0 if absent)."""
    for part in str(detail).split(";"):
        k, _, v = part.partition("=")
        if k == key:
            try:
                return float(v)
            except ValueError:
                return 0.0
    return 0.0


def overlapping(intervals: pd.DataFrame, start_s: float, end_s: float) -> list[tuple[str, str, float]]:
    """(what, target, ms of overlap) of every fault interval overlapping [start_s, end_s], longest first."""
    out = []
    for r in intervals.itertuples(index=False):
        ov = min(end_s, r.end_s) - max(start_s, r.start_s)
        if ov > 0:
            out.append((r.what, r.target, ov * 1e3))
    out.sort(key=lambda x: -x[2])
    return out


def events_table(events: pd.DataFrame, t0: float | None = None, limit: int = 200) -> pd.DataFrame:
    """events.csv for a report: time in seconds from `t0` (default: the first event), kind, target, detail."""
    if events is None or events.empty:
        return pd.DataFrame(columns=["t (s)", "kind", "target", "detail"])
    ev = events.sort_values("t_s", kind="stable").head(limit)
    base = float(ev["t_s"].min()) if t0 is None or not math.isfinite(t0) else float(t0)
    return pd.DataFrame({"t (s)": [f"{t - base:.3f}" for t in ev["t_s"]], "kind": ev["kind"].astype(str).tolist(),
                         "target": ev["target"].astype(str).tolist(),
                         "detail": ["" if pd.isna(d) else str(d) for d in ev["detail"]]})


def describe(overlaps: list[tuple[str, str, float]]) -> str:
    """``"leaf2-spine1 down for 120 ms, leaf2-spine1 withdrawn for 70 ms"`` ('' for none)."""
    return ", ".join(f"{target} {what} for {ms:.0f} ms" for what, target, ms in overlaps)


__all__ = ["INTERVAL_COLUMNS", "PAIRS", "describe", "events_table", "fault_intervals", "fault_summary", "overlapping",
           "reaction_ms", "trimmed_while_slow"]
