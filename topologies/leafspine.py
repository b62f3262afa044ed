"""A scaled-down two-tier leaf-spine (L3 Clos) fabric.

Names: hosts ``h1`` .. ``h<leaves*hosts_per_leaf>`` numbered leaf by leaf (leaf1 holds h1..h<hosts_per_leaf>),
leaves ``leaf1`` .., spines ``spine1`` ..; the namespace of node ``x`` is ``<prefix>-x`` (``tb-leaf1``).
Interfaces: a host's single NIC is ``eth0``; a router names each port after the peer node (``leaf1`` has ports
``h1``, ``h2``, ``spine1``, ``spine2``; ``spine1`` has ``leaf1``, ``leaf2``, ...).

Links, in order: every host link (``a`` = host:eth0, ``b`` = leaf:<host>), then every fabric link leaf-major
(``a`` = leaf:<spine>, ``b`` = spine:<leaf>). Egress tiers: ``host_nic`` (host -> leaf), ``leaf_down``
(leaf -> host), ``leaf_up`` (leaf -> spine), ``spine`` (spine -> leaf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .addressing import MAX_EDGE_ROUTERS, MAX_FABRIC_LINKS, MAX_HOSTS_PER_SUBNET
from .overrides import PortOverride, validate_port_overrides
from .flowlet import DEFAULT_GAP_MS, DEFAULT_POLL_MS, FLOWLET_MODES
from .spec import (HOST_IFNAME, LOAD_BALANCING_MODES, ClassSpec, HostTcpSpec, Link, LinkSpec, Node, PortSpec,
                   QueueSpec, SpecError, resolve_port, spec_dict, validate_classes, validate_prefix)
from .spec.base import _choice, _got, _range, _set
from .topology import Topology

#: 256 KiB droptail: ~2 ms of queue at 1 Gbit/s.
DEFAULT_QUEUE = QueueSpec("droptail", buffer_bytes=262_144)
MAX_SPINES = 255


def _check_type(path: str, value: Any, cls: type) -> None:
    if not isinstance(value, cls):
        raise SpecError(path, f"must be a {cls.__name__} (got {_got(value)})")


@dataclass(frozen=True)
class LeafSpineSpec(Topology):
    spines: int
    leaves: int
    hosts_per_leaf: int
    host_link: LinkSpec
    fabric_link: LinkSpec
    host_queue: QueueSpec = DEFAULT_QUEUE
    leaf_down_queue: QueueSpec = DEFAULT_QUEUE
    leaf_up_queue: QueueSpec = DEFAULT_QUEUE
    spine_queue: QueueSpec = DEFAULT_QUEUE
    classes: tuple[ClassSpec, ...] = ()
    load_balancing: str = "ecmp"
    flowlet_gap_ms: float = DEFAULT_GAP_MS  # flowlet and adaptive: the idle gap that starts a new flowlet
    adaptive_poll_ms: float = DEFAULT_POLL_MS  # adaptive: how often path congestion is read and written
    tcp: HostTcpSpec = HostTcpSpec()
    seed: int = 0
    prefix: str = "tb"
    ports: tuple[PortOverride, ...] = ()  # per-port overrides (topologies/overrides.py)

    kind: ClassVar[str] = "leafspine"
    TIERS: ClassVar[tuple[tuple[str, str, str], ...]] = (
        # tier, queue field, link field whose frame size the queue must hold
        ("host_nic", "host_queue", "host_link"),
        ("leaf_down", "leaf_down_queue", "host_link"),
        ("leaf_up", "leaf_up_queue", "fabric_link"),
        ("spine", "spine_queue", "fabric_link"),
    )

    def __post_init__(self) -> None:
        _set(self, "spines", _range("spines", self.spines, 1, MAX_SPINES, integer=True))
        _set(self, "leaves", _range("leaves", self.leaves, 1, integer=True))
        if self.leaves > MAX_EDGE_ROUTERS:
            raise SpecError("leaves", f"{self.leaves} leaves exceed the address plan (one 198.18.<leaf>.0/24 each, "
                                      f"max {MAX_EDGE_ROUTERS})")
        _set(self, "hosts_per_leaf", _range("hosts_per_leaf", self.hosts_per_leaf, 1, integer=True))
        if self.hosts_per_leaf > MAX_HOSTS_PER_SUBNET:
            raise SpecError("hosts_per_leaf", f"{self.hosts_per_leaf} hosts exceed the /24 address plan "
                                              f"(max {MAX_HOSTS_PER_SUBNET})")
        if self.spines * self.leaves > MAX_FABRIC_LINKS:
            raise SpecError("spines", f"{self.spines} x {self.leaves} fabric links exceed the 198.19.0.0/16 /31 "
                                      f"plan (max {MAX_FABRIC_LINKS})")
        _check_type("host_link", self.host_link, LinkSpec)
        _check_type("fabric_link", self.fabric_link, LinkSpec)
        if self.fabric_link.mtu < self.host_link.mtu:
            raise SpecError("fabric_link.mtu", f"must be >= host_link.mtu or the fabric drops full-size host "
                                               f"packets (got {self.fabric_link.mtu} < {self.host_link.mtu})")
        _set(self, "classes", validate_classes(self.classes, "classes"))
        _choice("load_balancing", self.load_balancing, LOAD_BALANCING_MODES, "load-balancing mode")
        _set(self, "flowlet_gap_ms", _range("flowlet_gap_ms", self.flowlet_gap_ms, 0.01, 10_000))
        _set(self, "adaptive_poll_ms", _range("adaptive_poll_ms", self.adaptive_poll_ms, 1, 10_000))
        _check_type("tcp", self.tcp, HostTcpSpec)
        _set(self, "seed", _range("seed", self.seed, 0, 2**32 - 1, integer=True))
        validate_prefix("prefix", self.prefix)
        ports = {}
        for tier, qfield, lfield in self.TIERS:
            link: LinkSpec = getattr(self, lfield)
            ports[tier] = resolve_port(tier, getattr(self, qfield), self.classes, queue_path=qfield,
                                       frame_bytes=link.frame_bytes)
        _set(self, "_ports", ports)
        _set(self, "ports", validate_port_overrides(self.ports, "ports"))
        self._check_ports()

    # ---- structure ----

    def port_spec(self, tier: str) -> PortSpec:
        """The resolved :class:`PortSpec` of ``host_nic``, ``leaf_down``, ``leaf_up`` or ``spine``."""
        return self._ports[tier]  # type: ignore[attr-defined]

    @property
    def host_count(self) -> int:
        return self.leaves * self.hosts_per_leaf

    def host_name(self, leaf: int, k: int) -> str:
        """The k-th (1-based) host of leaf ``leaf`` (1-based)."""
        return f"h{(leaf - 1) * self.hosts_per_leaf + k}"

    def leaf_of(self, host: str) -> str:
        i = int(host[1:]) if host.startswith("h") and host[1:].isdigit() else 0
        if not 1 <= i <= self.host_count:
            raise KeyError(f"no host {host!r}")
        return f"leaf{(i - 1) // self.hosts_per_leaf + 1}"

    def hosts_of(self, leaf: str) -> tuple[str, ...]:
        n = int(leaf[4:])
        return tuple(self.host_name(n, k) for k in range(1, self.hosts_per_leaf + 1))

    def _build(self) -> tuple[tuple[Node, ...], tuple[Link, ...]]:
        p = self.prefix
        hosts = [f"h{i}" for i in range(1, self.host_count + 1)]
        leaves = [f"leaf{i}" for i in range(1, self.leaves + 1)]
        spines = [f"spine{i}" for i in range(1, self.spines + 1)]
        nodes = ([Node(h, "host", f"{p}-{h}") for h in hosts] + [Node(l, "leaf", f"{p}-{l}") for l in leaves]
                 + [Node(s, "spine", f"{p}-{s}") for s in spines])
        host_nic, down = self.port_spec("host_nic"), self.port_spec("leaf_down")
        up, spine = self.port_spec("leaf_up"), self.port_spec("spine")
        links = []
        for li, leaf in enumerate(leaves, start=1):
            for k in range(1, self.hosts_per_leaf + 1):
                h = self.host_name(li, k)
                links.append(Link(h, HOST_IFNAME, leaf, h, self.host_link, host_nic, down))
        for leaf in leaves:
            for s in spines:
                links.append(Link(leaf, s, s, leaf, self.fabric_link, up, spine))
        return tuple(nodes), tuple(links)

    # ---- numbers ----

    @property
    def oversubscription(self) -> float:
        """Leaf downlink capacity over uplink capacity: (hosts_per_leaf * host rate) / (spines * fabric rate)."""
        return (self.hosts_per_leaf * self.host_link.rate_mbps) / (self.spines * self.fabric_link.rate_mbps)

    @property
    def bisection_mbps(self) -> float:
        """Capacity across the spine layer (half the leaves talking to the other half), per direction."""
        return min(self.leaves // 2 * self.spines * self.fabric_link.rate_mbps,
                   self.leaves // 2 * self.hosts_per_leaf * self.host_link.rate_mbps)

    @property
    def base_rtt_ms(self) -> float:
        """Propagation RTT between hosts on different leaves (4 links each way, each ``delay_ms`` one way)."""
        return 2 * (2 * self.host_link.delay_ms + 2 * self.fabric_link.delay_ms)

    def warnings(self) -> list[str]:
        """Legal but probably unintended settings."""
        out = []
        marking = [t for t, q, _ in self.TIERS if getattr(self, q).marks_ecn]
        marking += [f"class {c.name}" for c in self.classes if c.queue is not None and c.queue.marks_ecn]
        marking += [f"port {o.port}" for o in self.ports if o.queue is not None and o.queue.marks_ecn]
        if marking and not self.tcp.effective_ecn:
            out.append(f"queues mark ECN ({', '.join(marking)}) but host TCP has ECN off")
        if self.tcp.congestion_control == "dctcp" and not marking:
            out.append("dctcp without any ECN-marking queue behaves like reno with drops")
        fast = max(self.host_link.rate_mbps, self.fabric_link.rate_mbps)
        if fast > 10_000:
            out.append(f"{fast:g} Mbit/s links: software veth shaping rarely sustains more than ~10 Gbit/s")
        return out

    def describe(self) -> dict[str, Any]:
        """A JSON-serialisable summary for manifests."""
        return {
            "kind": self.kind,
            "prefix": self.prefix,
            "spines": self.spines,
            "leaves": self.leaves,
            "hosts_per_leaf": self.hosts_per_leaf,
            "hosts": self.host_count,
            "nodes": len(self.nodes),
            "links": len(self.links),
            "host_link": spec_dict(self.host_link),
            "fabric_link": spec_dict(self.fabric_link),
            "oversubscription": self.oversubscription,
            "bisection_mbps": self.bisection_mbps,
            "base_rtt_ms": self.base_rtt_ms,
            "queues": {t: spec_dict(getattr(self, q)) for t, q, _ in self.TIERS},
            "classes": spec_dict(self.classes),
            "ports": spec_dict(self.ports),
            "load_balancing": self.load_balancing,
            **({"flowlet_gap_ms": self.flowlet_gap_ms} if self.load_balancing in FLOWLET_MODES else {}),
            **({"adaptive_poll_ms": self.adaptive_poll_ms} if self.load_balancing == "adaptive" else {}),
            "tcp": spec_dict(self.tcp),
            "seed": self.seed,
            "host_subnets": dict(self.address_plan.subnets),
            "warnings": self.warnings(),
        }


def uniform_leaf_spine(spines: int, leaves: int, hosts_per_leaf: int, host_rate_mbps: float,
                       fabric_rate_mbps: float, *, delay_ms: float = 0.0, mtu: int = 1500,
                       host_queue: QueueSpec = DEFAULT_QUEUE, switch_queue: QueueSpec = DEFAULT_QUEUE,
                       leaf_down_queue: QueueSpec | None = None, leaf_up_queue: QueueSpec | None = None,
                       spine_queue: QueueSpec | None = None, **fields: Any) -> LeafSpineSpec:
    """The uniform leaf-spine the commands and scenarios build from their ``--set`` parameters: every host link
    shaped to ``host_rate_mbps``, every leaf-spine link to ``fabric_rate_mbps``, both with the one-way
    ``delay_ms`` and ``mtu``; the host NICs' queue ``host_queue`` and every switch port's ``switch_queue``, except
    a tier given its own (``leaf_down_queue``: the leaves' host-facing ports, an incast's bottleneck). Any other
    keyword is a :class:`LeafSpineSpec` field (``tcp``, ``seed``, ``load_balancing``, ``classes``, ...). SpecError
    on bad values, as the spec raises them."""
    tiers = {"leaf_down_queue": leaf_down_queue, "leaf_up_queue": leaf_up_queue, "spine_queue": spine_queue}
    return LeafSpineSpec(spines=spines, leaves=leaves, hosts_per_leaf=hosts_per_leaf,
                         host_link=LinkSpec(host_rate_mbps, delay_ms=delay_ms, mtu=mtu),
                         fabric_link=LinkSpec(fabric_rate_mbps, delay_ms=delay_ms, mtu=mtu), host_queue=host_queue,
                         **{t: switch_queue if q is None else q for t, q in tiers.items()}, **fields)


__all__ = ["LeafSpineSpec", "DEFAULT_QUEUE", "uniform_leaf_spine"]
