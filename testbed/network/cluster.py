"""A fabric split across servers, on Mininet's cluster edition's placement: which node runs on which machine, and
which links become tunnels between machines.

    lab = Lab(LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2), servers=2)      # or TestbedNet(..., servers=2)

``servers=N`` places the fabric on N servers with ``mininet.examples.cluster.SwitchBinPlacer`` (switches in even
bins over the servers, every host with the switch it hangs from). Switches are handed to it leaf by leaf with the
spines spread between them, so a leaf and its hosts share a server, each server holds a share of the spines, and
only leaf-spine links cross servers: the split a real cluster of emulation servers would use (host links, the
busiest, stay inside a machine). The servers are namespaces on this machine joined by a datacentre network
(testbed.kernel.tunnel); the crossing links are VXLAN tunnels whose ends carry the ports' planned names, MACs,
shapers and queues, so everything above (routes, queues, telemetry, agents) is the same as on one server.

Servers that are other machines (``Lab(topo, servers="servers.txt")``, ``--set servers=FILE``:
testbed.workloads.serverlab): each builds its *share* (testbed.network.share: the same Fabric code on the nodes
placed on it, its crossing links as VXLAN ends over its real NIC), started through its agent
(testbed.network.serverfabric); :func:`build_share_tunnels` below makes those ends. Not yet collected back from
a real server: its telemetry (docs/servers.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import UsageError
from testbed.kernel import netns, sysctls, tunnel

#: most servers one fabric is split into here (each is a namespace and an underlay address)
MAX_SERVERS = 16


def server_name(index: int) -> str:
    """Server ``index`` (1-based): ``server-1``, ``server-2`` ... (a '-' keeps it apart from every node name)."""
    return f"server-{index}"


def _switch_order(topology) -> list[str]:
    """Switches for the bin placer: leaves with spines interleaved (leaf1, spine1, leaf2, spine2, ...), so every bin
    takes whole leaves and its share of the spines; other switches (a dumbbell's, a fat tree's) in topology order."""
    routers = [n for n in topology.nodes if n.role != "host"]
    leaves = [n.name for n in routers if n.role == "leaf"]
    spines = [n.name for n in routers if n.role == "spine"]
    if not leaves or not spines or len(leaves) + len(spines) != len(routers):
        return [n.name for n in routers]
    out = []
    for i in range(max(len(leaves), len(spines))):
        out += leaves[i:i + 1] + spines[i:i + 1]
    return out


@dataclass(frozen=True)
class Placement:
    """node -> server, and the links whose ends sit on different servers (as indexes into topology.links)."""

    servers: tuple[str, ...]
    server_of: dict[str, str]
    crossing: tuple[int, ...]

    def nodes_on(self, server: str) -> list[str]:
        return [n for n, s in self.server_of.items() if s == server]


def place(topology, servers: int, names: tuple[str, ...] | None = None) -> Placement:
    """Split ``topology`` over ``servers`` servers with Mininet's SwitchBinPlacer (see the module docstring),
    named ``names`` (a servers file's names; default server-1 ...). Raises UsageError on a count that cannot be
    placed (before anything is created)."""
    if not isinstance(servers, int) or isinstance(servers, bool) or not 1 <= servers <= MAX_SERVERS:
        raise UsageError(f"servers must be an integer 1..{MAX_SERVERS} (got {servers!r})")
    names = tuple(names) if names else tuple(server_name(i) for i in range(1, servers + 1))
    if len(names) != servers or len(set(names)) != servers:
        raise UsageError(f"servers={servers} needs as many distinct names (got {list(names)})")
    if servers == 1:  # the usual case: everything on one server, nothing to place
        return Placement(names, {n.name: names[0] for n in topology.nodes}, ())
    switches = _switch_order(topology)
    if len(switches) < servers:
        raise UsageError(f"servers={servers}: the fabric has only {len(switches)} switches to spread over them")
    from mininet.examples.cluster import SwitchBinPlacer

    hosts = [n.name for n in topology.nodes if n.role == "host"]
    placer = SwitchBinPlacer(servers=list(names), nodes=hosts + switches, hosts=hosts, switches=switches,
                             links=[(l.a, l.b) for l in topology.links])
    server_of = {n.name: placer.place(n.name) for n in topology.nodes}
    crossing = tuple(i for i, l in enumerate(topology.links) if server_of[l.a] != server_of[l.b])
    return Placement(names, server_of, crossing)


def build_servers(fabric, state) -> None:
    """The servers' namespaces (recorded in ``state`` as they are made, so `testbed clean` finds them) and the
    datacentre network between them (testbed.kernel.tunnel)."""
    for name in (fabric.dcnet_ns, *fabric.server_ns.values()):
        if state is not None:
            state.add("namespaces", name)
        netns.create(name, inside=sysctls.set_before_interfaces)
        fabric.created.append(name)
    tunnel.build_underlay(fabric.dcnet_ns, list(fabric.server_ns.values()))


def build_tunnels(fabric) -> None:
    """Each link that crosses servers: a VXLAN pair (VNI = link number), one end made by each server and moved into
    its node under the port's planned name and MAC."""
    addrs = fabric.topology.addresses
    ip = {s: tunnel.underlay_ip(i) for i, s in enumerate(fabric.placement.servers, start=1)}
    on = fabric.placement.server_of
    for i in fabric.placement.crossing:
        l = fabric.topology.links[i]
        for node, port, far in ((l.a, l.a_port, l.b), (l.b, l.b_port, l.a)):
            tunnel.add_vxlan_end(fabric.server_ns[on[node]], fabric.ns(node), port, i + 1, ip[on[node]],
                                 ip[on[far]], fabric.macs.get((node, port), addrs[(node, port)].mac), l.spec.mtu)


def build_share_tunnels(fabric) -> None:
    """A share's crossing links (testbed.network.share): for each link with one end on this server, that end as a
    VXLAN device made in the namespace holding this server's NIC (``share.underlay_ns``, None: the builder's own)
    from its underlay address to the far server's, VNI ``share.vni_base`` + link number, moved into its node."""
    share, addrs = fabric.share, fabric.topology.addresses
    on = fabric.placement.server_of
    for i in fabric.placement.crossing:
        l = fabric.topology.links[i]
        for node, port, far in ((l.a, l.a_port, l.b), (l.b, l.b_port, l.a)):
            if on[node] != share.server:
                continue
            tunnel.add_vxlan_end(share.underlay_ns, fabric.ns(node), port, share.vni_base + i + 1,
                                 share.underlay[share.server], share.underlay[on[far]],
                                 fabric.macs.get((node, port), addrs[(node, port)].mac), l.spec.mtu)


SERVER_COLUMNS = ["server", "namespace", "nodes", "udp_in_datagrams", "udp_rcvbuf_errors", "udp_in_errors"]


def server_rows(fabric) -> list[tuple]:
    """One row per server (servers.csv): its namespace, its nodes, and what its tunnels carried so far (the UDP
    counters of its network stack: every VXLAN frame that reaches a server is one InDatagram; receive-buffer and
    input errors are frames the server dropped before they reached the fabric. The kernel's VXLAN transmit path
    does not count OutDatagrams, so a server's sends are its peers' receipts)."""
    rows = []
    for s, ns in fabric.server_ns.items():
        udp = tunnel.udp_datagrams(ns)
        rows.append((s, ns, " ".join(fabric.placement.nodes_on(s)), udp.get("InDatagrams", 0),
                     udp.get("RcvbufErrors", 0), udp.get("InErrors", 0)))
    return rows
