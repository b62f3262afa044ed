"""The records a fabric builder consumes: nodes, links with what sits on each egress, addressed interfaces,
routes and hops, plus the structural checks every topology passes and the JSON form of any spec."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar, Iterable, Mapping, NamedTuple

from .base import (ROLES, SpecError, _choice, _got, validate_ifname, validate_node_name)
from .classes import ClassSpec
from .link import LinkSpec
from .queue import QueueSpec


@dataclass(frozen=True)
class PortSpec:
    """What sits on one port's egress: the tier it belongs to, the tier queue, and the resolved classes (each
    class's ``queue`` filled in with the tier queue when it had none). No classes = one classless queue.
    ``rate_mbps``: this egress's own shaped rate (a per-port override, topologies/overrides.py); None = the link's.
    """

    tier: str
    queue: QueueSpec
    classes: tuple[ClassSpec, ...] = ()
    rate_mbps: float | None = None

    @property
    def classless(self) -> bool:
        return not self.classes


def resolve_port(tier: str, queue: QueueSpec, classes: tuple[ClassSpec, ...], *, queue_path: str,
                 classes_path: str = "classes", frame_bytes: int | None = None) -> PortSpec:
    """Build the :class:`PortSpec` of a tier, checking the tier queue and each class's (effective) queue.

    ``frame_bytes``: the largest frame on the port; every queue must hold at least one.
    """
    if not isinstance(queue, QueueSpec):
        raise SpecError(queue_path, f"must be a QueueSpec (got {_got(queue)})")
    resolved = []
    for i, c in enumerate(classes):
        q = c.queue if c.queue is not None else queue
        where = f"class {c.name!r}'s own queue" if c.queue is not None else f"the {queue_path} buffer"
        c.check_queue(q, where=where, path=f"{classes_path}[{i}]")
        if frame_bytes is not None and q.limit_bytes < frame_bytes and c.queue is not None:
            raise SpecError(f"{classes_path}[{i}].queue.buffer_bytes",
                            f"must hold one {frame_bytes}-byte frame (got {q.limit_bytes} bytes)")
        resolved.append(c if c.queue is not None else _replace_queue(c, queue))
    if frame_bytes is not None and queue.limit_bytes < frame_bytes:
        field = "buffer_bytes" if queue.buffer_bytes is not None else "buffer_packets"
        raise SpecError(f"{queue_path}.{field}", f"must hold one {frame_bytes}-byte frame (MTU + Ethernet header) "
                                                 f"(got {queue.limit_bytes} bytes)")
    return PortSpec(tier, queue, tuple(resolved))


def _replace_queue(c: ClassSpec, queue: QueueSpec) -> ClassSpec:
    kw = {f.name: getattr(c, f.name) for f in fields(c)}
    kw["queue"] = queue
    return ClassSpec(**kw)


@dataclass(frozen=True)
class Node:
    """A namespace: ``name`` (``h1``, ``leaf1``, ``spine1``, ``s1``), ``role`` (host|leaf|spine|switch) and the
    network-namespace name ``<prefix>-<name>``."""

    name: str
    role: str
    namespace: str

    @property
    def is_host(self) -> bool:
        return self.role == "host"


@dataclass(frozen=True)
class Link:
    """A veth pair between ``a``:``a_port`` and ``b``:``b_port`` with its :class:`LinkSpec` and what sits on each
    end's egress (``a_egress`` shapes traffic a -> b, ``b_egress`` traffic b -> a)."""

    a: str
    a_port: str
    b: str
    b_port: str
    spec: LinkSpec
    a_egress: PortSpec
    b_egress: PortSpec

    KIND: ClassVar[str] = "link"

    def __post_init__(self) -> None:
        validate_ifname(f"{self.KIND}.a_port", self.a_port)
        validate_ifname(f"{self.KIND}.b_port", self.b_port)
        if self.a == self.b:
            raise SpecError(f"{self.KIND}.b", f"a link cannot join {self.a!r} to itself")

    @property
    def name(self) -> str:
        return f"{self.a}:{self.a_port}-{self.b}:{self.b_port}"

    def port_of(self, node: str) -> str:
        if node == self.a:
            return self.a_port
        if node == self.b:
            return self.b_port
        raise KeyError(node)

    def peer_of(self, node: str) -> tuple[str, str]:
        """(peer node, peer port) seen from ``node``."""
        if node == self.a:
            return self.b, self.b_port
        if node == self.b:
            return self.a, self.a_port
        raise KeyError(node)

    def egress_of(self, node: str) -> PortSpec:
        if node == self.a:
            return self.a_egress
        if node == self.b:
            return self.b_egress
        raise KeyError(node)


class EgressPort(NamedTuple):
    """One shaped egress: HTB at :attr:`rate_mbps` with ``port``'s queue(s) below it."""

    node: str
    ifname: str
    peer: str
    peer_ifname: str
    link: LinkSpec
    port: PortSpec

    @property
    def rate_mbps(self) -> float:
        """The shaped rate of this direction: the port's own (a per-port override) or else the link's."""
        return self.port.rate_mbps if self.port.rate_mbps is not None else self.link.rate_mbps


@dataclass(frozen=True)
class Interface:
    """An addressed interface. ``prefixlen`` is 32 for host-facing ports and hosts (routed, see addressing) and 31
    for router-to-router links."""

    node: str
    ifname: str
    ip: str
    prefixlen: int
    mac: str

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefixlen}"


class NextHop(NamedTuple):
    ifname: str
    gateway: str | None  # None: the destination is directly on that interface (scope link)


@dataclass(frozen=True)
class Route:
    """A static route to install in ``node``. Several nexthops = an ECMP (multipath) route. ``onlink``: the gateway
    is reachable on the interface although no prefix covers it. ``rto_min_ms``: per-route TCP ``rto_min``."""

    node: str
    dst: str
    nexthops: tuple[NextHop, ...]
    onlink: bool = False
    rto_min_ms: int | None = None

    @property
    def ecmp(self) -> bool:
        return len(self.nexthops) > 1


class Hop(NamedTuple):
    """One directed hop of a path: leaves ``node`` through egress ``port`` and arrives at ``peer``:``peer_port``.
    ``(node, port)`` is the queue the packet waited in (the ``node``/``port`` columns of ``queues.csv``)."""

    node: str
    port: str
    peer: str
    peer_port: str


def check_graph(nodes: Iterable[Node], links: Iterable[Link]) -> None:
    """Structural checks every topology must pass: unique names, valid roles, links between known nodes, unique
    port names per node, hosts attached by exactly one link to a router."""
    seen: dict[str, Node] = {}
    for n in nodes:
        validate_node_name("nodes", n.name)
        _choice("nodes.role", n.role, ROLES, "role")
        if n.name in seen:
            raise SpecError("nodes", f"duplicate node name {n.name!r}")
        seen[n.name] = n
    ports: set[tuple[str, str]] = set()
    degree: dict[str, int] = {}
    for l in links:
        for node, port, peer in ((l.a, l.a_port, l.b), (l.b, l.b_port, l.a)):
            if node not in seen:
                raise SpecError("links", f"link {l.name} names unknown node {node!r}")
            if (node, port) in ports:
                raise SpecError("links", f"port {port!r} used twice on node {node!r}")
            ports.add((node, port))
            degree[node] = degree.get(node, 0) + 1
        if seen[l.a].is_host and seen[l.b].is_host:
            raise SpecError("links", f"link {l.name} joins two hosts; hosts attach to a router")
    for n in seen.values():
        if n.is_host and degree.get(n.name, 0) != 1:
            raise SpecError("links", f"host {n.name!r} must have exactly one link (got {degree.get(n.name, 0)})")


def spec_dict(obj: Any) -> Any:
    """A JSON-friendly dict of a spec (frozensets as sorted lists, tuples as lists, None fields dropped)."""
    if hasattr(obj, "__dataclass_fields__"):
        out = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            if v is None:
                continue
            out[f.name] = spec_dict(v)
        return out
    if isinstance(obj, (frozenset, set)):
        return sorted(obj)
    if isinstance(obj, (list, tuple)):
        return [spec_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: spec_dict(v) for k, v in obj.items()}
    return obj
