"""The numbers of one run's PFC (the pfc_* keys of a summary): pauses, paused time, frames, reaction and control
times, the controller's achieved poll interval, and whether the headroom covered the worst reaction
(testbed.pfc.queues.headroom_needed over the feeders that carried lossless traffic)."""

from __future__ import annotations

from testbed.pfc.queues import headroom_needed


def _pct(vals: list[float], q: float) -> float:
    if not vals:
        return float("nan")
    s = sorted(vals)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def pfc_summary(ctl) -> dict:
    """The pfc_* numbers of a stopped testbed.pfc.controller.PfcController (zeros when nothing was paused)."""
    span = max(ctl.t_stop - ctl.t_start, 1e-9)
    ups = [q for q in ctl.queues.values() if q.pause_events]
    worst = max(ups, key=lambda q: q.paused_total, default=None)
    react_max = max(ctl.reactions, default=float("nan"))
    # what can arrive at one switch queue during a reaction: every feeder that carried lossless traffic at its
    # line rate (they are paused together); the worst switch queue counts
    first: dict[tuple, int] = {}
    last: dict[tuple, int] = {}
    for r in ctl.queue_rows:
        first.setdefault((r[1], r[2]), r[8])
        last[(r[1], r[2])] = r[8]
    active = {k for k in last if last[k] > first[k]}
    inflow = max((sum(ctl.queues[f].rate_bps for f in q.feeders if (f[0], f[1]) in active)
                  for q in ctl.queues.values() if q.is_switch), default=0.0)
    need = headroom_needed(inflow, react_max) if ctl.reactions else 0
    headroom = min((q.headroom for q in ctl.queues.values() if q.is_switch), default=0)
    return {
        "pfc_enabled": ctl.enabled,
        "pfc_pause_events": sum(q.pause_events for q in ctl.queues.values()),
        "pfc_paused_ms_total": sum(q.paused_total for q in ctl.queues.values()) * 1e3,
        "pfc_paused_fraction_max": (worst.paused_total / span) if worst else 0.0,
        "pfc_paused_port_max": f"{worst.node}:{worst.port}" if worst else "",
        "pfc_pause_events_by_port": "; ".join(f"{q.node}:{q.port}={q.pause_events}"
                                              for q in sorted(ups, key=lambda q: (q.node, q.port))),
        "pfc_watchdog_events": sum(q.watchdog_events for q in ctl.queues.values()),
        "pfc_frames_sent": ctl.frames_sent,  # 802.1Qbb frames put on the wire (0: frames off)
        "pfc_frame_errors": ctl.frame_errors,
        "pfc_xoff_crossings": sum(1 for e in ctl.events if e[4] == "above_xoff"),
        "pfc_reaction_ms_mean": (sum(ctl.reactions) / len(ctl.reactions) * 1e3) if ctl.reactions else None,
        "pfc_reaction_ms_p95": _pct(ctl.reactions, 95) * 1e3 if ctl.reactions else None,
        "pfc_reaction_ms_max": react_max * 1e3 if ctl.reactions else None,
        "pfc_control_ms_mean": (sum(ctl.controls) / len(ctl.controls) * 1e3) if ctl.controls else None,
        "pfc_control_ms_max": max(ctl.controls) * 1e3 if ctl.controls else None,
        "pfc_poll_interval_ms": ctl.achieved_interval_s * 1e3 if ctl.ticks >= 2 else None,
        "pfc_controller_sched": ctl.sched,
        "pfc_paused_leak_bytes_max": max((q.leak_bytes_max for q in ctl.queues.values()), default=0),
        "pfc_headroom_used_max_bytes": max((q.peak_over_xoff for q in ctl.queues.values()), default=0),
        "pfc_headroom_bytes": headroom,
        "pfc_headroom_needed_bytes": need,
        "pfc_headroom_ok": bool(need <= headroom) if ctl.reactions else True,
    }
