"""What PFC watches and pauses, as data: one :class:`LosslessQueue` per lossless class of each egress port, who
feeds whom, and the headroom a class needs.

A hardware switch accounts buffer per ingress port and priority and sends XOFF out of that port; this emulation
sees the egress queues (the HTB class leaf on each port, testbed.network.fabric), so a switch egress S->X that
crosses XOFF pauses every *feeder* of S: each neighbour U != X's egress U->S for the same priority
(:func:`feeders_of`). Headroom is what still arrives after the crossing, while the pause takes effect
(:func:`headroom_needed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.network.portplan import FIRST_MINOR


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


def class_queue(fabric, plan, minor: int, leaf, cls: str, pcp: int, xoff: int, xon: int,
                headroom: int) -> LosslessQueue:
    """The queue of class ``cls`` (HTB minor ``minor``, leaf qdisc ``leaf``) on the port ``plan`` (a fabric
    PortPlan) with these thresholds in bytes; not yet installed (ifindex 0, no plug)."""
    return LosslessQueue(node=plan.node, port=plan.ifname, peer=plan.peer, ns=fabric.ns(plan.node), ifindex=0,
                         minor=minor, cls=cls, pcp=pcp, xoff=xoff, xon=xon, headroom=headroom, limit=leaf.limit,
                         rate_bps=plan.rate_mbps * 1e6 / 8,
                         is_switch=fabric.topology.node(plan.node).role != "host", leaf_kind=leaf.kind)


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


def lossless_queues(fabric) -> dict[tuple[str, str, int], LosslessQueue]:
    """Every lossless class of the fabric's ports, {(node, port, minor): LosslessQueue}, each switch queue with the
    keys of its feeders (the upstream queues of the same class that a crossing pauses)."""
    plans = {(p.node, p.ifname): p for p in fabric.port_plans}
    queues: dict[tuple[str, str, int], LosslessQueue] = {}
    for (node, ifn), found in lossless_classes(fabric.topology).items():
        plan = plans[(node, ifn)]
        for c, i in found:
            minor = FIRST_MINOR + i
            leaf = next(q for m, _, q, *_ in plan.classes if m == minor)
            queues[(node, ifn, minor)] = class_queue(fabric, plan, minor, leaf, c.name, c.pcp, c.xoff_bytes,
                                                     c.xon_bytes, c.headroom_bytes)
    feeders = feeders_of(fabric.topology)
    for q in queues.values():
        if q.is_switch:
            q.feeders = [(u, uif, q.minor) for u, uif in feeders.get((q.node, q.port), [])
                         if (u, uif, q.minor) in queues]
    return queues


def headroom_needed(rate_bytes_per_s: float, reaction_s: float, mtu: int = 1500) -> int:
    """Bytes an upstream at line rate still delivers after XOFF is crossed: rate x reaction + 2 frames."""
    return int(rate_bytes_per_s * reaction_s + 2 * (mtu + 14))
