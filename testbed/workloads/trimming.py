"""Packet trimming on one run: UEC's switch-side answer to a full queue (docs/uet.md), loaded on every switch port
of the fabric, its counters accounted for at the end.

    tr = start_trimming(lab.net.fabric, lab.rundir, lab.on_teardown, threshold_bytes=0, progress=lab.progress)
    ... UET traffic (transport=uet) ...
    summary.update(tr.finish())      # trim.csv, the uet_trim* numbers (analysis.uet)

What it stands for: a switch port that, instead of dropping a UET data packet for lack of buffer, forwards its
headers flagged as trimmed, so the receiver NACKs it at once (testbed.kernel.trim: an eBPF program on the port's
clsact egress, before its HTB, with a virtual queue of the port). Every switch port gets one: leaf ports toward the
hosts and the spines, spine ports toward the leaves; host NICs do not trim (a NIC is not a switch). The trimmed
header goes into the port's own queue (the class its DSCP picks), behind at most the threshold's worth of bytes;
no strict-priority class of its own is added (see docs/uet.md, "Not done yet").

``threshold_bytes`` (``--set trim_threshold_bytes``): a port trims while its virtual queue holds at least this;
0 means half of each port's buffer (the leaf queue of its default class). File: ``trim.csv`` (``node, port,
counter, value``: each port's program counters and its virtual queue's peak at the end, and the threshold and
buffer it trimmed with: threshold_bytes, buffer_bytes); the summary's numbers are analysis.uet.trim_metrics over
it. The programs are detached at :meth:`TrimRun.finish` or at teardown.

A port whose rate a fault changes at run time (``slow-port``, and its end) is a slower port: the fault timeline
tells the run (``fabric.trim``, :meth:`TrimRun.set_port_rate`), the port's program drains its virtual queue at the
new rate, and the timeline records a ``trim_rate`` event (the rate the program's map holds, its trims so far).

Scenarios take :data:`TRIM_PARAMS`; :func:`trim_wanted` resolves ``trim=auto``; :func:`check_run` refuses what
cannot work before anything is built.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

from analysis.load import load_csv
from analysis.uet import trim_metrics
from testbed.errors import UsageError
from testbed.kernel import links, netns, trim as ktrim
from testbed.network.portplan import PortPlan, plan_port
from testbed.params import Param

COUNTER_COLUMNS = ["node", "port", "counter", "value"]
WIRE_OVERHEAD_BYTES = 14  # a pfifo's limit is in packets: one MTU frame each

TRIM_PARAMS = [
    Param("trim", str, "auto", "", "packet trimming at every switch port (UEC: a full queue forwards a UET data "
          "packet's headers, flagged, instead of dropping it; the receiver NACKs it; docs/uet.md): on, off, or auto "
          "(on with transport=uet on lossy ECMP ports: pfc=off, load_balancing=ecmp; off otherwise)",
          choices=("auto", "on", "off")),
    Param("trim_threshold_bytes", int, 0, "bytes", "trim: a switch port trims UET data packets while its queue "
          "(the program's virtual queue) holds at least this many bytes (0: half of the port's buffer)", min=0,
          max=1 << 30),
]


def trim_wanted(p: dict) -> bool:
    """Whether the run trims: trim=on, or trim=auto with transport=uet, pfc off and ECMP (the cases trim=on
    refuses otherwise: :func:`check_run`)."""
    mode = p.get("trim", "auto")
    if mode == "auto":
        return (p.get("transport") == "uet" and p.get("pfc", "off") == "off"
                and p.get("load_balancing", "ecmp") == "ecmp")
    return mode == "on"


def port_buffer_bytes(plan: PortPlan) -> int:
    """The buffer of a port's default class in bytes (a pfifo's packets as MTU frames): the virtual queue's cap."""
    q = next(c[2] for c in plan.classes if c[0] == plan.default_minor)
    return int(q.limit) * (plan.mtu + WIRE_OVERHEAD_BYTES) if q.kind == "pfifo" else int(q.limit)


def switch_ports(plans, roles: dict[str, str]) -> list[PortPlan]:
    """The egress ports that trim: every port of a node that is not a host."""
    return [pl for pl in plans if roles.get(pl.node) != "host"]


def threshold_for(plan: PortPlan, threshold_bytes: int) -> int:
    """The port's threshold: ``threshold_bytes``, or half its buffer for 0."""
    return threshold_bytes or port_buffer_bytes(plan) // 2


def port_problem(plan: PortPlan, threshold_bytes: int, what: tuple[str, str] = ("trim_threshold_bytes", "trim=off")
                 ) -> str | None:
    """Why the trimming program cannot go on this switch port (one line), or None: the port has several classes
    (the threshold and the virtual queue's cap are the default class's buffer, and UET's DSCP may pick another
    class), or ``threshold_bytes`` is above its buffer (the queue never reaches it). :func:`check_run` refuses with
    it before anything is built, :meth:`TrimRun.install` before anything is loaded. ``what``: the threshold's name
    and how to turn trimming off, as the caller knows them (the ``--set`` parameters, or the Lab API's)."""
    if len(plan.classes) > 1:
        return (f"trimming needs single-class switch ports (port {plan.node}:{plan.ifname} has {len(plan.classes)} "
                "classes; its threshold is the default class's buffer, and UET's DSCP may pick another): use a "
                f"topology without classes, or {what[1]}")
    buf = port_buffer_bytes(plan)
    if threshold_for(plan, threshold_bytes) > buf:
        return (f"{what[0]} ({threshold_bytes}) is above the buffer of switch port {plan.node}:"
                f"{plan.ifname} ({buf} bytes): the queue never reaches it")
    return None


def spec_switch_ports(spec) -> list[PortPlan]:
    """The switch ports of a topology spec as the fabric will plan them, before anything is built."""
    roles = {n.name: n.role for n in spec.nodes}
    return switch_ports([plan_port(ep) for ep in spec.egress_ports()], roles)


def check_run(p: dict, spec=None) -> None:
    """UsageError (one line) before anything exists: trim=on with another transport than UET (nothing else carries
    the UET header the program cuts and a NACK answers), with pfc=on (a paused port stops draining while the
    program's virtual queue goes on: it would trim a lossless class that cannot drop anyway), with a load balancer
    other than ECMP (its filters on the leaf uplinks end the hook's chain before the trimming program; UET sprays
    by entropy value itself), or, with `spec` (the topology, when known), a switch port that cannot trim
    (:func:`port_problem`)."""
    if p.get("trim", "auto") == "on":
        if p.get("transport") != "uet":
            raise UsageError(f"trim=on needs transport=uet (the switch trims UET data packets and the UET receiver "
                             f"NACKs them; got transport={p.get('transport')})")
        if p.get("pfc", "off") == "on":
            raise UsageError("trim=on needs lossy ports (pfc=off): a paused port drains nothing while the "
                             "trimming program's virtual queue does")
        if p.get("load_balancing", "ecmp") != "ecmp":
            raise UsageError(f"trim=on needs load_balancing=ecmp (got {p['load_balancing']}): UET sprays by "
                             "entropy value itself, and a balancer's filters would run before the trimming program")
    if spec is None or not trim_wanted(p):
        return
    for plan in spec_switch_ports(spec):
        problem = port_problem(plan, p.get("trim_threshold_bytes", 0))
        if problem:
            raise UsageError(problem)


def trim_needs(p: dict) -> tuple[str, ...]:
    """The programs' hook (clsact) when the run trims."""
    return ("qdisc:clsact",) if trim_wanted(p) else ()


#: the threshold's and trimming's names to a Lab API user (lab.trim(threshold_bytes=...)), in port_problem's lines
LAB_NAMES = ("lab.trim()'s threshold_bytes", "no lab.trim()")


class TrimRun:
    """The trimming program on every switch port of a fabric (see the module docstring)."""

    def __init__(self, fabric, rundir, threshold_bytes: int = 0, progress: Callable[[str], None] | None = None):
        if threshold_bytes < 0:
            raise UsageError(f"trim: threshold_bytes must be >= 0 (got {threshold_bytes})")
        self.fabric, self.rundir, self.threshold_bytes = fabric, rundir, int(threshold_bytes)
        self.progress = progress or (lambda _m: None)
        self.ports = switch_ports(fabric.port_plans, fabric.role)
        self.loaded: dict[tuple[str, str], tuple[int, ktrim.Trimmer]] = {}
        self.limits: dict[tuple[str, str], dict[str, int]] = {}  # per port: threshold_bytes, buffer_bytes
        self._summary: dict | None = None
        self._stats: dict[tuple[str, str], dict[str, int]] | None = None
        self._lock = threading.RLock()  # the fault timeline's thread changes rates while the run installs or closes

    def install(self) -> "TrimRun":
        """Load and attach the program on every switch port (UsageError before anything is loaded when a port cannot
        trim: :func:`port_problem`; everything detached again if one fails)."""
        problem = next(filter(None, (port_problem(pl, self.threshold_bytes, LAB_NAMES) for pl in self.ports)), None)
        if problem:
            raise UsageError(problem)
        rate_now = getattr(self.fabric, "port_rate_now_mbps", {})
        with self._lock:
            self.fabric.trim = self  # a rate change from now on waits for the lock, then finds the port loaded
            try:
                for plan in self.ports:
                    key = (plan.node, plan.ifname)
                    buf, thr = port_buffer_bytes(plan), threshold_for(plan, self.threshold_bytes)
                    ns = self.fabric.ns(plan.node)
                    idx = links.index(ns, plan.ifname)
                    self.limits[key] = {"threshold_bytes": thr, "buffer_bytes": buf}
                    with netns.ipr(ns) as ipr:
                        self.loaded[key] = (idx, ktrim.install(ipr, idx, rate_now.get(key, plan.rate_mbps), thr, buf))
            except BaseException:
                self.close()
                raise
        thr = sorted({threshold_for(pl, self.threshold_bytes) for pl in self.ports})
        self.progress(f"packet trimming on {len(self.loaded)} switch ports, threshold "
                      f"{'/'.join(map(str, thr))} bytes of the port's queue")
        return self

    def set_port_rate(self, node: str, ifname: str, rate_mbps: float) -> dict[str, float] | None:
        """Port `node:ifname` sends at `rate_mbps` from now (the fault timeline changed its HTB rate): its program's
        virtual queue drains at that rate from now on. Returns what the program's maps hold after the change
        (drain_rate_mbps, and trimmed_packets and vq_bytes so far), or None when the port has no program (not a
        switch port, or trimming has finished)."""
        with self._lock:
            if (node, ifname) not in self.loaded:
                return None
            t = self.loaded[(node, ifname)][1]
            got = t.set_drain_rate(rate_mbps)
            return {"drain_rate_mbps": got, "trimmed_packets": t.stats()["trimmed_packets"], "vq_bytes": t.vq_bytes()}

    def counters(self) -> dict[tuple[str, str], dict[str, int]]:
        """Per port (node, ifname) the program's counters and its virtual queue's peak (kept once read at close)."""
        if self._stats is None:
            return {k: t.stats() for k, (_i, t) in sorted(self.loaded.items())}
        return dict(self._stats)

    def finish(self) -> dict:
        """Write trim.csv (each port's counters and its threshold and buffer), detach and unload; the uet_trim*
        numbers as analysis.uet.trim_metrics defines them (uet_trim_threshold_bytes_min/_max: the thresholds the
        ports trimmed at, half of each buffer with threshold_bytes=0; without a switch port only uet_trim) and
        uet_trim=on. Idempotent."""
        if self._summary is not None:
            return dict(self._summary)
        try:
            counters = self.counters()
            path = self.rundir.write_csv("trim.csv", COUNTER_COLUMNS,
                                         ((n, i, k, v) for (n, i), c in counters.items()
                                          for k, v in {**c, **self.limits.get((n, i), {})}.items()))
        finally:
            self.close()
        self._summary = {**trim_metrics(load_csv(path, "trim")), "uet_trim": "on"}
        return dict(self._summary)

    def close(self) -> None:
        """Detach every port's program and unload it (idempotent; a namespace already gone took its filter)."""
        with self._lock:
            if getattr(self.fabric, "trim", None) is self:
                self.fabric.trim = None
            if self.loaded and self._stats is None:
                with contextlib.suppress(Exception):
                    self._stats = {k: t.stats() for k, (_i, t) in sorted(self.loaded.items())}
            for (node, _ifname), (idx, t) in list(self.loaded.items()):
                with contextlib.suppress(Exception), netns.ipr(self.fabric.ns(node)) as ipr:
                    ktrim.detach(ipr, idx, clsact=t.created_clsact)
                with contextlib.suppress(Exception):
                    t.close()
            self.loaded.clear()


def start_trimming(fabric, rundir, on_teardown: Callable[[Callable[[], object]], None], threshold_bytes: int = 0,
                   progress: Callable[[str], None] | None = None) -> TrimRun:
    """Packet trimming on every switch port of `fabric` (see the module docstring); closed at teardown."""
    run = TrimRun(fabric, rundir, threshold_bytes, progress)
    on_teardown(run.close)
    return run.install()


__all__ = ["LAB_NAMES", "TRIM_PARAMS", "TrimRun", "check_run", "port_buffer_bytes", "port_problem", "spec_switch_ports",
           "start_trimming", "switch_ports", "threshold_for", "trim_needs", "trim_wanted"]
