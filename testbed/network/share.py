"""One server's share of a fabric split over servers that are machines (docs/servers.md, issue 29).

    placement = plan(topology, [("server-1", "198.19.0.1", 1500), ("server-2", "198.19.0.2", 1500)])
    desc = describe(topology, run_id, placement, "server-2", vni_base(run_id))   # plain data, JSON over ssh
    fabric = build(desc, state)                                                  # on server-2, by its agent

What it stands for: Mininet's cluster edition runs each server's part of the network on that server and turns the
links between servers into tunnels over the servers' own NICs (``RemoteGRELink``); MaxiNet's worker builds its
partition the same way. Here a share is the nodes the placement (testbed.network.cluster, SwitchBinPlacer) puts on
one server, built there by **the same Fabric code** as a one-machine run (namespaces, veths, addresses, routes,
permanent neighbours, sysctls, HTB shapers and port queues, impairments), restricted to those nodes; each link that
crosses to another server is a VXLAN end (testbed.kernel.tunnel) made in the namespace that holds this server's NIC,
from its underlay address to the far server's, and moved into its node under the port's planned name and MAC, with
the port's shaper and queue on it as on any port. Routes are the topology's, per node, so nothing above changes.

The description carries the topology as plain data (topologies.load.to_dict, which from_dict reads back to an equal
spec), the run id (every server names its namespaces ``tb-<run>-<node>``), the placement and every server's underlay
address. VNIs are ``vni_base + link number``: two runs over the same servers at once use different VNIs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from testbed.errors import UsageError
from testbed.kernel.tunnel import VXLAN_OVERHEAD_BYTES
from testbed.network.cluster import Placement, place

#: links per run the VNI plan leaves room for (VNI = base + link number, base a multiple of this, VNIs < 2**24)
VNI_BLOCK = 4096


@dataclass(frozen=True)
class Share:
    """Which server this is, the whole placement, every server's underlay address and the run's VNI base;
    ``underlay_ns``: the namespace holding this server's NIC (None: the builder's own, as on a real server)."""

    server: str
    placement: Placement
    underlay: dict[str, str]
    vni_base: int = 0
    underlay_ns: str | None = None


def vni_base(run_id: str) -> int:
    """The run's VNI block: a multiple of VNI_BLOCK from a hash of the run id (block 0 left to the in-kernel split,
    the last to the servers check's VNI 16777215)."""
    h = int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:4], "big")
    return (1 + h % ((1 << 24) // VNI_BLOCK - 2)) * VNI_BLOCK


def plan(topology, servers: list[tuple[str, str, int]]) -> Placement:
    """The placement over ``servers`` (name, underlay address, its NIC's MTU), in order (the first is the reference),
    with SwitchBinPlacer. UsageError (one line, before anything is built) when the fabric cannot be placed or a
    crossing link's frames would not fit the servers' MTU with VXLAN's 50 bytes."""
    names = tuple(s[0] for s in servers)
    lb = getattr(topology, "load_balancing", "ecmp")
    if lb != "ecmp":  # the agents would refuse it too, but only after every description was sent
        raise UsageError(f"load_balancing={lb} is not built over servers yet (ECMP only)")
    placement = place(topology, len(servers), names)
    mtu = {name: m for name, _, m in servers}
    if len(topology.links) >= VNI_BLOCK:
        raise UsageError(f"{len(topology.links)} links: a fabric over servers has at most {VNI_BLOCK - 1}")
    for i in placement.crossing:
        l = topology.links[i]
        room = min(mtu[placement.server_of[l.a]], mtu[placement.server_of[l.b]]) - VXLAN_OVERHEAD_BYTES
        if l.spec.mtu > room:
            raise UsageError(f"link {l.a}:{l.a_port}-{l.b}:{l.b_port} crosses servers with MTU {l.spec.mtu}; "
                             f"over the servers' NICs (MTU {room + VXLAN_OVERHEAD_BYTES}) VXLAN leaves {room}: "
                             f"lower the link's mtu or raise the servers'")
    return placement


def describe(topology, run_id: str, placement: Placement, server: str, underlay: dict[str, str],
             vni_base_: int) -> dict[str, Any]:
    """The plain-data description of ``server``'s share (what its agent's build_share receives)."""
    from topologies.load import to_dict

    if server not in placement.servers:
        raise UsageError(f"no server {server!r} in the placement ({', '.join(placement.servers)})")
    return {"topology": to_dict(topology), "run_id": run_id, "server": server, "servers": list(placement.servers),
            "server_of": dict(placement.server_of), "underlay": dict(underlay), "vni_base": vni_base_}


def from_description(d: dict[str, Any], underlay_ns: str | None = None):
    """(topology, run id, Share) from :func:`describe`'s data; the crossing links are recomputed from the
    placement, not taken on trust. ValueError on a description that does not fit its topology."""
    from topologies.load import from_dict

    topology = from_dict(d["topology"])
    server_of = {str(k): str(v) for k, v in d["server_of"].items()}
    if set(server_of) != {n.name for n in topology.nodes}:
        raise ValueError("the placement does not name exactly the topology's nodes")
    servers = tuple(d["servers"])
    if d["server"] not in servers:
        raise ValueError(f"the description is for server {d['server']!r}, which its placement does not name")
    if not set(server_of.values()) <= set(servers) or not set(servers) <= set(d["underlay"]):
        raise ValueError("the placement names a server without an underlay address")
    crossing = tuple(i for i, l in enumerate(topology.links) if server_of[l.a] != server_of[l.b])
    share = Share(d["server"], Placement(servers, server_of, crossing), dict(d["underlay"]), int(d["vni_base"]),
                  underlay_ns)
    return topology, str(d["run_id"]), share


def build(d: dict[str, Any], state, underlay_ns: str | None = None):
    """Build the described share on this machine (namespaces recorded in ``state`` as they are made); the Fabric,
    whose teardown removes it."""
    from testbed.network.fabric import Fabric

    topology, run_id, share = from_description(d, underlay_ns)
    fabric = Fabric(topology, run_id, share=share)
    try:
        fabric.build(state)
    except BaseException:
        fabric.teardown()
        raise
    return fabric
