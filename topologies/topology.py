"""The :class:`Topology` base every topology (leaf-spine, dumbbell) derives from: its graph of nodes and links,
and what is derived from it (addresses, routes), computed lazily, once.

It sits above ``spec`` (the records), ``addressing`` and ``routing`` (which it calls). Those two name what they read
of it as Protocols (:class:`~topologies.addressing.Graph`, :class:`~topologies.routing.Routed`), so neither imports
it back, not even for a type.
"""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Mapping

from .addressing import AddressPlan, plan_addresses
from .overrides import PortOverride, apply_port_overrides
from .routing import compute_routes
from .spec import EgressPort, HostTcpSpec, Interface, Link, Node, Route, check_graph, load_balancing_sysctls


class Topology:
    """What every topology offers a builder: ``nodes``, ``links``, ``hosts``, ``addresses``, ``routes``.

    Subclasses are frozen dataclasses with at least ``prefix`` and ``tcp`` fields and implement :meth:`_build`;
    one with a ``ports`` field (per-port overrides, topologies/overrides.py) calls :meth:`_check_ports` last in
    its ``__post_init__``. Everything derived is computed lazily, once.
    """

    kind: ClassVar[str] = "topology"
    load_balancing: str = "ecmp"
    prefix: str
    tcp: HostTcpSpec
    ports: tuple[PortOverride, ...] = ()

    def _build(self) -> tuple[tuple[Node, ...], tuple[Link, ...]]:  # pragma: no cover
        raise NotImplementedError

    @cached_property
    def _graph(self) -> tuple[tuple[Node, ...], tuple[Link, ...]]:
        nodes, links = self._build()
        if self.ports:
            links = apply_port_overrides(links, self.ports, getattr(self, "classes", ()))
        check_graph(nodes, links)
        return tuple(nodes), tuple(links)

    def _check_ports(self) -> None:
        """Resolve the per-port overrides now, so a bad one fails the spec's construction, not its first use."""
        if self.ports:
            self._graph  # computed for its checks, then cached

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self._graph[0]

    @property
    def links(self) -> tuple[Link, ...]:
        return self._graph[1]

    @property
    def hosts(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == "host")

    @property
    def routers(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role != "host")

    @cached_property
    def _node_index(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> Node:
        try:
            return self._node_index[name]
        except KeyError:
            raise KeyError(f"no node {name!r} in this topology") from None

    def namespace(self, name: str) -> str:
        return self.node(name).namespace

    def links_of(self, name: str) -> tuple[Link, ...]:
        return tuple(l for l in self.links if name in (l.a, l.b))

    def egress_ports(self) -> tuple[EgressPort, ...]:
        """Every port egress in the fabric (both ends of every link), in link order."""
        out = []
        for l in self.links:
            out.append(EgressPort(l.a, l.a_port, l.b, l.b_port, l.spec, l.a_egress))
            out.append(EgressPort(l.b, l.b_port, l.a, l.a_port, l.spec, l.b_egress))
        return tuple(out)

    @cached_property
    def address_plan(self) -> AddressPlan:
        return plan_addresses(self)

    @property
    def addresses(self) -> Mapping[tuple[str, str], Interface]:
        """``(node, ifname) -> Interface`` for every interface."""
        return self.address_plan.interfaces

    def host_ip(self, host: str) -> str:
        return self.address_plan.host_ip(host)

    @cached_property
    def routes(self) -> tuple[Route, ...]:
        return tuple(compute_routes(self))

    def routes_of(self, name: str) -> tuple[Route, ...]:
        return tuple(r for r in self.routes if r.node == name)

    def router_sysctls(self) -> dict[str, str]:
        return load_balancing_sysctls(self.load_balancing)


__all__ = ["Topology"]
