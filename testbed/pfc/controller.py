"""PFC (802.1Qbb priority flow control) emulation: lossless classes with XOFF/XON pauses that really stop the
upstream transmitter, driven by a controller process that watches queue occupancy through netlink.

    pfc = PfcController(fabric, interval_s=0.001, watchdog_ms=0)
    pfc.install()          # a plug qdisc in every lossless class of every port (released: traffic flows)
    pfc.start() ... traffic ... pfc.stop()   # a forked process; stop() releases every pause it holds
    pfc.write(rundir)      # pfc.csv (+ queues.csv from the same dumps), pfc.summary() -> flat metrics

Mechanism. Each port is HTB 1: -> 1:1 (link) -> 1:<minor> per class -> leaf qdisc <minor>:. For a lossless class
the leaf is replaced by a ``plug`` qdisc with the class queue's byte limit (drop-tail, like the bfifo it replaces);
for a RED/step (ECN marking) leaf, the plug becomes RED's child (RED parent <minor>:1) so marking stays and the
plug holds the packets. ``plug block`` (TCQ_PLUG_BUFFER) stops the class's dequeue at once (packets already in the
queue wait, arriving ones queue behind them); ``plug release_indefinite`` resumes it. Both are one RTM_NEWQDISC
change message on a raw netlink socket kept open in the port's namespace (testbed.kernel.plug).

Why a plug and not an HTB rate change: HTB keeps a class's token debt across a rate change; a packet sent at a
"pause" rate of a few bit/s leaves a debt of up to HTB's mbuffer (60 s), so the class would stay silent long after
the resume. A rate floor high enough to avoid that is not a pause. The plug stops and resumes exactly.

Control. The queues sit on the switches' *egress*. Every poll, one RTM_GETQDISC dump per switch namespace (as the
telemetry sampler does; host namespaces, which are only ever paused, every ``host_every`` polls for the record)
gives the backlog of every lossless class. The loop runs in its own process (a thread would share the interpreter
lock with the scenario's traffic threads and slow both down). A switch S's egress queue S->X above XOFF
makes S "congested towards X" for that priority until it drains to XON or below; while S is congested towards any X
for a priority, every neighbour U != X of S has its egress U->S paused for that priority (U's port is what feeds S:
a hardware switch would send a PFC XOFF frame out of its ingress port towards U). A paused port's own queue then
grows and can pause *its* upstream: congestion spreads hop by hop, head-of-line blocking flows that only share a
link with the congested one.

Hardware PFC accounts buffer per *ingress* port and priority; this emulation sees only the egress queues, so it
pauses every neighbour that could feed S, including ones that sent little (attribution "all feeders").

Reaction time: a crossing happens somewhere between the last sample below XOFF and the first one above; the
pause holds once the kernel acknowledged the plug change. ``reaction`` = ack time - last sample below XOFF (an upper
bound), ``control`` = ack time - the sample that saw the crossing. Headroom must absorb what the upstream sends
in the reaction time: ``headroom_needed = upstream rate x reaction_max + 2 frames`` (one in the veth, one being
dequeued).

Watchdog: a port paused longer than ``watchdog_ms`` is released and ignores pauses of that priority for
``watchdog_restore_ms`` (hardware PFC watchdogs do the same against pause storms and deadlocks); event ``watchdog``.

Pause storm (:meth:`PfcController.storm`, the fault timeline's ``pause-storm``): a port whose link peer keeps
sending XOFF whatever its buffer holds, as a stuck NIC receiver does. The port stays paused for as long as the storm
lasts; its own queue then fills and pauses its feeders, so the storm spreads like any congestion. The watchdog, when
on, releases it after ``watchdog_ms``; after ``watchdog_restore_ms`` the storm pauses it again (hardware watchdogs
re-arm the same way). Commands reach the controller process over a pipe it polls every tick.

pfc.csv rows (t_s, node, port, prio, event, backlog_bytes):
  ``xoff`` / ``xon``   the port node:port (an upstream egress) was paused / resumed for 802.1p priority prio;
                       backlog is that port's own class backlog at the last sample;
  ``above_xoff`` / ``below_xon``  the congested queue node:port crossed XOFF / drained to XON (the trigger);
  ``watchdog``         the watchdog released node:port;
  ``storm_on`` / ``storm_off``  a pause storm began / ended at node:port.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from testbed.kernel import netns
from testbed.kernel.plug import PlugSocket, delete_qdisc, tc_handle

RT_PRIORITY = 50  # SCHED_FIFO priority of the controller process (the kernel's threaded IRQs run at 50 too)

PFC_COLUMNS = ["t_s", "node", "port", "prio", "event", "backlog_bytes"]

# ---- the model ---------------------------------------------------------------------------------------------------


@dataclass
class LosslessQueue:
    """One lossless class on one egress port: where its plug is, its thresholds, its pause state."""

    node: str
    port: str
    peer: str
    ns: str
    ifindex: int
    minor: int
    cls: str
    pcp: int
    xoff: int
    xon: int
    headroom: int
    limit: int
    rate_bps: float  # link rate in bytes per second
    is_switch: bool
    leaf_kind: str = "bfifo"
    plug_handle: int = 0
    plug_parent: int = 0
    # as a watched (downstream) queue
    congested: bool = False
    t_below: float = 0.0  # last sample at or below XOFF
    t_above: float = 0.0  # sample that saw the crossing
    peak_over_xoff: int = 0
    # as a paused (upstream) port
    paused: bool = False
    paused_since: float = 0.0
    paused_total: float = 0.0
    pause_events: int = 0
    watchdog_events: int = 0
    ignore_until: float = 0.0
    backlog: int = 0
    drops: int = 0
    sent_at_pause: int | None = None
    leak_bytes_max: int = 0
    stormed: bool = False  # a pause storm holds this port paused (PfcController.storm)
    feeders: list = field(default_factory=list)  # for a switch port: keys of upstream ports to pause

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.node, self.port, self.minor)


def lossless_classes(topology) -> dict[tuple[str, str], list]:
    """{(node, ifname): [(ClassSpec, index in the port's class list), ...]} of every lossless class per egress."""
    out = {}
    for ep in topology.egress_ports():
        found = [(c, i) for i, c in enumerate(ep.port.classes) if c.lossless]
        if found:
            out[(ep.node, ep.ifname)] = found
    return out


def feeders_of(topology) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """For every router egress (S, X): the egress ports (U, ifname) of S's neighbours U != X pointing at S."""
    into: dict[str, list[tuple[str, str]]] = {}
    for ep in topology.egress_ports():
        into.setdefault(ep.peer, []).append((ep.node, ep.ifname))
    out = {}
    for ep in topology.egress_ports():
        if topology.node(ep.node).role == "host":
            continue
        out[(ep.node, ep.ifname)] = [(u, uif) for u, uif in into.get(ep.node, []) if u != ep.peer]
    return out


def headroom_needed(rate_bytes_per_s: float, reaction_s: float, mtu: int = 1500) -> int:
    """Bytes an upstream at line rate still delivers after XOFF is crossed: rate x reaction + 2 frames."""
    return int(rate_bytes_per_s * reaction_s + 2 * (mtu + 14))


def _pct(vals: list[float], q: float) -> float:
    if not vals:
        return float("nan")
    s = sorted(vals)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class PfcController:
    """See the module docstring. enabled=False: nothing is installed or paused; the same dumps still feed
    queues.csv, and pfc.summary() reports zeros (the lossy baseline uses the same sampling load)."""

    def __init__(self, fabric, interval_s: float = 0.001, watchdog_ms: float = 0.0, watchdog_restore_ms: float = 200.0,
                 enabled: bool = True, host_every: int = 10, min_sleep_s: float = 0.0005, frames: bool = False):
        from testbed.network.fabric import FIRST_MINOR

        self.host_every = max(1, int(host_every))
        self.min_sleep_s = min_sleep_s

        self.fabric = fabric
        self.topology = fabric.topology
        self.interval_s = float(interval_s)
        self.watchdog_s = watchdog_ms / 1000.0
        self.restore_s = watchdog_restore_ms / 1000.0
        self.enabled = enabled
        self.frames = None  # testbed.pfc.frame.PauseFrames when frames=True (opened by install)
        self._want_frames = bool(frames) and enabled
        self.frames_sent = self.frame_errors = 0
        self.events: list[tuple] = []
        self.queue_rows: list[tuple] = []
        self.reactions: list[float] = []  # ack - last sample below XOFF
        self.controls: list[float] = []  # ack - sample that saw the crossing
        self.ticks = 0
        self.sched = "not started"  # the controller process's scheduling policy (SCHED_FIFO when allowed)
        self.t_start = self.t_stop = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        topo = self.topology
        ll = lossless_classes(topo)
        feeders = feeders_of(topo)
        self.queues: dict[tuple[str, str, int], LosslessQueue] = {}
        plans = {(p.node, p.ifname): p for p in fabric.port_plans}
        for (node, ifn), found in ll.items():
            plan = plans[(node, ifn)]
            for c, i in found:
                minor = FIRST_MINOR + i
                leaf = next(q for m, _, q, *_ in plan.classes if m == minor)
                self.queues[(node, ifn, minor)] = LosslessQueue(
                    node=node, port=ifn, peer=plan.peer, ns=fabric.ns(node), ifindex=0, minor=minor, cls=c.name,
                    pcp=c.pcp, xoff=c.xoff_bytes, xon=c.xon_bytes, headroom=c.headroom_bytes, limit=leaf.limit,
                    rate_bps=plan.rate_mbps * 1e6 / 8, is_switch=topo.node(node).role != "host",
                    leaf_kind=leaf.kind)
        for q in self.queues.values():
            if q.is_switch:
                q.feeders = [(u, uif, q.minor) for u, uif in feeders.get((q.node, q.port), [])
                             if (u, uif, q.minor) in self.queues]
        self._plans = plans

    # ---- setup ----

    def install(self) -> None:
        """Put a released plug into every lossless class (no-op when disabled)."""
        by_ns: dict[str, list[LosslessQueue]] = {}
        for q in self.queues.values():
            by_ns.setdefault(q.ns, []).append(q)
        for ns, qs in by_ns.items():
            with netns.entered(ns):
                idx_of = {name: i for i, name in socket.if_nameindex()}
            for q in qs:
                q.ifindex = idx_of[q.port]
            if not self.enabled:
                continue
            from testbed.kernel.netns import ipr_in

            ipr = ipr_in(ns)
            ps = PlugSocket(ns)
            try:
                for q in qs:
                    leaf = tc_handle(q.minor)
                    cls = tc_handle(1, q.minor)
                    if q.leaf_kind == "bfifo":
                        delete_qdisc(ipr, q.ifindex, leaf, cls)
                        q.plug_handle, q.plug_parent = leaf, cls
                    elif q.leaf_kind in ("red", "step"):
                        q.plug_handle, q.plug_parent = tc_handle(0x100 + q.minor), tc_handle(q.minor, 1)
                    else:
                        raise ValueError(f"{q.node}:{q.port}: a lossless class needs a byte-limited queue "
                                         f"(droptail in bytes, red with ecn, step), not {q.leaf_kind}")
                    ps.add(q.ifindex, q.plug_handle, q.plug_parent, q.limit)
            finally:
                ps.close()
                ipr.close()
        if self._want_frames:
            self._open_frames()

    def _frame_port(self, u: LosslessQueue) -> tuple[str, str]:
        """(namespace, ifname) of the switch port that sends PFC frames to the paused port u (u's link peer)."""
        plan = self._plans[(u.node, u.port)]
        return self.fabric.ns(plan.peer), plan.peer_ifname

    def _open_frames(self) -> None:
        from testbed.pfc.frame import PauseFrames

        self.frames = PauseFrames()
        # every lossless port can be paused: a feeder by a congested switch, any port by a pause storm
        for k in sorted(self.queues):
            u = self.queues[k]
            ns, ifn = self._frame_port(u)
            self.frames.open(ns, ifn, [u.pcp])

    def class_drops(self) -> dict[tuple[str, str, int], int]:
        """Cumulative drops of every lossless class on every switch port now, {(node, port, minor): drops} (one
        raw qdisc dump per switch namespace; call before and after a run for the lossless drops in between)."""
        return {k: s.drops for k, s in self.class_stats().items()}

    def class_stats(self, switch_only: bool = True) -> dict:
        """Counters of every watched class queue now (switch ports; host NICs too unless ``switch_only``),
        {(node, port, minor): QueueSample}, one raw qdisc dump per namespace (after install())."""
        from testbed.measure.telemetry import RawQdiscDump

        out: dict = {}
        by_ns: dict[str, list[LosslessQueue]] = {}
        for q in self.queues.values():
            if q.is_switch or not switch_only:
                by_ns.setdefault(q.ns, []).append(q)
        for ns, qs in by_ns.items():
            dump = RawQdiscDump(ns)
            try:
                per_if = dump.leaf_stats()
            finally:
                dump.close()
            for q in qs:
                for st in per_if.get(q.ifindex, ()):
                    if st.minor == q.minor:
                        out[q.key] = st
        return out

    def close(self) -> None:
        """Close what install() opened for the controller (the PFC frame sockets)."""
        if self.frames is not None:
            self.frames.close()

    # ---- control ----

    def start(self) -> "PfcController":
        """Run the control loop in a forked child process (its own interpreter lock: the traffic threads of the
        scenario and the controller do not slow each other down); results come back over a pipe at stop()."""
        import multiprocessing as mp

        from testbed.measure import telemetry  # noqa: F401  (imported before the fork)

        ctx = mp.get_context("fork")
        self._mp_stop = ctx.Event()
        ready = ctx.Event()
        parent_end, child_end = ctx.Pipe(duplex=False)
        cmd_recv, self._cmd_send = ctx.Pipe(duplex=False)
        self._pipe = parent_end
        self._proc = ctx.Process(target=self._child, args=(child_end, ready, cmd_recv), name="pfc-controller",
                                 daemon=True)
        self._proc.start()
        child_end.close()
        cmd_recv.close()
        if not ready.wait(timeout=30) or not self._proc.is_alive():
            self.stop()
            raise RuntimeError(f"PFC controller did not start ({self._error or 'no error reported'})")
        return self

    def storm(self, node: str, port: str, on: bool) -> list[int]:
        """Start (on) or end a pause storm at the egress port node:port: its lossless classes stay paused. Returns
        the 802.1p priorities it holds; ValueError when the port has no lossless class or the controller is not
        running."""
        pcps = [q.pcp for q in self.queues.values() if (q.node, q.port) == (node, port)]
        if not pcps or not self.enabled:
            raise ValueError(f"pause storm at {node}:{port}: no lossless class there under PFC")
        if getattr(self, "_proc", None) is None:
            raise ValueError(f"pause storm at {node}:{port}: the PFC controller is not running")
        self._cmd_send.send(("storm", node, port, bool(on)))
        return pcps

    def _child(self, pipe, ready, cmds) -> None:
        self._cmds = cmds
        self._stop = self._mp_stop  # type: ignore[assignment]
        self._ready = ready  # type: ignore[assignment]
        # A switch reacts to its buffer in hardware, ahead of everything else. The nearest a process gets: run the
        # controller real-time (SCHED_FIFO) so a busy CPU (agents, the emulated VM's packet processing) delays its
        # polls as little as possible. It sleeps between polls, so it never takes the CPU from the kernel's
        # packet processing for long (and the kernel's RT throttling caps it at 95% of a CPU anyway).
        sched = "other"
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
            sched = f"fifo:{RT_PRIORITY}"
        try:
            self._loop()
        finally:
            ready.set()
            pipe.send({
                "error": repr(self._error) if self._error else None,
                "events": self.events, "queue_rows": self.queue_rows, "reactions": self.reactions,
                "controls": self.controls, "ticks": self.ticks, "t_start": self.t_start, "t_stop": self.t_stop,
                "sched": sched, "frames": (self.frames.sent, self.frames.errors) if self.frames else (0, 0),
                "queues": {k: (q.paused_total, q.pause_events, q.watchdog_events, q.peak_over_xoff,
                               q.leak_bytes_max) for k, q in self.queues.items()},
            })
            pipe.close()

    def stop(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is None:
            return
        self._mp_stop.set()
        res = None
        if self._pipe.poll(60):
            res = self._pipe.recv()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        self._proc = None
        if res is None:
            raise RuntimeError("PFC controller process ended without reporting (ports may have stayed paused)")
        self.events, self.queue_rows = res["events"], res["queue_rows"]
        self.reactions, self.controls = res["reactions"], res["controls"]
        self.ticks, self.t_start, self.t_stop = res["ticks"], res["t_start"], res["t_stop"]
        self.sched = res["sched"]
        self.frames_sent, self.frame_errors = res["frames"]
        for k, vals in res["queues"].items():
            q = self.queues[k]
            q.paused_total, q.pause_events, q.watchdog_events, q.peak_over_xoff, q.leak_bytes_max = vals
        if res["error"]:
            raise RuntimeError(f"PFC controller failed: {res['error']}")

    def _loop(self) -> None:
        from testbed.measure.telemetry import RawQdiscDump

        dumps: dict[str, RawQdiscDump] = {}
        plugs: dict[str, PlugSocket] = {}
        try:
            nss: dict[str, list[LosslessQueue]] = {}
            for q in self.queues.values():
                nss.setdefault(q.ns, []).append(q)
            # switches first: their samples drive the pauses
            order = sorted(nss, key=lambda ns: not any(q.is_switch for q in nss[ns]))
            for ns in order:
                dumps[ns] = RawQdiscDump(ns)
                plugs[ns] = PlugSocket(ns)
            labels = {}
            for ns in order:
                for q in nss[ns]:
                    labels[(q.ifindex, q.minor)] = q
            is_switch_ns = {ns: any(q.is_switch for q in nss[ns]) for ns in order}
            plan_of = {(q.node, q.port): self._plans[(q.node, q.port)] for q in self.queues.values()}
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        rows = self.queue_rows
        try:
            self.t_start = next_t = time.monotonic()
            while not self._stop.is_set():
                sample_hosts = self.ticks % self.host_every == 0
                for ns in order:
                    if not is_switch_ns[ns] and not sample_hosts:
                        continue
                    per_if = dumps[ns].leaf_stats()
                    t = time.monotonic()
                    touched = False
                    for q in nss[ns]:
                        for s in per_if.get(q.ifindex, ()):
                            if s.minor != q.minor:
                                continue
                            q.backlog, q.drops = s.backlog_bytes, s.drops
                            rows.append((t, q.node, q.port, plan_of[(q.node, q.port)].class_label(s.minor),
                                         s.backlog_bytes, s.backlog_packets, s.drops, s.marks, s.sent_bytes,
                                         s.sent_packets, s.overlimits))
                            if q.paused:
                                if q.sent_at_pause is None:
                                    q.sent_at_pause = s.sent_bytes
                                else:
                                    q.leak_bytes_max = max(q.leak_bytes_max, s.sent_bytes - q.sent_at_pause)
                            if q.is_switch and self.enabled:
                                touched |= self._watch(q, t, s.backlog_bytes)
                    if touched:
                        self._drive(ns_queues=nss[ns], plugs=plugs)
                if self._cmds.poll():
                    self._commands()
                if self.enabled:
                    self._storms(plugs)
                if self.enabled and self.watchdog_s > 0:
                    self._watchdog(plugs)
                self.ticks += 1
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:  # late: never spin, the kernel's packet processing needs the CPU more than we do
                    time.sleep(self.min_sleep_s)
                    next_t = time.monotonic()
        except BaseException as e:  # noqa: BLE001
            self._error = e
        finally:
            self.t_stop = time.monotonic()
            for q in self.queues.values():  # never leave a port paused behind us
                if q.paused:
                    with contextlib.suppress(Exception):
                        plugs[q.ns].release(q.ifindex, q.plug_handle, q.plug_parent)
                    q.paused_total += self.t_stop - q.paused_since
                    q.paused = False
                    self._frame(q, pause=False)
                    self.events.append((self.t_stop, q.node, q.port, q.pcp, "xon", q.backlog))
            for s in list(dumps.values()) + list(plugs.values()):
                with contextlib.suppress(Exception):
                    s.close()

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
            now = time.monotonic()
            if trig is not None:
                if now < u.ignore_until:
                    continue
                ack = self._pause(u, plugs)
                self.reactions.append(ack - trig.t_below)
                self.controls.append(ack - trig.t_above)
            else:
                plugs[u.ns].release(u.ifindex, u.plug_handle, u.plug_parent)
                ack = time.monotonic()
                self._frame(u, pause=False)
                u.paused = False
                u.paused_total += ack - u.paused_since
                self.events.append((ack, u.node, u.port, u.pcp, "xon", u.backlog))

    def _commands(self) -> None:
        """Storm commands from the parent (PfcController.storm)."""
        while self._cmds.poll():
            _, node, port, on = self._cmds.recv()
            for u in self.queues.values():
                if (u.node, u.port) == (node, port) and u.stormed != on:
                    u.stormed = on
                    self.events.append((time.monotonic(), u.node, u.port, u.pcp, "storm_on" if on else "storm_off",
                                        u.backlog))

    def _storms(self, plugs: dict) -> None:
        """Hold every stormed port paused (unless the watchdog is ignoring its pauses); resume one whose storm
        ended and that no congested queue wants paused."""
        for u in self.queues.values():
            if u.stormed and not u.paused and time.monotonic() >= u.ignore_until:
                self._pause(u, plugs)
            elif not u.stormed and u.paused and not self._wanted(u):
                plugs[u.ns].release(u.ifindex, u.plug_handle, u.plug_parent)
                ack = time.monotonic()
                self._frame(u, pause=False)
                u.paused = False
                u.paused_total += ack - u.paused_since
                self.events.append((ack, u.node, u.port, u.pcp, "xon", u.backlog))

    def _wanted(self, u: LosslessQueue) -> bool:
        """Does a congested switch queue want u paused (u is one of its feeders)?"""
        return any(q.congested and u.key in q.feeders for q in self.queues.values() if q.is_switch)

    def _pause(self, u: LosslessQueue, plugs: dict) -> float:
        plugs[u.ns].block(u.ifindex, u.plug_handle, u.plug_parent)
        ack = time.monotonic()
        u.paused, u.paused_since, u.sent_at_pause = True, ack, None  # before anything that can fail: released at exit
        u.pause_events += 1
        self._frame(u, pause=True)
        self.events.append((ack, u.node, u.port, u.pcp, "xoff", u.backlog))
        return ack

    def _frame(self, u: LosslessQueue, pause: bool) -> None:
        """The 802.1Qbb frame for this transition, sent by u's link peer towards u (when frames are on)."""
        if self.frames is not None:
            ns, ifn = self._frame_port(u)
            self.frames.send(ns, ifn, u.pcp, pause)

    def _watchdog(self, plugs: dict) -> None:
        now = time.monotonic()
        for u in self.queues.values():
            if u.paused and now - u.paused_since > self.watchdog_s:
                plugs[u.ns].release(u.ifindex, u.plug_handle, u.plug_parent)
                ack = time.monotonic()
                u.paused = False
                u.paused_total += ack - u.paused_since
                u.watchdog_events += 1
                u.ignore_until = ack + self.restore_s
                self.events.append((ack, u.node, u.port, u.pcp, "watchdog", u.backlog))

    # ---- results ----

    @property
    def achieved_interval_s(self) -> float:
        if self.ticks < 2:
            return float("nan")
        return (self.t_stop - self.t_start) / self.ticks

    def write(self, rundir, queues: bool = True) -> None:
        from testbed.measure.telemetry import QUEUE_COLUMNS

        rundir.write_csv("pfc.csv", PFC_COLUMNS,
                         ((f"{t:.6f}", n, p, pr, ev, b) for t, n, p, pr, ev, b in sorted(self.events)))
        if queues:
            rundir.write_csv("queues.csv", QUEUE_COLUMNS, ((f"{r[0]:.6f}", *r[1:]) for r in self.queue_rows))

    def summary(self) -> dict:
        span = max(self.t_stop - self.t_start, 1e-9)
        ups = [q for q in self.queues.values() if q.pause_events]
        worst = max(ups, key=lambda q: q.paused_total, default=None)
        react_max = max(self.reactions, default=float("nan"))
        # what can arrive at one switch queue during a reaction: every feeder that carried lossless traffic at its
        # line rate (they are paused together); the worst switch queue counts
        first: dict[tuple, int] = {}
        last: dict[tuple, int] = {}
        for r in self.queue_rows:
            first.setdefault((r[1], r[2]), r[8])
            last[(r[1], r[2])] = r[8]
        active = {k for k in last if last[k] > first[k]}
        inflow = max((sum(self.queues[f].rate_bps for f in q.feeders if (f[0], f[1]) in active)
                      for q in self.queues.values() if q.is_switch), default=0.0)
        need = headroom_needed(inflow, react_max) if self.reactions else 0
        headroom = min((q.headroom for q in self.queues.values() if q.is_switch), default=0)
        return {
            "pfc_enabled": self.enabled,
            "pfc_pause_events": sum(q.pause_events for q in self.queues.values()),
            "pfc_paused_ms_total": sum(q.paused_total for q in self.queues.values()) * 1e3,
            "pfc_paused_fraction_max": (worst.paused_total / span) if worst else 0.0,
            "pfc_paused_port_max": f"{worst.node}:{worst.port}" if worst else "",
            "pfc_pause_events_by_port": "; ".join(f"{q.node}:{q.port}={q.pause_events}"
                                                  for q in sorted(ups, key=lambda q: (q.node, q.port))),
            "pfc_watchdog_events": sum(q.watchdog_events for q in self.queues.values()),
            "pfc_frames_sent": self.frames_sent,  # 802.1Qbb frames put on the wire (0: frames off)
            "pfc_frame_errors": self.frame_errors,
            "pfc_xoff_crossings": sum(1 for e in self.events if e[4] == "above_xoff"),
            "pfc_reaction_ms_mean": (sum(self.reactions) / len(self.reactions) * 1e3) if self.reactions else None,
            "pfc_reaction_ms_p95": _pct(self.reactions, 95) * 1e3 if self.reactions else None,
            "pfc_reaction_ms_max": react_max * 1e3 if self.reactions else None,
            "pfc_control_ms_mean": (sum(self.controls) / len(self.controls) * 1e3) if self.controls else None,
            "pfc_control_ms_max": max(self.controls) * 1e3 if self.controls else None,
            "pfc_poll_interval_ms": self.achieved_interval_s * 1e3 if self.ticks >= 2 else None,
            "pfc_controller_sched": self.sched,
            "pfc_paused_leak_bytes_max": max((q.leak_bytes_max for q in self.queues.values()), default=0),
            "pfc_headroom_used_max_bytes": max((q.peak_over_xoff for q in self.queues.values()), default=0),
            "pfc_headroom_bytes": headroom,
            "pfc_headroom_needed_bytes": need,
            "pfc_headroom_ok": bool(need <= headroom) if self.reactions else True,
        }
