"""What the fabric builder puts on each egress port, planned from the spec before anything is built: the HTB rate,
one HTB class per traffic class (minor 1:10, 1:11, ... in class order) with its leaf queue, HTB priority and
weight and the DSCPs it takes, and the default class. testbed.network.fabric installs the plans; the PFC controller
and the samplers label queues by them.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import UsageError
from testbed.kernel import qdisc

FIRST_MINOR = 0x10  # HTB class 1:10 is a port's first (or only) class


@dataclass(frozen=True)
class PortPlan:
    """What goes on one egress port: HTB rate, classes (minor, name, LeafQueue, prio, weight, dscps), default."""

    node: str
    ifname: str
    peer: str
    peer_ifname: str
    tier: str
    rate_mbps: float
    mtu: int
    classes: tuple[tuple[int, str, qdisc.LeafQueue, int, float, frozenset], ...]
    default_minor: int

    def class_label(self, minor: int) -> str:
        for m, name, *_ in self.classes:
            if m == minor:
                return name
        return f"1:{minor:x}"


def leaf_queue(q) -> qdisc.LeafQueue:
    """topologies.QueueSpec -> testbed.kernel.qdisc.LeafQueue (the qdisc under one HTB class)."""
    if q.discipline == "droptail":
        if q.buffer_bytes is not None:
            return qdisc.LeafQueue("bfifo", limit=q.buffer_bytes, avpkt=q.avpkt_bytes)
        return qdisc.LeafQueue("pfifo", limit=q.buffer_packets, avpkt=q.avpkt_bytes)
    if q.discipline == "red":
        return qdisc.LeafQueue("red", limit=q.limit_bytes, min_bytes=q.min_bytes, max_bytes=q.max_bytes,
                               probability=q.probability, ecn=q.ecn, avpkt=q.avpkt_bytes, burst=q.burst_packets)
    if q.discipline == "step":
        k = q.threshold_bytes
        if k + q.avpkt_bytes > q.limit_bytes:
            raise UsageError(f"step queue: K ({k} bytes) + one packet ({q.avpkt_bytes}) must fit the buffer "
                             f"({q.limit_bytes} bytes): step marking is RED with min K, max K + avpkt")
        return qdisc.LeafQueue("step", limit=q.limit_bytes, k_bytes=k, avpkt=q.avpkt_bytes)
    raise UsageError(f"unknown queue discipline {q.discipline!r}")


def plan_port(ep) -> PortPlan:
    """topologies.EgressPort -> PortPlan, at the egress's rate (its link's, or a per-port override's) with its
    queue(s) (the tier's, or the override's). Classless: one class 1:10. With classes: 1:10, 1:11, ... in class order;
    strict-priority classes get HTB prio = priority (served first, up to line rate); weighted classes get HTB prio 7
    and their weight (round robin among themselves; see testbed.kernel.qdisc)."""
    port = ep.port
    mtu = ep.link.mtu
    if port.classless:
        return PortPlan(ep.node, ep.ifname, ep.peer, ep.peer_ifname, port.tier, ep.rate_mbps, mtu,
                        ((FIRST_MINOR, f"1:{FIRST_MINOR:x}", leaf_queue(port.queue), 0, 1.0, frozenset()),),
                        FIRST_MINOR)
    out = []
    default = FIRST_MINOR
    for i, c in enumerate(port.classes):
        minor = FIRST_MINOR + i
        if c.priority is not None:
            prio, weight = c.priority, 1.0
        else:
            prio, weight = 7, float(c.weight)
        out.append((minor, c.name, leaf_queue(c.queue if c.queue is not None else port.queue), prio, weight,
                    frozenset(c.dscp)))
        if c.default:
            default = minor
    return PortPlan(ep.node, ep.ifname, ep.peer, ep.peer_ifname, port.tier, ep.rate_mbps, mtu, tuple(out),
                    default)
