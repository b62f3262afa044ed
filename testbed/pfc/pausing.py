"""The PFC pause decisions, tick by tick: XOFF/XON hysteresis on the switches' lossless queues, which feeders a
crossing pauses and when they resume, pause storms and the watchdog. The controller process
(testbed.pfc.controller) samples the queues and calls these; each pause and resume is one plug change (a
:class:`~testbed.kernel.plug.PlugSocket` per namespace, ``plugs``) and, with frames on, an 802.1Qbb frame.

Hysteresis. A switch S's egress queue S->X above XOFF makes S "congested towards X" for that priority until it
drains to XON or below; while S is congested towards any X for a priority, every neighbour U != X of S has its
egress U->S paused for that priority (U's port is what feeds S: a hardware switch would send a PFC XOFF frame out
of its ingress port towards U). A paused port's own queue then grows and can pause *its* upstream: congestion
spreads hop by hop, head-of-line blocking flows that only share a link with the congested one.

Reaction time: a crossing happens somewhere between the last sample below XOFF and the first one above; the
pause holds once the kernel acknowledged the plug change. ``reaction`` = ack time - last sample below XOFF (an upper
bound), ``control`` = ack time - the sample that saw the crossing.

Watchdog: a port paused longer than ``watchdog_ms`` is released and ignores pauses of that priority for
``watchdog_restore_ms`` (hardware PFC watchdogs do the same against pause storms and deadlocks); event ``watchdog``.

Pause storm: a port whose link peer keeps sending XOFF whatever its buffer holds, as a stuck NIC receiver does,
stays paused for as long as the storm lasts (unless the watchdog is ignoring its pauses); it resumes when the storm
ends and no congested queue wants it paused.
"""

from __future__ import annotations

import time

from testbed.pfc.queues import LosslessQueue


class PauseLogic:
    """Pause state and decisions over ``queues`` ({(node, port, minor): LosslessQueue}); see the module docstring.
    ``events`` collects pfc.csv's rows (t_s, node, port, prio, event, backlog_bytes); ``reactions``/``controls``
    the reaction times in seconds. ``frames``: a testbed.pfc.frame.PauseFrames (or None: no frames on the wire)."""

    def __init__(self, fabric, queues: dict[tuple[str, str, int], LosslessQueue], watchdog_s: float = 0.0,
                 restore_s: float = 0.2):
        self.fabric = fabric
        self.queues = queues
        self.watchdog_s = watchdog_s
        self.restore_s = restore_s
        self.frames = None
        self.events: list[tuple] = []
        self.reactions: list[float] = []  # ack - last sample below XOFF
        self.controls: list[float] = []  # ack - sample that saw the crossing
        self._plans = {(p.node, p.ifname): p for p in fabric.port_plans}

    def _watch(self, q: LosslessQueue, t: float, backlog: int) -> bool:
        """Hysteresis on one switch egress queue; True when its congested state changed."""
        if not q.congested:
            if backlog >= q.xoff:
                q.congested = True
                q.t_above = t
                q.peak_over_xoff = max(q.peak_over_xoff, backlog - q.xoff)
                self.events.append((t, q.node, q.port, q.pcp, "above_xoff", backlog))
                return True
            q.t_below = t
            return False
        q.peak_over_xoff = max(q.peak_over_xoff, backlog - q.xoff)
        if backlog <= q.xon:
            q.congested = False
            q.t_below = t
            self.events.append((t, q.node, q.port, q.pcp, "below_xon", backlog))
            return True
        return False

    def _drive(self, ns_queues: list[LosslessQueue], plugs: dict) -> None:
        """Pause / resume the feeders of the switch whose queues are ns_queues."""
        want: dict[tuple, LosslessQueue | None] = {}
        for q in ns_queues:
            if not q.is_switch:
                continue
            for k in q.feeders:
                if q.congested:
                    trig = want.get(k)
                    if trig is None or q.t_above > trig.t_above:
                        want[k] = q
                else:
                    want.setdefault(k, None)
        for k, trig in want.items():
            u = self.queues[k]
            if (trig is not None) == u.paused or (trig is None and u.stormed):
                continue
            if trig is None:
                self._xon(u, plugs)
            elif time.monotonic() >= u.ignore_until:
                ack = self._pause(u, plugs)
                self.reactions.append(ack - trig.t_below)
                self.controls.append(ack - trig.t_above)

    def _storms(self, plugs: dict) -> None:
        """Hold every stormed port paused (unless the watchdog is ignoring its pauses); resume one whose storm
        ended and that no congested queue wants paused."""
        for u in self.queues.values():
            if u.stormed and not u.paused and time.monotonic() >= u.ignore_until:
                self._pause(u, plugs)
            elif not u.stormed and u.paused and not self._wanted(u):
                self._xon(u, plugs)

    def _wanted(self, u: LosslessQueue) -> bool:
        """Does a congested switch queue want u paused (u is one of its feeders)?"""
        return any(q.congested and u.key in q.feeders for q in self.queues.values() if q.is_switch)

    def _pause(self, u: LosslessQueue, plugs: dict) -> float:
        """XOFF: block u's plug (the class stops dequeuing at once); returns the kernel's acknowledgement time."""
        plugs[u.ns].block(u.ifindex, u.plug_handle, u.plug_parent)
        ack = time.monotonic()
        u.paused, u.paused_since, u.sent_at_pause = True, ack, None  # before anything that can fail: released at exit
        u.pause_events += 1
        self._frame(u, pause=True)
        self.events.append((ack, u.node, u.port, u.pcp, "xoff", u.backlog))
        return ack

    def _release(self, u: LosslessQueue, plugs: dict) -> float:
        """Release u's plug (its queue dequeues again) and account the pause; returns the acknowledgement time."""
        plugs[u.ns].release(u.ifindex, u.plug_handle, u.plug_parent)
        ack = time.monotonic()
        u.paused = False
        u.paused_total += ack - u.paused_since
        return ack

    def _xon(self, u: LosslessQueue, plugs: dict) -> None:
        """XON: resume u, with its frame and its pfc.csv row."""
        ack = self._release(u, plugs)
        self._frame(u, pause=False)
        self.events.append((ack, u.node, u.port, u.pcp, "xon", u.backlog))

    def _watchdog(self, plugs: dict) -> None:
        """Release every port paused longer than the watchdog allows; it ignores pauses for ``restore_s``."""
        now = time.monotonic()
        for u in self.queues.values():
            if u.paused and now - u.paused_since > self.watchdog_s:
                ack = self._release(u, plugs)
                u.watchdog_events += 1
                u.ignore_until = ack + self.restore_s
                self.events.append((ack, u.node, u.port, u.pcp, "watchdog", u.backlog))

    def _frame_port(self, u: LosslessQueue) -> tuple[str, str]:
        """(namespace, ifname) of the switch port that sends PFC frames to the paused port u (u's link peer)."""
        plan = self._plans[(u.node, u.port)]
        return self.fabric.ns(plan.peer), plan.peer_ifname

    def _frame(self, u: LosslessQueue, pause: bool) -> None:
        """The 802.1Qbb frame for this transition, sent by u's link peer towards u (when frames are on)."""
        if self.frames is not None:
            ns, ifn = self._frame_port(u)
            self.frames.send(ns, ifn, u.pcp, pause)
