"""The fault timeline, played on a live fabric: links that die and come back, routing that notices, ports that
slow down, links that start losing or delaying packets, hosts that straggle or behave differently (those:
testbed.faults.host). What the faults are and how they are written: testbed.faults.plan; the kernel side:
testbed.kernel.linkfail, testbed.kernel.qdisc, testbed.kernel.cgroup, Fabric.set_rx_netem.

How routing reacts, as a fabric running BFD under its routing protocol does: a link that has been dead for
``detect_ms`` (the BFD detection time: interval x multiplier, e.g. 3 x 16.7 ms = 50 ms, or 3 x 100 ms = 300 ms) is
withdrawn: every router's routes are recomputed without it (topologies.routing.compute_routes) and the difference
is applied, on every router at once (the emulation has no routing-protocol propagation delay: each router learns
the failure at the same moment). A link that has been back for ``detect_ms`` is taken back the same way. A link
that comes back before its failure was detected is never withdrawn; packets sent into it meanwhile are lost.

Every change and every reaction is an event: ``events.csv`` (t_s on the run's monotonic clock, kind, target,
detail), written when the timeline closes. Kinds: link_down, link_up, routes_withdrawn, routes_restored,
port_slow, port_restored, netem_set, netem_cleared, pause_storm, pause_storm_end, pfc_watchdog (the PFC
controller's watchdog released a port: merged from its pfc.csv record at close), cpu_throttled, cpu_restored,
host_config, host_changed, host_restored, fault_not_reached (a step the workload ended before), trim_rate (a
slowed or restored port's trimming program drains at its new rate: testbed.workloads.trimming).
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from typing import Callable

from testbed.faults import plan as faultplan
from testbed.faults.plan import Fault, Step
from testbed.faults.host import HostFaults
from testbed.kernel import linkfail, netns, qdisc
from topologies.routing import compute_routes, route_diff
from testbed.errors import CapabilityMissing

EVENT_COLUMNS = ["t_s", "kind", "target", "detail"]


class FaultTimeline:
    """Faults added with :meth:`add` (checked against the fabric's topology at once), played from :meth:`start`
    (t = 0: the workload's start) by one thread until :meth:`close`, which also undoes whatever is still in
    effect (links mended, routes, rates and netem restored) and returns the events."""

    def __init__(self, fabric, progress: Callable[[str], None] = lambda m: None,
                 horizon_s: float | None = None):
        self.fabric = fabric
        self.topology = fabric.topology
        self.progress = progress
        self.horizon_s = horizon_s
        self.faults: list[Fault] = []
        self.events: list[tuple[float, str, str, str]] = []
        self.t0: float | None = None
        self._iprs: dict[str, object] = {}
        self._indexes: dict[str, int] = {}
        self._holes: dict[str, int] = {}  # node -> its dead-link blackhole's index (testbed.kernel.linkfail)
        self._cut: dict[str, object] = {}  # link name -> link, while it is cut
        self._episode: dict[str, int] = {}  # link name -> changes so far (a detection checks nothing changed since)
        self._withdrawn: dict[str, object] = {}  # links routing has taken out
        self._label: dict[str, str] = {}  # link name -> the target text of the fault that cut it
        self._routes = list(self.topology.routes)
        self._slow: set[tuple[str, str]] = set()
        self._netem: set[tuple[str, str]] = set()  # receiving (node, ifname) with a fault's netem on
        self._storming: set[tuple[str, str]] = set()  # ports a pause storm holds
        self._armed: list[Fault] = []  # faults at an iteration that iteration() has scheduled
        self._heap: list[tuple[float, int, Callable[[], None], Step | None]] = []
        self._seq = 0
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # kernel changes: the player thread and close() never interleave
        self.hosts = HostFaults(fabric, self._ipr, self._index, self._event)

    # ---- plan ----

    def add(self, fault: Fault | str, at_s: float | None = None) -> Fault:
        """Add a fault (a :class:`Fault` or its text); `at_s` overrides the fault's own start."""
        f = faultplan.parse(fault, at_s) if isinstance(fault, str) else fault
        if at_s is not None and f.at_s != at_s:
            f = faultplan.make(f.kind, f.target, **{**dict(f.params), "at_s": at_s})
        faultplan.check([f], self.topology, self.horizon_s)
        if self.t0 is not None:
            raise RuntimeError("add faults before the timeline starts")
        self.faults.append(f)
        self._prepare(f)
        return f

    def _prepare(self, f: Fault) -> None:
        """What a step would otherwise do late, done now, before the workload: netlink sockets in every namespace
        the fault touches (for a link: every router, since routing reacts), interface indexes, a dead link's
        blackhole and ingress qdiscs, and a netem fault's IFB (with the link's own settings; the step then only
        changes its netem). Creating an IFB took 2 s in the software-emulated lab VM."""
        for node in self._nodes_touched([f]):
            self._ipr(node)
        if faultplan.KINDS[f.kind][2] == "host":
            self.hosts.prepare(f)
        elif faultplan.KINDS[f.kind][2] == "link":
            link = faultplan.find_link(self.topology, f.target)
            for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
                self._holes[node] = linkfail.prepare(self._ipr(node), self._index(node, port))
        elif f.kind == "netem":
            rx = self._far_end(*faultplan.find_port(self.topology, f.target))
            try:
                self.fabric.set_rx_netem(*rx, ipr=self._ipr(rx[0]), **self.fabric.link_netem(*rx))
            except netns.NetlinkError as e:
                if e.code != 2:  # ENOENT: this kernel has no sch_netem
                    raise
                raise CapabilityMissing("qdisc:netem", f"fault {f}: run it in the lab VM (testbed vm -- ...)") \
                    from None

    # ---- play ----

    def start(self, t0: float | None = None) -> None:
        """Start playing (t = 0 is `t0`, default now). Does nothing without faults or when already started."""
        if self.t0 is not None or not self.faults:
            return
        self.t0 = time.monotonic() if t0 is None else t0
        for f in self.faults:
            if f.at_iteration is not None:
                continue  # armed by iteration()
            for st in faultplan.steps(f):
                self._schedule(st.t_s, self._step_action(st), st)
        self.progress(f"fault timeline: {len(self.faults)} fault(s), {len(self._heap)} step(s)"
                      + (f", {len(self.by_iteration)} at an iteration" if self.by_iteration else ""))
        self._thread = threading.Thread(target=self._play, name="fault-timeline", daemon=True)
        self._thread.start()

    @property
    def by_iteration(self) -> list[Fault]:
        """The faults that start at an iteration of a collective job (not yet armed)."""
        return [f for f in self.faults if f.at_iteration is not None and f not in self._armed]

    def iteration(self, k: int) -> None:
        """A collective job began its iteration `k` now (its rank 0 said so): play the faults that start there,
        their times from now."""
        if self.t0 is None:
            return
        now_s = time.monotonic() - self.t0
        for f in self.by_iteration:
            if f.at_iteration == k:
                self._armed.append(f)
                self._event("iteration_reached", f.target, f"iteration={k};fault={f.kind}")
                for st in faultplan.steps(f):
                    self._schedule(now_s + st.t_s, self._step_action(st), st)

    def _schedule(self, t_s: float, fn: Callable[[], None], step: Step | None = None) -> None:
        with self._cv:
            heapq.heappush(self._heap, (t_s, self._seq, fn, step))
            self._seq += 1
            self._cv.notify()

    def _play(self) -> None:
        while True:
            with self._cv:
                while not self._stop:
                    if self._heap:
                        wait = self.t0 + self._heap[0][0] - time.monotonic()
                        if wait <= 0:
                            break
                        self._cv.wait(wait)
                    else:
                        self._cv.wait()
                if self._stop:
                    return
                _, _, fn, step = heapq.heappop(self._heap)
            try:
                with self._lock:
                    fn()
            except Exception as e:  # noqa: BLE001 - a failed step is recorded, the timeline goes on
                what = f"{step.op} ({step.fault}): " if step is not None else ""
                self._event("fault_error", step.fault.target if step is not None else "",
                            f"{what}{type(e).__name__}: {e}")

    def _event(self, kind: str, target: str, detail: str = "") -> None:
        self.events.append((time.monotonic(), kind, target, detail))

    def _ipr(self, node: str):
        if node not in self._iprs:
            self._iprs[node] = netns.ipr(self.fabric.ns(node))
        return self._iprs[node]

    def _index(self, node: str, ifname: str) -> int:
        key = f"{node}:{ifname}"
        if key not in self._indexes:
            self._indexes[key] = self._ipr(node).link_lookup(ifname=ifname)[0]
        return self._indexes[key]

    def _nodes_touched(self, faults: list[Fault]) -> set[str]:
        """Every node the faults change: both ends of a link (and, for a link, every router: routing reacts), a
        port's node and its far end."""
        out: set[str] = set()
        for f in faults:
            if faultplan.KINDS[f.kind][2] == "link":
                link = faultplan.find_link(self.topology, f.target)
                out |= {link.a, link.b} | {n.name for n in self.topology.routers}
            elif faultplan.KINDS[f.kind][2] == "host":
                out |= {n for l in self.topology.links if f.target in (l.a, l.b) for n in (l.a, l.b)}
            else:
                node, ifname = faultplan.find_port(self.topology, f.target)
                out |= {node, self._far_end(node, ifname)[0]}
        return out

    # ---- steps ----

    def _step_action(self, st: Step) -> Callable[[], None]:
        f = st.fault
        if faultplan.KINDS[f.kind][2] == "host":
            return self.hosts.action(st)
        if st.op in ("cut", "mend"):
            link = faultplan.find_link(self.topology, f.target)
            detect_s = float(f.get("detect_ms", faultplan.DEFAULT_DETECT_MS)) / 1000.0
            return (lambda: self._cut_link(link, detect_s, f.target)) if st.op == "cut" else \
                (lambda: self._mend_link(link, detect_s))
        node, ifname = faultplan.find_port(self.topology, f.target)
        if st.op in ("storm", "storm-end"):
            return lambda: self._storm(node, ifname, st.op == "storm")
        if st.op == "rate":
            return lambda: self._set_rate(node, ifname, float(st.value))
        rx = self._far_end(node, ifname)
        if st.op == "netem":
            return lambda: self._set_netem(rx, f.target, dict(st.value))
        return lambda: self._clear_netem(rx, f.target)

    def _cut_link(self, link, detect_s: float, label: str) -> None:
        if link.name in self._cut:
            return
        self._label[link.name] = label  # events name the link as the fault did
        for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
            linkfail.cut(self._ipr(node), self._index(node, port), self._holes[node])
        self._cut[link.name] = link
        ep = self._episode[link.name] = self._episode.get(link.name, 0) + 1
        self._event("link_down", label, f"detect_ms={detect_s * 1000:g}")
        self._schedule(time.monotonic() - self.t0 + detect_s, lambda: self._detected(link, ep, down=True))

    def _mend_link(self, link, detect_s: float | None) -> None:
        if link.name not in self._cut:
            return
        for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
            linkfail.mend(self._ipr(node), self._index(node, port))
        del self._cut[link.name]
        ep = self._episode[link.name] = self._episode[link.name] + 1
        self._event("link_up", self._label[link.name])
        if detect_s is not None:
            self._schedule(time.monotonic() - self.t0 + detect_s, lambda: self._detected(link, ep, down=False))

    def _detected(self, link, episode: int, down: bool) -> None:
        """Detection time after a cut (down) or a mend (up): react only if the link stayed that way since."""
        if self._episode.get(link.name) != episode or (link.name in self._withdrawn) == down:
            return
        if down:
            self._withdrawn[link.name] = link
        else:
            del self._withdrawn[link.name]
        n = self._reroute()
        self._event("routes_withdrawn" if down else "routes_restored", self._label[link.name], f"routes_changed={n}")

    def _reroute(self) -> int:
        new = compute_routes(self.topology, down=self._withdrawn.values())
        changes = route_diff(self._routes, new)
        n = 0
        for node, (replace, delete) in changes.items():
            ifindex = {p: self._index(node, p) for p in {nh.ifname for r in replace for nh in r.nexthops}}
            linkfail.apply_routes(self._ipr(node), ifindex, replace, delete)
            n += len(replace) + len(delete)
        self._routes = new
        return n

    def _set_rate(self, node: str, ifname: str, fraction: float) -> None:
        plan = self.fabric.port_plan(node, ifname)
        rate = plan.rate_mbps * fraction
        qdisc.set_port_rate(self._ipr(node), self._index(node, ifname), rate, self.fabric.port_classes(plan),
                            mtu=plan.mtu)
        if fraction < 1.0:
            self._slow.add((node, ifname))
            self._event("port_slow", f"{node}:{ifname}", f"rate_mbps={rate:g};of_mbps={plan.rate_mbps:g}")
        else:
            self._slow.discard((node, ifname))
            self._event("port_restored", f"{node}:{ifname}", f"rate_mbps={plan.rate_mbps:g}")
        self._tell_trimming(node, ifname, rate)

    def trimming_started(self) -> None:
        """Trimming began while ports were slowed (at their rates now): a ``trim_rate`` event per slowed port."""
        rates = getattr(self.fabric, "port_rate_now_mbps", {})
        with self._lock:  # not between the player thread's rate change and its own trim_rate row
            for key in sorted(self._slow):
                if key in rates:
                    self._tell_trimming(*key, rates[key])

    def _tell_trimming(self, node: str, ifname: str, rate_mbps: float) -> None:
        """A port's trimming program (the run's TrimRun, ``fabric.trim``; one started later reads
        ``fabric.port_rate_now_mbps``) drains at the port's new rate, else at a slowed port its virtual queue empties
        faster than the real one and it trims late or never; a ``trim_rate`` event records what its map holds."""
        getattr(self.fabric, "port_rate_now_mbps", {})[(node, ifname)] = rate_mbps
        trimming = getattr(self.fabric, "trim", None)
        got = trimming.set_port_rate(node, ifname, rate_mbps) if trimming is not None else None
        if got is not None:
            self._event("trim_rate", f"{node}:{ifname}", f"drain_rate_mbps={got['drain_rate_mbps']:g};"
                        f"trimmed_packets={got['trimmed_packets']};vq_bytes={got['vq_bytes']}")

    def _storm(self, node: str, ifname: str, on: bool) -> None:
        pfc = getattr(self.fabric, "pfc", None)
        if pfc is None:
            raise RuntimeError("a pause storm needs PFC running on the fabric (testbed.pfc.run.start_pfc)")
        pcps = pfc.storm(node, ifname, on)
        if on:
            self._storming.add((node, ifname))
        else:
            self._storming.discard((node, ifname))
        self._event("pause_storm" if on else "pause_storm_end", f"{node}:{ifname}",
                    "prio=" + ",".join(map(str, pcps)))

    def _far_end(self, node: str, ifname: str) -> tuple[str, str]:
        for l in self.topology.links:
            if (l.a, l.a_port) == (node, ifname):
                return l.b, l.b_port
            if (l.b, l.b_port) == (node, ifname):
                return l.a, l.a_port
        raise KeyError(f"no link at {node}:{ifname}")

    def _set_netem(self, rx: tuple[str, str], target: str, netem: dict) -> None:
        base = self.fabric.link_netem(*rx)
        self.fabric.set_rx_netem(*rx, ipr=self._ipr(rx[0]), **{**base, **netem})
        self._netem.add(rx)
        self._event("netem_set", target, ";".join(f"{k}={v:g}" for k, v in sorted(netem.items())))

    def _clear_netem(self, rx: tuple[str, str], target: str) -> None:
        self.fabric.set_rx_netem(*rx, ipr=self._ipr(rx[0]), **self.fabric.link_netem(*rx))
        self._netem.discard(rx)
        self._event("netem_cleared", target)

    # ---- end ----

    def close(self) -> list[tuple[float, str, str, str]]:
        """Stop playing, record the steps the workload ended before, undo what is still in effect (the fabric is
        as built again), close the sockets. Returns the events. Safe to call twice."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self.t0 is None:  # the workload never started (or closed twice): nothing was played
            for f in self.faults:
                self._event("fault_not_reached", f.target, f"{f}: the workload never started")
            self.faults = []
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for _, _, _, st in sorted(self._heap, key=lambda x: (x[0], x[1])):
                if st is not None:
                    self._event("fault_not_reached", st.fault.target, f"{st.op} at_s={st.t_s:g}")
            if self.t0 is not None:
                for f in self.by_iteration:
                    self._event("fault_not_reached", f.target, f"{f}: iteration {f.at_iteration} never began")
            self._heap.clear()
            self._undo()
            try:
                self.hosts.undo()
            except Exception as e:  # noqa: BLE001 - recorded; testbed clean removes a cgroup left behind
                self._event("fault_error", "", f"undo host faults: {type(e).__name__}: {e}")
            for ipr in self._iprs.values():
                with contextlib.suppress(Exception):
                    ipr.close()
            self._iprs.clear()
        return sorted(self.events, key=lambda e: e[0])

    def _undo(self) -> None:
        if not self.fabric.built or self.t0 is None:
            return
        try:
            for link in list(self._cut.values()):
                self._mend_link(link, None)
            if self._withdrawn:
                self._withdrawn.clear()
                n = self._reroute()
                self._event("routes_restored", "all", f"routes_changed={n};at_close")
            for node, ifname in list(self._slow):
                self._set_rate(node, ifname, 1.0)
            for rx in list(self._netem):
                self._clear_netem(rx, f"{rx[0]}:{rx[1]}")
            for node, ifname in list(self._storming):
                with contextlib.suppress(ValueError):  # the controller has stopped: it released every pause
                    self._storm(node, ifname, False)
            self._watchdog_events()
        except Exception as e:  # noqa: BLE001 - the namespaces are about to go anyway
            self._event("fault_error", "", f"undo: {type(e).__name__}: {e}")

    def _watchdog_events(self) -> None:
        """The PFC watchdog's releases (from the controller's record, once it has stopped) as events."""
        pfc = getattr(self.fabric, "pfc", None)
        if pfc is None or not any(f.kind == "pause-storm" for f in self.faults):
            return
        for t, node, port, pcp, kind, backlog in sorted(pfc.events):
            if kind == "watchdog":
                self.events.append((t, "pfc_watchdog", f"{node}:{port}", f"prio={pcp};backlog_bytes={backlog}"))

    def lost_frames(self) -> int:
        """Frames the dead links swallowed, over every namespace that had one."""
        total = 0
        for node in {n for l in self.links_touched() for n in (l.a, l.b)}:
            with contextlib.suppress(Exception), netns.ipr(self.fabric.ns(node)) as ipr:
                total += linkfail.dropped(ipr)
        return total

    def links_touched(self) -> list:
        """The links the faults cut or flap."""
        return [faultplan.find_link(self.topology, f.target) for f in self.faults
                if faultplan.KINDS[f.kind][2] == "link"]


__all__ = ["EVENT_COLUMNS", "FaultTimeline"]
