"""Per-packet spraying (the seed's "packet spraying"), planned from a topology's routes. Pure logic; the kernel
side is testbed.kernel.spray.

ECMP pins a flow to one path by hashing its 5-tuple, so two elephant flows can collide on one spine while another
idles. Spraying sends every *packet* over a uniformly random uplink instead: load spreads perfectly, but packets
of one flow overtake each other, and a reorder-intolerant transport (TCP's dup-ACK fast retransmit, RoCE's go-back-N)
retransmits spuriously. That trade-off is the lesson.

How the testbed sprays (in the kernel, per packet, no user space in the path):

* A router's *spray group* is the set of ports its multipath routes use (a leaf's uplinks to every spine). The
  kernel's ECMP route still picks a port by hash; on the egress of every port of the group a tc filter then moves
  the packet to another port of the group with probability (k-1)/k, drawn per packet (``meta(random)``), so each
  packet ends up on each of the k ports with probability 1/k. A moved packet is marked so the filter on the port it
  lands on lets it pass.
* The moved frame still carries the destination MAC of the neighbour the route chose. Rather than rewriting it
  (``pedit``), the neighbours at the far end of one group's ports share one MAC address, as an anycast gateway MAC
  does on real fabrics: every spine's port facing leaf1 answers to the same MAC, so whichever spine a frame lands on
  accepts it. They are different links (different broadcast domains), so the shared MAC never collides.

Spraying only makes sense where every multipath route of a router uses the same ports (a leaf in a leaf-spine: any
spine reaches any other leaf); anything else is refused when the plan is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .spec import SpecError

if TYPE_CHECKING:  # pragma: no cover
    from .topology import Topology

#: skb mark of a packet the sprayer moved to another port (so the filter there leaves it alone).
SPRAY_MARK = 0x5A7A


@dataclass(frozen=True)
class SprayGroup:
    """The ports one router sprays over (in the order of its multipath routes' nexthops)."""

    node: str
    ports: tuple[str, ...]

    def moves(self, port: str) -> list[tuple[str, int]]:
        """(target port, threshold) filters on `port`'s egress, tried in order, each with a fresh 32-bit random
        number: the n-th filter fires when random < threshold. See :func:`cascade_thresholds`."""
        others = [p for p in self.ports if p != port]
        return list(zip(others, cascade_thresholds(len(self.ports))))


def cascade_thresholds(k: int) -> list[int]:
    """Thresholds for k-1 filters tried in order, each drawing a fresh uniform 32-bit random number, so that each of
    the k-1 other ports and staying put all get probability 1/k: the n-th filter (n = 0..k-2) fires with probability
    1/(k-n) given that the earlier ones did not, i.e. when random < 2^32/(k-n)."""
    if k < 2:
        raise ValueError("a spray group needs at least two ports")
    return [min(2**32 - 1, round(2**32 / (k - n))) for n in range(k - 1)]


def spray_groups(topology: "Topology") -> tuple[SprayGroup, ...]:
    """One group per router that has multipath routes; every such route of a router must use the same ports."""
    ports_of: dict[str, tuple[str, ...]] = {}
    for r in topology.routes:
        if not r.ecmp:
            continue
        ports = tuple(nh.ifname for nh in r.nexthops)
        seen = ports_of.setdefault(r.node, ports)
        if set(seen) != set(ports):
            raise SpecError("load_balancing", f"spray needs every multipath route of {r.node} to use the same ports "
                                              f"({', '.join(seen)} vs {', '.join(ports)} for {r.dst})")
    return tuple(SprayGroup(node, ports) for node, ports in ports_of.items())


def shared_macs(topology: "Topology", groups: tuple[SprayGroup, ...]) -> dict[tuple[str, str], str]:
    """(node, port) -> MAC for the far ends of every group's ports: all far ends of one group take the MAC the
    address plan gave the first of them."""
    peer: dict[tuple[str, str], tuple[str, str]] = {}
    for l in topology.links:
        peer[(l.a, l.a_port)] = (l.b, l.b_port)
        peer[(l.b, l.b_port)] = (l.a, l.a_port)
    addrs = topology.addresses
    out: dict[tuple[str, str], str] = {}
    for g in groups:
        far = [peer[(g.node, p)] for p in g.ports]
        mac = addrs[far[0]].mac
        for end in far:
            if out.get(end, mac) != mac:
                raise SpecError("load_balancing", f"spray: {end[0]}:{end[1]} would need two MAC addresses")
            out[end] = mac
    return out


__all__ = ["SPRAY_MARK", "SprayGroup", "cascade_thresholds", "shared_macs", "spray_groups"]
