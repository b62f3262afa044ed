"""A switch port's egress, as the kernel builds it: an HTB shaper at the link rate, one HTB class per traffic
class, and under each class the leaf queue that decides who waits, who is marked and who is dropped.

    root 1: htb (default class 1:10)
      1:1  rate = ceil = link rate                      the wire
        1:10, 1:11, ...  one per traffic class (prio, DRR weight, ceil = link rate)
          10:, 11:, ...  leaf queue: bfifo / pfifo (drop-tail), red (RED/ECN), red-as-step (DCTCP marking at K)

How classes share the wire (a port with a single class simply gets the link as that class's rate). With several,
every class's own HTB rate is a token 1/1000 of the link, so all of them send by
borrowing from 1:1, and HTB hands borrowed bandwidth out in `prio` order (0 first) and, within one prio, round robin
with a quantum proportional to the class's weight (deficit round robin). That is a switch's scheduler: strict
priority classes (a lower prio starves a higher one as long as it has packets) above weighted classes (ETS/DWRR).
Giving a class a real guaranteed rate instead would break both: HTB serves a class within its own rate before any
borrower whatever its prio, and children whose rates add up to more than the link let the port send above it.

Putting the bottleneck on the switch's egress (not on the sender's NIC) matters: shaping the sender's own NIC
back-pressures its socket instead of queueing and dropping (mininet#1034).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from testbed.kernel import netns
from testbed.kernel import tcext  # noqa: F401  (registers red, ets, flower, bfifo)

WIRE_OVERHEAD_BYTES = 14  # Ethernet header counted by the shaper on veth (no preamble/FCS on a veth)


@dataclass(frozen=True)
class LeafQueue:
    """The leaf queue under one class. kind: bfifo (limit bytes), pfifo (limit packets), red, step.

    red: RED with probabilistic early marking between min_bytes and max_bytes (ecn) or early drop (no ecn).
    step: mark every ECN-capable packet while the instantaneous queue exceeds k_bytes (DCTCP-style switch marking),
          built as RED with EWMA weight 1, min = K, max = K + one packet, probability 1.
    """

    kind: str
    limit: int  # bytes for bfifo/red/step, packets for pfifo
    min_bytes: int = 0
    max_bytes: int = 0
    probability: float = 0.0
    ecn: bool = True
    k_bytes: int = 0
    avpkt: int = 1514
    burst: int | None = None  # red: packets a burst may bring before the average reacts (None: tc's default)

    def tc_args(self, rate_bytes: int | None = None) -> tuple[str, dict]:
        """(qdisc kind, pyroute2 arguments); `rate_bytes`, the link rate in bytes/s, sets RED's idle damping (how
        fast the average decays while the queue is empty), as `tc ... red bandwidth` does."""
        if self.kind in ("bfifo", "pfifo"):
            return self.kind, {"limit": int(self.limit)}
        if self.kind == "red":
            args = {"limit": self.limit, "min": self.min_bytes, "max": self.max_bytes,
                    "probability": self.probability, "ecn": self.ecn, "avpkt": self.avpkt, "harddrop": False}
            if self.burst is not None:
                args["burst"] = self.burst
            if rate_bytes:
                args["bandwidth"] = rate_bytes
            return "red", args
        if self.kind == "step":
            return "red", {"limit": self.limit, "min": self.k_bytes, "max": self.k_bytes + self.avpkt,
                           "probability": 1.0, "ecn": True, "avpkt": self.avpkt, "instantaneous": True}
        raise ValueError(f"unknown leaf queue kind {self.kind!r}")


@dataclass(frozen=True)
class PortClass:
    """One traffic class on a port: HTB class 1:<minor> with a strict `prio` (0 highest, 7 lowest) and, among the
    classes of the same prio, a round-robin `weight` (its share when all of them are backlogged)."""

    minor: int
    queue: LeafQueue
    prio: int = 0
    weight: float = 1.0

    def __post_init__(self):
        if not 0 <= self.prio <= 7:
            raise ValueError(f"class 1:{self.minor:x}: prio must be 0..7 (got {self.prio})")
        if not self.weight > 0:
            raise ValueError(f"class 1:{self.minor:x}: weight must be > 0 (got {self.weight})")


#: HTB burst beyond one frame, in ms of line rate. With a burst of exactly one frame, every microsecond the HTB
#: watchdog timer fires late is transmission time lost for good, and in the software-emulated lab VM timers fire
#: late by far more than on hardware (10 Mbit/s was measured at 0.77-0.97 of the rate with one frame).
SHAPER_SLACK_MS = 1.0
#: A class's own (guaranteed) rate as a fraction of the link: a token, so that every class borrows (see above).
CLASS_RATE_FRACTION = 0.001
#: Largest DRR quantum, in frames, a weight may ask for (HTB serves up to a quantum per turn: bigger is burstier).
MAX_QUANTUM_FRAMES = 64


def _htb_rate(rate_mbps: float) -> int:
    """HTB rate in bytes per second (pyroute2 takes rates as strings with a unit: we always pass '<n>bit')."""
    return int(rate_mbps * 1_000_000 / 8)


def class_quanta(classes: list[PortClass], frame_bytes: int) -> dict[int, int]:
    """DRR quantum per class minor: one frame for the lightest class of its prio, proportionally more for heavier
    ones (capped at MAX_QUANTUM_FRAMES frames)."""
    lightest: dict[int, float] = {}
    for c in classes:
        lightest[c.prio] = min(c.weight, lightest.get(c.prio, c.weight))
    return {c.minor: int(frame_bytes * min(MAX_QUANTUM_FRAMES, c.weight / lightest[c.prio])) for c in classes}


def install_port(ipr, idx: int, rate_mbps: float, classes: list[PortClass], default_minor: int, mtu: int = 1500,
                 slack_ms: float = SHAPER_SLACK_MS, fresh: bool = False) -> None:
    """Replace the root qdisc of interface `idx` (on an open IPRoute `ipr` of its namespace) by the shaper, the
    classes and their leaf queues described in the module docstring. Burst = one frame + `slack_ms` of line rate.
    `fresh`: the interface was just created and has only its default root qdisc, which adding ours replaces, so
    the (failing, hence costly in pyroute2) delete of an old 1: root is skipped."""
    wire, per_class = _htb_classes(rate_mbps, classes, mtu, slack_ms)
    if not fresh:
        with contextlib.suppress(Exception):
            ipr.tc("del", index=idx, handle="1:", root=True)
    ipr.tc("add", "htb", index=idx, handle="1:", default=default_minor)
    ipr.tc("add-class", "htb", index=idx, handle="1:1", parent="1:", **wire)
    for c in classes:
        ipr.tc("add-class", "htb", index=idx, handle=f"1:{c.minor:x}", parent="1:1", **per_class[c.minor])
        kind, args = c.queue.tc_args(_htb_rate(rate_mbps))
        ipr.tc("add", kind, index=idx, handle=f"{c.minor:x}:", parent=f"1:{c.minor:x}", **args)


def _htb_classes(rate_mbps: float, classes: list[PortClass], mtu: int, slack_ms: float) -> tuple[dict, dict]:
    """HTB arguments of the wire class 1:1 and of each traffic class (by minor) for a port at `rate_mbps`."""
    rate = _htb_rate(rate_mbps)
    frame = mtu + WIRE_OVERHEAD_BYTES
    burst = frame + int(rate * slack_ms / 1000.0)
    quanta = class_quanta(classes, frame)
    wire = dict(rate=f"{rate * 8}bit", ceil=f"{rate * 8}bit", burst=burst, cburst=burst, quantum=frame)
    # one class: nothing to share, so it gets the link as its own rate and never borrows (borrowing adds the parent's
    # wait events to every packet's path, and in the emulated VM late timers then cost rate: 0.87 of 10 Mbit/s
    # measured borrowing vs >= 0.93 with its own rate)
    crate = rate if len(classes) == 1 else max(1, int(rate * CLASS_RATE_FRACTION))
    per_class = {c.minor: dict(rate=f"{crate * 8}bit", ceil=f"{rate * 8}bit", burst=burst, cburst=burst,
                               prio=c.prio, quantum=quanta[c.minor]) for c in classes}
    return wire, per_class


def set_port_rate(ipr, idx: int, rate_mbps: float, classes: list[PortClass], mtu: int = 1500,
                  slack_ms: float = SHAPER_SLACK_MS) -> None:
    """Change the wire rate of a port :func:`install_port` built (its queues and their contents stay): a slow link
    or a slow-draining port. Every class is changed too, since a single class holds the link rate as its own."""
    wire, per_class = _htb_classes(rate_mbps, classes, mtu, slack_ms)
    ipr.tc("change-class", "htb", index=idx, handle="1:1", parent="1:", **wire)
    for c in classes:
        ipr.tc("change-class", "htb", index=idx, handle=f"1:{c.minor:x}", parent="1:1", **per_class[c.minor])


ETH_P_ALL = 0x0003
INGRESS_PARENT = 0xFFFF0000  # filters of an ingress (or clsact) qdisc's ingress hook
TC_H_INGRESS = 0xFFFFFFF1


def ensure_ingress(ipr, idx: int) -> None:
    """An ingress qdisc on interface `idx` (kept if one, or a clsact, is already there)."""
    if not any(q["parent"] == TC_H_INGRESS for q in ipr.get_qdiscs(index=idx)):
        ipr.tc("add", "ingress", index=idx)


def redirect_ingress(ipr, idx: int, prio: int, to_index: int) -> None:
    """Every frame arriving at interface `idx` goes to interface `to_index` instead (u32 match-all at `prio`, mirred
    redirect): the way into an IFB that impairs (netem) or swallows (a dead link) what a port receives."""
    ipr.tc("add-filter", "u32", index=idx, parent=INGRESS_PARENT, prio=prio, protocol=ETH_P_ALL,
           keys=["0x0/0x0+0"], target=0x10001,
           action=[{"kind": "mirred", "direction": "egress", "action": "redirect", "ifindex": to_index}])


def install_port_ns(ns: str, ifname: str, rate_mbps: float, classes: list[PortClass], default_minor: int,
                    mtu: int = 1500) -> None:
    """install_port on an interface named in a namespace (opens its own netlink socket)."""
    idx = _index(ns, ifname)
    with netns.ipr(ns) as ipr:
        install_port(ipr, idx, rate_mbps, classes, default_minor, mtu=mtu)


def remove_root(ns: str, ifname: str) -> None:
    with contextlib.suppress(Exception), netns.ipr(ns) as ipr:
        ipr.tc("del", index=_index(ns, ifname), handle="1:", root=True)


def _index(ns: str, ifname: str) -> int:
    with netns.ipr(ns) as ipr:
        found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise LookupError(f"no interface {ifname} in {ns}")
    return found[0]


@dataclass
class QueueSample:
    """One port class's counters as the kernel reports them (cumulative except backlog)."""

    minor: int
    kind: str
    backlog_bytes: int
    backlog_packets: int
    drops: int
    marks: int
    sent_bytes: int
    sent_packets: int
    overlimits: int


def leaf_stats(ipr, index: int) -> list[QueueSample]:
    """Counters of every leaf queue on a port (the qdiscs whose parent is an HTB class), via one netlink dump."""
    out = []
    for m in ipr.get_qdiscs(index=index):
        parent = m["parent"]
        handle = m["handle"]
        if parent == 0xFFFFFFFF or (parent >> 16) != 1:  # the root, or something not under our HTB
            continue
        kind = m.get_attr("TCA_KIND")
        s2 = m.get_attr("TCA_STATS2")
        basic = s2.get_attr("TCA_STATS_BASIC") if s2 else None
        queue = s2.get_attr("TCA_STATS_QUEUE") if s2 else None
        marks = 0
        if kind == "red":
            x = m.get_attr("TCA_XSTATS")
            if x is not None:
                with contextlib.suppress(Exception):
                    marks = int(x["marked"])
        out.append(QueueSample(
            minor=handle >> 16, kind=kind,
            backlog_bytes=int(queue["backlog"]) if queue else 0,
            backlog_packets=int(queue["qlen"]) if queue else 0,
            drops=int(queue["drops"]) if queue else 0,
            marks=marks,
            sent_bytes=int(basic["bytes"]) if basic else 0,
            sent_packets=int(basic["packets"]) if basic else 0,
            overlimits=int(queue["overlimits"]) if queue else 0,
        ))
    return out


def port_stats(ns: str, ifname: str) -> list[QueueSample]:
    with netns.ipr(ns) as ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        return leaf_stats(ipr, idx)


def root_stats(ns: str, ifname: str) -> dict:
    """The HTB root's own counters (what the shaper sent, in bytes as it counts them)."""
    with netns.ipr(ns) as ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        for m in ipr.get_qdiscs(index=idx):
            if m["parent"] == 0xFFFFFFFF:
                s2 = m.get_attr("TCA_STATS2")
                b = s2.get_attr("TCA_STATS_BASIC")
                q = s2.get_attr("TCA_STATS_QUEUE")
                return {"kind": m.get_attr("TCA_KIND"), "sent_bytes": int(b["bytes"]),
                        "sent_packets": int(b["packets"]), "drops": int(q["drops"])}
    return {}


#: loopback's MTU in a fresh namespace: TCP between two processes of one host sends frames up to this size
LOOPBACK_MTU = 65536


def shape_loopback(ns: str, rate_mbps: float, buffer_bytes: int) -> None:
    """A host's scale-up domain (NVLink-class, between the GPUs of one server): every byte that two processes of
    the host namespace exchange crosses its loopback, whose egress gets the same HTB shaper as a fabric port, at
    ``rate_mbps`` with a ``buffer_bytes`` drop-tail queue (its frames are up to 64 KiB). One shaper for the host:
    the rate is the server's total intra-server bandwidth, both directions of every GPU pair sharing it."""
    install_port_ns(ns, "lo", rate_mbps, [PortClass(0x10, LeafQueue("bfifo", max(buffer_bytes, 2 * LOOPBACK_MTU)))],
                    0x10, mtu=LOOPBACK_MTU)
