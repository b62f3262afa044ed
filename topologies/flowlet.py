"""Flowlet load balancing on a router's uplinks (LetFlow, and CONGA-style adaptive choice), planned from a
topology's routes. Pure logic; the kernel side is testbed/kernel/flowlet.bpf.c and testbed/kernel/flowlet.py.

ECMP pins a flow to a path by its hash, blind to load; per-packet spraying spreads every flow over every path, so a
slow path slows every flow and reorders it. A *flowlet* is a burst of a flow separated from the previous burst by
an idle gap longer than the paths' delay difference: moving the flow to another path at such a gap cannot reorder
it. ``flowlet`` (LetFlow, Vanini et al., NSDI 2017) sends each new flowlet down a random uplink: flowlets on a
congested path stretch and break up less often, so load drifts to the faster paths by itself. ``adaptive``
(CONGA, Alizadeh et al., SIGCOMM 2014) sends a new flowlet down the uplink whose path to the destination's leaf is
the least congested. CONGA carries that congestion in packet headers leaf to leaf; here a controller reads every
queue on the path (the leaf's uplink and the spine's port toward the destination) every ``poll_ms`` and writes the
table the program reads, so the feedback is as old as the poll interval; the program adds what it knows at once,
the bytes it just sent up each uplink at that uplink's rate, so flowlets that start together do not all pick the
same idle path.

The groups are the sprayer's (topologies/spray.py): every multipath route of a router uses the same ports and the
far ends share a MAC, so a moved frame needs no rewrite. A *slot* is a set of destinations whose paths through every
uplink cross the same queues (in a leaf-spine: the hosts of one leaf)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .spec import SpecError
from .spray import SprayGroup

if TYPE_CHECKING:  # pragma: no cover
    from .topology import Topology

FLOWLET_MODES = ("flowlet", "adaptive")
#: the idle gap that starts a new flowlet. At the lab's 10-20 Mbit/s a full-size packet takes 0.6-1.2 ms per hop,
#: a flow sharing a port with a few others sends one every few ms, and queues differ by tens of ms between paths;
#: 10 ms keeps a flow on its path within a burst (LetFlow uses 500 us at 10 Gbit/s, three orders faster).
DEFAULT_GAP_MS = 10.0
#: how often the adaptive controller reads the path queues and rewrites the congestion table
DEFAULT_POLL_MS = 10.0
MAX_PORTS = 8  # as in flowlet.bpf.c
MAX_SLOTS = 64


@dataclass(frozen=True)
class FlowletPlan:
    """One router's balancer: its uplinks (in the group's order), each destination IP's slot, and for every
    (slot, uplink index) the queues (node, port) a packet crosses on that path."""

    node: str
    ports: tuple[str, ...]
    slot_of: dict[str, int] = field(default_factory=dict)
    paths: dict[tuple[int, int], tuple[tuple[str, str], ...]] = field(default_factory=dict)

    @property
    def queues(self) -> set[tuple[str, str]]:
        return {q for qs in self.paths.values() for q in qs}


def _route_ports(topology: "Topology", node: str, ip: str) -> tuple[str, ...]:
    """The egress ports of `node`'s longest-prefix route to `ip` (none: `ip` is on one of its own links)."""
    addr = ipaddress.ip_address(ip)
    best, ports = -1, ()
    for r in topology.routes_of(node):
        net = ipaddress.ip_network(r.dst, strict=False)
        if addr in net and net.prefixlen > best:
            best, ports = net.prefixlen, tuple(nh.ifname for nh in r.nexthops)
    return ports


def flowlet_plans(topology: "Topology", groups: tuple[SprayGroup, ...]) -> tuple[FlowletPlan, ...]:
    """The plan of every group: destinations are the hosts' addresses not attached to the group's router."""
    peer: dict[tuple[str, str], tuple[str, str]] = {}
    for l in topology.links:
        peer[(l.a, l.a_port)] = (l.b, l.b_port)
        peer[(l.b, l.b_port)] = (l.a, l.a_port)
    host_ips = sorted({i.ip for (node, _), i in topology.addresses.items()
                       if node in {h.name for h in topology.hosts}}, key=ipaddress.ip_address)
    plans = []
    for g in groups:
        if len(g.ports) > MAX_PORTS:
            raise SpecError("load_balancing", f"flowlet balancing handles up to {MAX_PORTS} uplinks "
                                              f"({g.node} has {len(g.ports)})")
        far = [peer[(g.node, p)][0] for p in g.ports]
        slots: dict[tuple, int] = {}
        slot_of: dict[str, int] = {}
        paths: dict[tuple[int, int], tuple[tuple[str, str], ...]] = {}
        for ip in host_ips:
            if not set(g.ports) <= set(_route_ports(topology, g.node, ip)):
                continue  # not reached through the uplinks (a host of this router)
            remote = tuple(tuple((s, e) for e in _route_ports(topology, s, ip)) for s in far)
            slot = slots.setdefault(remote, len(slots))
            if slot >= MAX_SLOTS:
                raise SpecError("load_balancing", f"flowlet balancing handles up to {MAX_SLOTS} destination groups")
            slot_of[ip] = slot
            for i, port in enumerate(g.ports):
                paths[(slot, i)] = ((g.node, port), *remote[i])
        plans.append(FlowletPlan(g.node, g.ports, slot_of, paths))
    return tuple(plans)


def path_congestion(plan: FlowletPlan, delay_us: dict[tuple[str, str], int]) -> dict[tuple[int, int], int]:
    """(slot, uplink index) -> the path's congestion: the largest queueing delay along it (CONGA's max)."""
    return {key: max((delay_us.get(q, 0) for q in qs), default=0) for key, qs in plan.paths.items()}


def drain_delay_us(backlog_bytes: int, rate_mbps: float) -> int:
    """How long a backlog takes to leave a port draining at `rate_mbps`, in microseconds."""
    return round(backlog_bytes * 8 / rate_mbps) if rate_mbps > 0 else 0


__all__ = ["DEFAULT_GAP_MS", "DEFAULT_POLL_MS", "FLOWLET_MODES", "FlowletPlan", "MAX_PORTS", "MAX_SLOTS",
           "drain_delay_us", "flowlet_plans", "path_congestion"]
