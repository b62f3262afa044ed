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
lock with the scenario's traffic threads and slow both down). What it watches and pauses is testbed.pfc.queues
(a switch egress above XOFF pauses every neighbour feeding that switch); the decisions, tick by tick (XOFF/XON
hysteresis, reaction times, pause storms, the watchdog), are testbed.pfc.pausing.

Headroom must absorb what the upstream sends in the reaction time: ``headroom_needed = upstream rate x
reaction_max + 2 frames`` (one in the veth, one being dequeued); :meth:`PfcController.summary` compares it with the
smallest switch headroom.

Pause storm (:meth:`PfcController.storm`, the fault timeline's ``pause-storm``): a port whose link peer keeps
sending XOFF whatever its buffer holds. The port stays paused for as long as the storm lasts; its own queue then
fills and pauses its feeders, so the storm spreads like any congestion. The watchdog, when on, releases it after
``watchdog_ms``; after ``watchdog_restore_ms`` the storm pauses it again (hardware watchdogs re-arm the same way).
Commands reach the controller process over a pipe it polls every tick.

pfc.csv rows (t_s, node, port, prio, event, backlog_bytes):
  ``xoff`` / ``xon``   the port node:port (an upstream egress) was paused / resumed for 802.1p priority prio;
                       backlog is that port's own class backlog at the last sample;
  ``above_xoff`` / ``below_xon``  the congested queue node:port crossed XOFF / drained to XON (the trigger);
  ``watchdog``         the watchdog released node:port;
  ``storm_on`` / ``storm_off``  a pause storm began / ended at node:port.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from testbed.kernel import netns
from testbed.kernel.plug import PlugSocket, delete_qdisc, tc_handle
from testbed.kernel.qdiscdump import RawQdiscDump
from testbed.measure.telemetry import QUEUE_COLUMNS
from testbed.pfc.frame import PauseFrames
from testbed.pfc.pausing import PauseLogic
from testbed.pfc.queues import LosslessQueue, lossless_queues
from testbed.pfc.summary import pfc_summary

RT_PRIORITY = 50  # SCHED_FIFO priority of the controller process (the kernel's threaded IRQs run at 50 too)

PFC_COLUMNS = ["t_s", "node", "port", "prio", "event", "backlog_bytes"]


@dataclass
class _Sockets:
    """What the controller process holds open: per namespace a qdisc dump socket and a plug socket, the lossless
    queues in it, switches first (their samples drive the pauses)."""

    order: list[str] = field(default_factory=list)
    queues: dict[str, list[LosslessQueue]] = field(default_factory=dict)
    is_switch: dict[str, bool] = field(default_factory=dict)
    dumps: dict[str, RawQdiscDump] = field(default_factory=dict)
    plugs: dict[str, PlugSocket] = field(default_factory=dict)

    @classmethod
    def open(cls, queues) -> "_Sockets":
        out = cls()
        for q in queues:
            out.queues.setdefault(q.ns, []).append(q)
        out.order = sorted(out.queues, key=lambda ns: not any(q.is_switch for q in out.queues[ns]))
        out.is_switch = {ns: any(q.is_switch for q in out.queues[ns]) for ns in out.order}
        try:
            for ns in out.order:
                out.dumps[ns] = RawQdiscDump(ns)
                out.plugs[ns] = PlugSocket(ns)
        except BaseException:
            out.close()
            raise
        return out

    def close(self) -> None:
        for s in list(self.dumps.values()) + list(self.plugs.values()):
            with contextlib.suppress(Exception):
                s.close()


class PfcController(PauseLogic):
    """See the module docstring. enabled=False: nothing is installed or paused; the same dumps still feed
    queues.csv, and pfc.summary() reports zeros (the lossy baseline uses the same sampling load)."""

    def __init__(self, fabric, interval_s: float = 0.001, watchdog_ms: float = 0.0, watchdog_restore_ms: float = 200.0,
                 enabled: bool = True, host_every: int = 10, min_sleep_s: float = 0.0005, frames: bool = False):
        super().__init__(fabric, lossless_queues(fabric), watchdog_s=watchdog_ms / 1000.0,
                         restore_s=watchdog_restore_ms / 1000.0)
        self.host_every = max(1, int(host_every))
        self.min_sleep_s = min_sleep_s
        self.topology = fabric.topology
        self.interval_s = float(interval_s)
        self.enabled = enabled
        self._want_frames = bool(frames) and enabled  # PauseFrames opened by install()
        self.frames_sent = self.frame_errors = 0
        self.queue_rows: list[tuple] = []
        self.ticks = 0
        self.sched = "not started"  # the controller process's scheduling policy (SCHED_FIFO when allowed)
        self.t_start = self.t_stop = 0.0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None

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
            ipr = netns.ipr_in(ns)
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

    def _open_frames(self) -> None:
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
        """The controller process's poll loop: every ``interval_s``, sample the lossless queues and pause / resume
        (testbed.pfc.pausing); it never sleeps less than ``min_sleep_s``. On the way out every pause it holds is
        released."""
        try:
            socks = _Sockets.open(self.queues.values())
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            self.t_start = next_t = time.monotonic()
            while not self._stop.is_set():
                self._tick(socks)
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
            self._release_all(socks.plugs)
            socks.close()

    def _tick(self, socks: _Sockets) -> None:
        """One poll: sample the switches (and every ``host_every`` ticks the hosts), drive the feeders of a switch
        whose queue crossed a threshold, then storm commands, storms and the watchdog."""
        sample_hosts = self.ticks % self.host_every == 0
        for ns in socks.order:
            if (socks.is_switch[ns] or sample_hosts) and self._sample(ns, socks):
                self._drive(ns_queues=socks.queues[ns], plugs=socks.plugs)
        if self._cmds.poll():
            self._commands()
        if self.enabled:
            self._storms(socks.plugs)
        if self.enabled and self.watchdog_s > 0:
            self._watchdog(socks.plugs)
        self.ticks += 1

    def _sample(self, ns: str, socks: _Sockets) -> bool:
        """One qdisc dump of namespace ``ns``: a queues.csv row per lossless queue, a paused port's leak (bytes it
        sent while paused), the XOFF/XON hysteresis of each switch queue. True when a switch queue changed state."""
        per_if = socks.dumps[ns].leaf_stats()
        t = time.monotonic()
        touched = False
        for q in socks.queues[ns]:
            for s in per_if.get(q.ifindex, ()):
                if s.minor != q.minor:
                    continue
                q.backlog, q.drops = s.backlog_bytes, s.drops
                self.queue_rows.append((t, q.node, q.port, self._plans[(q.node, q.port)].class_label(s.minor),
                                        s.backlog_bytes, s.backlog_packets, s.drops, s.marks, s.sent_bytes,
                                        s.sent_packets, s.overlimits))
                if q.paused:
                    if q.sent_at_pause is None:
                        q.sent_at_pause = s.sent_bytes
                    else:
                        q.leak_bytes_max = max(q.leak_bytes_max, s.sent_bytes - q.sent_at_pause)
                if q.is_switch and self.enabled:
                    touched |= self._watch(q, t, s.backlog_bytes)
        return touched

    def _release_all(self, plugs: dict) -> None:
        """Never leave a port paused behind the controller: release every pause it holds (at ``t_stop``)."""
        for q in self.queues.values():
            if q.paused:
                with contextlib.suppress(Exception):
                    plugs[q.ns].release(q.ifindex, q.plug_handle, q.plug_parent)
                q.paused_total += self.t_stop - q.paused_since
                q.paused = False
                self._frame(q, pause=False)
                self.events.append((self.t_stop, q.node, q.port, q.pcp, "xon", q.backlog))

    def _commands(self) -> None:
        """Storm commands from the parent (PfcController.storm)."""
        while self._cmds.poll():
            _, node, port, on = self._cmds.recv()
            for u in self.queues.values():
                if (u.node, u.port) == (node, port) and u.stormed != on:
                    u.stormed = on
                    self.events.append((time.monotonic(), u.node, u.port, u.pcp, "storm_on" if on else "storm_off",
                                        u.backlog))

    # ---- results ----

    @property
    def achieved_interval_s(self) -> float:
        if self.ticks < 2:
            return float("nan")
        return (self.t_stop - self.t_start) / self.ticks

    def write(self, rundir, queues: bool = True) -> None:
        rundir.write_csv("pfc.csv", PFC_COLUMNS,
                         ((f"{t:.6f}", n, p, pr, ev, b) for t, n, p, pr, ev, b in sorted(self.events)))
        if queues:
            rundir.write_csv("queues.csv", QUEUE_COLUMNS, ((f"{r[0]:.6f}", *r[1:]) for r in self.queue_rows))

    def summary(self) -> dict:
        """The run's pfc_* numbers (testbed.pfc.summary)."""
        return pfc_summary(self)
