"""The address plan: RFC 2544 benchmarking space only (198.18.0.0/15), deterministic MACs.

* Every router with hosts attached (a leaf, a dumbbell switch) is an *edge router*; the n-th edge router in node
  order owns ``198.18.<n>.0/24`` (n = 1..255). Its k-th host (in link order) is ``198.18.<n>.<k>`` (k = 1..253) and
  every host-facing port of the edge router carries the gateway ``198.18.<n>.254``. Host-facing ports are *routed*:
  the host holds ``198.18.<n>.<k>/32`` with ``default via 198.18.<n>.254 dev eth0 onlink``; the edge router holds
  ``198.18.<n>.254/32`` on each host port plus a ``198.18.<n>.<k>/32 dev <port>`` route per host. So every packet,
  including host-to-host traffic under one leaf, crosses the edge router's egress queue, with no bridge and no
  proxy ARP.
* Router-to-router links get /31s from ``198.19.0.0/16`` in link order: link i uses ``198.19.0.0 + 2i``; the link's
  ``a`` end gets the even address, ``b`` the odd one (in a leaf-spine fabric: leaf even, spine odd).
* MACs are locally administered unicast ``02:RR:NN:NN:PP:PP``: RR the role (01 host, 02 leaf, 03 spine,
  04 switch), NNNN the node's index in ``topology.nodes``, PPPP the port's index on that node (link order).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Protocol

from .spec import Interface, Link, Node, SpecError


class Graph(Protocol):
    """What the address plan reads of a topology: its nodes and links (:class:`~topologies.topology.Topology`
    has them; naming them here keeps this module below topology.py, which calls it)."""

    @property
    def nodes(self) -> tuple[Node, ...]: ...

    @property
    def links(self) -> tuple[Link, ...]: ...

BENCHMARK_NET = ipaddress.IPv4Network("198.18.0.0/15")
HOST_NET = ipaddress.IPv4Network("198.18.0.0/16")
FABRIC_NET = ipaddress.IPv4Network("198.19.0.0/16")
GATEWAY_OCTET = 254
MAX_HOSTS_PER_SUBNET = 253  # .1 .. .253; .254 is the gateway, .0 and .255 stay unused
MAX_EDGE_ROUTERS = 255  # 198.18.1.0/24 .. 198.18.255.0/24
MAX_FABRIC_LINKS = FABRIC_NET.num_addresses // 2  # 32768 /31s
ROLE_CODES = {"host": 0x01, "leaf": 0x02, "spine": 0x03, "switch": 0x04}


def host_subnet(n: int) -> str:
    """The /24 of the n-th edge router (1-based)."""
    if not 1 <= n <= MAX_EDGE_ROUTERS:
        raise SpecError("addresses", f"edge router number {n} outside the plan (1..{MAX_EDGE_ROUTERS})")
    return f"198.18.{n}.0/24"


def host_address(n: int, k: int) -> str:
    if not 1 <= k <= MAX_HOSTS_PER_SUBNET:
        raise SpecError("addresses", f"host number {k} outside the /24 plan (1..{MAX_HOSTS_PER_SUBNET})")
    return f"198.18.{n}.{k}"


def gateway_address(n: int) -> str:
    return f"198.18.{n}.{GATEWAY_OCTET}"


def fabric_pair(i: int) -> tuple[str, str]:
    """(a-side, b-side) addresses of the i-th (0-based) router-to-router /31."""
    if not 0 <= i < MAX_FABRIC_LINKS:
        raise SpecError("addresses", f"{i + 1} router-to-router links exceed the 198.19.0.0/16 /31 plan "
                                     f"(max {MAX_FABRIC_LINKS})")
    base = FABRIC_NET.network_address + 2 * i
    return str(base), str(base + 1)


def mac_address(role: str, node_index: int, port_index: int) -> str:
    """Deterministic locally administered unicast MAC (first octet 0x02)."""
    if not 0 <= node_index <= 0xFFFF or not 0 <= port_index <= 0xFFFF:
        raise SpecError("addresses", f"node index {node_index} / port index {port_index} exceed the MAC plan")
    octets = [0x02, ROLE_CODES[role], node_index >> 8, node_index & 0xFF, port_index >> 8, port_index & 0xFF]
    return ":".join(f"{o:02x}" for o in octets)


@dataclass(frozen=True)
class AddressPlan:
    """The result of :func:`plan_addresses`."""

    interfaces: Mapping[tuple[str, str], Interface]
    #: edge router -> its host subnet (``198.18.<n>.0/24``)
    subnets: Mapping[str, str]
    #: edge router -> its hosts, in order
    edge_hosts: Mapping[str, tuple[str, ...]]
    #: host -> (edge router, host's ifname, edge router's port towards the host)
    attachments: Mapping[str, tuple[str, str, str]]

    def host_ip(self, host: str) -> str:
        router, ifname, _ = self.attachments[host]
        return self.interfaces[(host, ifname)].ip

    def gateway_of(self, host: str) -> str:
        router, _, port = self.attachments[host]
        return self.interfaces[(router, port)].ip

    def owner_of(self, ip: str) -> tuple[str, str]:
        """(node, ifname) holding ``ip`` (the gateway .254 is held by several ports: the first is returned)."""
        for key, itf in self.interfaces.items():
            if itf.ip == ip:
                return key
        raise KeyError(ip)


def _edge_routers(topology: Graph, role: dict[str, str]
                  ) -> tuple[dict[str, list[tuple[str, str, str]]], list[str]]:
    """The routers with hosts, in node order, and each one's hosts as (host, host port, router port) in link order;
    SpecError when they exceed the plan (255 edge routers, 253 hosts each)."""
    attached: dict[str, list[tuple[str, str, str]]] = {}
    for l in topology.links:
        if role[l.a] == "host":
            attached.setdefault(l.b, []).append((l.a, l.a_port, l.b_port))
        elif role[l.b] == "host":
            attached.setdefault(l.a, []).append((l.b, l.b_port, l.a_port))
    edge_order = [n.name for n in topology.nodes if n.name in attached]
    if len(edge_order) > MAX_EDGE_ROUTERS:
        raise SpecError("addresses", f"{len(edge_order)} routers with hosts exceed the address plan (one "
                                     f"198.18.<n>.0/24 each, max {MAX_EDGE_ROUTERS})")
    for r in edge_order:
        if len(attached[r]) > MAX_HOSTS_PER_SUBNET:
            raise SpecError("addresses", f"{len(attached[r])} hosts on {r!r} exceed the /24 address plan "
                                         f"(max {MAX_HOSTS_PER_SUBNET})")
    return attached, edge_order


def plan_addresses(topology: Graph) -> AddressPlan:
    """Assign every interface of ``topology`` an address and a MAC (see the module docstring)."""
    nodes = topology.nodes
    role = {n.name: n.role for n in nodes}
    index = {n.name: i for i, n in enumerate(nodes)}
    port_count: dict[str, int] = {}

    def mac(node: str) -> str:
        i = port_count.get(node, 0)
        port_count[node] = i + 1
        return mac_address(role[node], index[node], i)

    attached, edge_order = _edge_routers(topology, role)
    number = {r: i + 1 for i, r in enumerate(edge_order)}
    interfaces: dict[tuple[str, str], Interface] = {}
    host_no: dict[str, int] = {}
    for r in edge_order:
        for k, (h, _, _) in enumerate(attached[r], start=1):
            host_no[h] = k
    fabric_i = 0
    for l in topology.links:
        if role[l.a] == "host" or role[l.b] == "host":
            if role[l.a] == "host":
                h, h_if, r, r_port = l.a, l.a_port, l.b, l.b_port
                order = ((h, h_if), (r, r_port))
            else:
                h, h_if, r, r_port = l.b, l.b_port, l.a, l.a_port
                order = ((r, r_port), (h, h_if))
            n = number[r]
            ips = {h: (host_address(n, host_no[h]), 32), r: (gateway_address(n), 32)}
            for node, ifname in order:
                ip, plen = ips[node]
                interfaces[(node, ifname)] = Interface(node, ifname, ip, plen, mac(node))
        else:
            a_ip, b_ip = fabric_pair(fabric_i)
            fabric_i += 1
            interfaces[(l.a, l.a_port)] = Interface(l.a, l.a_port, a_ip, 31, mac(l.a))
            interfaces[(l.b, l.b_port)] = Interface(l.b, l.b_port, b_ip, 31, mac(l.b))

    attachments = {h: (r, h_if, r_port) for r in edge_order for (h, h_if, r_port) in attached[r]}
    return AddressPlan(
        interfaces=MappingProxyType(interfaces),
        subnets=MappingProxyType({r: host_subnet(number[r]) for r in edge_order}),
        edge_hosts=MappingProxyType({r: tuple(h for h, _, _ in attached[r]) for r in edge_order}),
        attachments=MappingProxyType(attachments),
    )


def in_benchmark_range(ip: str) -> bool:
    return ipaddress.IPv4Address(ip) in BENCHMARK_NET


__all__ = [
    "AddressPlan", "plan_addresses", "host_subnet", "host_address", "gateway_address", "fabric_pair", "mac_address",
    "in_benchmark_range", "BENCHMARK_NET", "HOST_NET", "FABRIC_NET", "GATEWAY_OCTET", "MAX_HOSTS_PER_SUBNET",
    "MAX_EDGE_ROUTERS", "MAX_FABRIC_LINKS",
]
