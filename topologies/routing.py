"""Static routes computed from a topology, and the paths packets can take.

:func:`compute_routes` is generic: for every edge router's host subnet it runs a breadth-first search over the
router graph from that edge router; every other router gets one route to the subnet whose nexthops are *all*
neighbours one hop closer (all equal-cost paths). In a leaf-spine fabric that gives each leaf one ECMP route per
remote leaf subnet over every spine, each spine one route per leaf subnet, each leaf a ``/32 dev <port>`` route
per local host, and each host ``default via <gateway> dev eth0 onlink``.

Connected /31 routes on router-to-router links are created by the kernel when the addresses are assigned and are
not listed. With ``load_balancing = "spray"`` the routes are the same; the per-packet sprayer works on top of them.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from typing import Iterable, Protocol

from .addressing import AddressPlan, Graph
from .spec import Hop, HostTcpSpec, NextHop, Node, Route, SpecError


class Routed(Graph, Protocol):
    """What routing reads of a topology (:class:`~topologies.topology.Topology` has it all; naming it here keeps
    this module below topology.py, which calls it): the graph, its hosts and routers, the host TCP settings (a
    route's ``rto_min``), the address plan and, for the paths, the routes computed from them."""

    tcp: HostTcpSpec

    @property
    def hosts(self) -> tuple[Node, ...]: ...

    @property
    def routers(self) -> tuple[Node, ...]: ...

    @property
    def address_plan(self) -> AddressPlan: ...

    @property
    def routes(self) -> tuple[Route, ...]: ...

    def node(self, name: str) -> Node: ...


class RoutingError(SpecError):
    """A destination is unreachable or the routes loop."""


def compute_routes(topology: Routed, down: Iterable = ()) -> list[Route]:
    """Every static route the builder installs, ordered by node (topology order) then destination.

    ``down``: links (:class:`~topologies.spec.Link`) taken out of service, as routing sees them once a failure is
    detected: no nexthop crosses them, a router that can no longer reach a subnet has no route to it, and a host
    whose own link is down has no route at all (and no router has its /32). The difference between the routes with
    and without a link is what a fabric's routing withdraws when that link fails."""
    plan = topology.address_plan
    dead = {(l.a, l.a_port, l.b, l.b_port) for l in down}
    role = {n.name: n.role for n in topology.nodes}
    order = {n.name: i for i, n in enumerate(topology.nodes)}
    # router adjacency: router -> [(my port, neighbour, neighbour's ip on that link)]
    adj: dict[str, list[tuple[str, str, str]]] = {n.name: [] for n in topology.routers}
    cut: set[str] = set()  # hosts whose link is down
    for l in topology.links:
        if (l.a, l.a_port, l.b, l.b_port) in dead:
            cut.update(n for n in (l.a, l.b) if role[n] == "host")
            continue
        if role[l.a] == "host" or role[l.b] == "host":
            continue
        adj[l.a].append((l.a_port, l.b, plan.interfaces[(l.b, l.b_port)].ip))
        adj[l.b].append((l.b_port, l.a, plan.interfaces[(l.a, l.a_port)].ip))

    routes: list[Route] = []
    rto = getattr(topology.tcp, "rto_min_ms", None)
    for host, (router, ifname, _) in plan.attachments.items():
        if host in cut:
            continue
        routes.append(Route(host, "0.0.0.0/0", (NextHop(ifname, plan.gateway_of(host)),), onlink=True,
                            rto_min_ms=rto))
    for edge, subnet in plan.subnets.items():
        for h in plan.edge_hosts[edge]:
            if h in cut:
                continue
            _, _, port = plan.attachments[h]
            routes.append(Route(edge, f"{plan.host_ip(h)}/32", (NextHop(port, None),)))
        dist = _bfs(adj, edge)
        for r in adj:
            if r == edge or r not in dist:
                continue
            hops = sorted({NextHop(port, gw) for port, nb, gw in adj[r] if dist.get(nb) == dist[r] - 1})
            routes.append(Route(r, subnet, tuple(hops)))
    routes.sort(key=lambda rt: (order[rt.node], _net_key(rt.dst)))
    return routes


def route_diff(old: Iterable[Route], new: Iterable[Route]) -> dict[str, tuple[list[Route], list[str]]]:
    """Per node: (routes to replace or add, destinations to delete) that turn routes `old` into `new`."""
    before = {(r.node, r.dst): r for r in old}
    after = {(r.node, r.dst): r for r in new}
    out: dict[str, tuple[list[Route], list[str]]] = {}
    for key, r in after.items():
        if before.get(key) != r:
            out.setdefault(r.node, ([], []))[0].append(r)
    for (node, dst) in before:
        if (node, dst) not in after:
            out.setdefault(node, ([], []))[1].append(dst)
    return out


def _net_key(dst: str) -> tuple[int, int]:
    net = ipaddress.IPv4Network(dst)
    return int(net.network_address), net.prefixlen


def _bfs(adj: dict[str, list[tuple[str, str, str]]], start: str) -> dict[str, int]:
    dist = {start: 0}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for _, v, _ in adj[u]:
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


def lookup(routes: Iterable[Route], node: str, dst_ip: str) -> Route | None:
    """Longest-prefix match among ``node``'s routes (connected /31s are ignored: they never hold hosts)."""
    ip = ipaddress.IPv4Address(dst_ip)
    best: Route | None = None
    best_len = -1
    for r in routes:
        if r.node != node:
            continue
        net = ipaddress.IPv4Network(r.dst)
        if ip in net and net.prefixlen > best_len:
            best, best_len = r, net.prefixlen
    return best


def path_links(topology: Routed, src_host: str, dst_host: str) -> set[tuple[Hop, ...]]:
    """All paths a packet from ``src_host`` to ``dst_host`` can take under the topology's routes (every
    equal-cost choice at every ECMP route). Each path is a tuple of directed :class:`Hop` s; ``(hop.node,
    hop.port)`` are the egress queues crossed, first the source host's NIC, last the port into ``dst_host``."""
    for h in (src_host, dst_host):
        if topology.node(h).role != "host":
            raise ValueError(f"{h!r} is not a host")
    if src_host == dst_host:
        return {()}
    plan = topology.address_plan
    dst_ip = plan.host_ip(dst_host)
    by_node: dict[str, list[Route]] = {}
    for r in topology.routes:
        by_node.setdefault(r.node, []).append(r)
    ports: dict[tuple[str, str], tuple[str, str]] = {}
    for l in topology.links:
        ports[(l.a, l.a_port)] = (l.b, l.b_port)
        ports[(l.b, l.b_port)] = (l.a, l.a_port)
    limit = len(topology.nodes)
    out: set[tuple[Hop, ...]] = set()

    def walk(node: str, path: tuple[Hop, ...], visited: frozenset[str]) -> None:
        if node == dst_host:
            out.add(path)
            return
        if len(path) > limit:
            raise RoutingError("routes", f"path from {src_host} to {dst_host} exceeds {limit} hops")
        route = lookup(by_node.get(node, ()), node, dst_ip)
        if route is None:
            raise RoutingError("routes", f"{node} has no route to {dst_host} ({dst_ip})")
        for nh in route.nexthops:
            peer, peer_port = ports[(node, nh.ifname)]
            if nh.gateway is not None and plan.interfaces[(peer, peer_port)].ip != nh.gateway:
                raise RoutingError("routes", f"{node} sends {dst_ip} via {nh.gateway} on {nh.ifname}, but "
                                             f"{peer}:{peer_port} is {plan.interfaces[(peer, peer_port)].ip}")
            if peer in visited:
                raise RoutingError("routes", f"routing loop towards {dst_host} at {peer}")
            walk(peer, path + (Hop(node, nh.ifname, peer, peer_port),), visited | {peer})

    walk(src_host, (), frozenset({src_host}))
    return out


def ports_on_paths(paths: Iterable[tuple[Hop, ...]]) -> set[tuple[str, str]]:
    """The union of egress ``(node, port)`` queues over some paths."""
    return {(h.node, h.port) for p in paths for h in p}


def switch_ports_between(topology: Routed, src_hosts: Iterable[str], dst_host: str) -> set[tuple[str, str]]:
    """The switches' egress ``(node, port)`` queues that traffic from any of ``src_hosts`` to ``dst_host`` can
    cross (every ECMP branch; the hosts' own NICs left out): the queues an incast can fill."""
    ports = set()
    for h in src_hosts:
        ports |= ports_on_paths(path_links(topology, h, dst_host))
    return {(n, p) for n, p in ports if topology.node(n).role != "host"}


def check_reachability(topology: Routed) -> None:
    """Raise :class:`RoutingError` unless every host reaches every other host (all ECMP branches checked)."""
    hosts = [h.name for h in topology.hosts]
    for s in hosts:
        for d in hosts:
            if s != d and not path_links(topology, s, d):
                raise RoutingError("routes", f"{s} cannot reach {d}")


__all__ = ["compute_routes", "path_links", "ports_on_paths", "switch_ports_between", "lookup", "check_reachability",
           "RoutingError", "Route", "NextHop", "Hop"]
