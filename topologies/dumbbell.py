"""The classic dumbbell: N senders -> switch s1 -> bottleneck -> switch s2 -> M receivers (default M = 1).

Names: senders ``h1`` .. ``h<senders>``, receivers ``r1`` .. ``r<receivers>``, switches ``s1`` and ``s2`` (role
``switch``; they are L3 routers like leaves). Host NICs are ``eth0``; switch ports are named after the peer node.

Links, in order: sender links (``a`` = h<i>:eth0, ``b`` = s1:h<i>), the bottleneck (``a`` = s1:s2, ``b`` = s2:s1),
receiver links (``a`` = r<j>:eth0, ``b`` = s2:r<j>). Egress tiers: ``host_nic`` (every host NIC), ``switch`` (every
switch port except s1 -> s2) and ``bottleneck`` (s1 -> s2, the queue under study). The reverse direction s2 -> s1
carries ACKs and uses the ``switch`` tier.

Addresses (see :mod:`topologies.addressing`): senders 198.18.1.0/24 behind s1, receivers 198.18.2.0/24 behind s2,
the bottleneck /31 is 198.19.0.0 (s1) / 198.19.0.1 (s2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .addressing import MAX_HOSTS_PER_SUBNET
from .leafspine import DEFAULT_QUEUE, _check_type
from .overrides import PortOverride, validate_port_overrides
from .spec import (HOST_IFNAME, ClassSpec, HostTcpSpec, Link, LinkSpec, Node, PortSpec, QueueSpec, SpecError,
                   resolve_port, spec_dict, validate_classes, validate_prefix)
from .spec.base import _range, _set
from .topology import Topology


@dataclass(frozen=True)
class DumbbellSpec(Topology):
    senders: int
    sender_link: LinkSpec
    bottleneck_link: LinkSpec
    receiver_link: LinkSpec | None = None  # None: same as sender_link
    receivers: int = 1
    bottleneck_queue: QueueSpec = DEFAULT_QUEUE
    switch_queue: QueueSpec = DEFAULT_QUEUE
    host_queue: QueueSpec = DEFAULT_QUEUE
    classes: tuple[ClassSpec, ...] = ()
    tcp: HostTcpSpec = HostTcpSpec()
    seed: int = 0
    prefix: str = "tb"
    ports: tuple[PortOverride, ...] = ()  # per-port overrides (topologies/overrides.py)

    kind: ClassVar[str] = "dumbbell"

    def __post_init__(self) -> None:
        _set(self, "senders", _range("senders", self.senders, 1, integer=True))
        if self.senders > MAX_HOSTS_PER_SUBNET:
            raise SpecError("senders", f"{self.senders} hosts exceed the /24 address plan "
                                       f"(max {MAX_HOSTS_PER_SUBNET})")
        _set(self, "receivers", _range("receivers", self.receivers, 1, integer=True))
        if self.receivers > MAX_HOSTS_PER_SUBNET:
            raise SpecError("receivers", f"{self.receivers} hosts exceed the /24 address plan "
                                         f"(max {MAX_HOSTS_PER_SUBNET})")
        _check_type("sender_link", self.sender_link, LinkSpec)
        _check_type("bottleneck_link", self.bottleneck_link, LinkSpec)
        if self.receiver_link is None:
            _set(self, "receiver_link", self.sender_link)
        _check_type("receiver_link", self.receiver_link, LinkSpec)
        for name in ("sender_link", "receiver_link"):
            mtu = getattr(self, name).mtu
            if self.bottleneck_link.mtu < mtu:
                raise SpecError("bottleneck_link.mtu", f"must be >= {name}.mtu or the bottleneck drops full-size "
                                                       f"packets (got {self.bottleneck_link.mtu} < {mtu})")
        _set(self, "classes", validate_classes(self.classes, "classes"))
        _check_type("tcp", self.tcp, HostTcpSpec)
        _set(self, "seed", _range("seed", self.seed, 0, 2**32 - 1, integer=True))
        validate_prefix("prefix", self.prefix)
        frame = max(self.sender_link.frame_bytes, self.receiver_link.frame_bytes)  # type: ignore[union-attr]
        self_ports = {
            "host_nic": resolve_port("host_nic", self.host_queue, self.classes, queue_path="host_queue",
                                     frame_bytes=frame),
            "switch": resolve_port("switch", self.switch_queue, self.classes, queue_path="switch_queue",
                                   frame_bytes=max(frame, self.bottleneck_link.frame_bytes)),
            "bottleneck": resolve_port("bottleneck", self.bottleneck_queue, self.classes,
                                       queue_path="bottleneck_queue", frame_bytes=self.bottleneck_link.frame_bytes),
        }
        _set(self, "_ports", self_ports)
        _set(self, "ports", validate_port_overrides(self.ports, "ports"))
        self._check_ports()

    def port_spec(self, tier: str) -> PortSpec:
        """The resolved :class:`PortSpec` of ``host_nic``, ``switch`` or ``bottleneck``."""
        return self._ports[tier]  # type: ignore[attr-defined]

    @property
    def sender_names(self) -> tuple[str, ...]:
        return tuple(f"h{i}" for i in range(1, self.senders + 1))

    @property
    def receiver_names(self) -> tuple[str, ...]:
        return tuple(f"r{j}" for j in range(1, self.receivers + 1))

    def _build(self) -> tuple[tuple[Node, ...], tuple[Link, ...]]:
        p = self.prefix
        nodes = ([Node(h, "host", f"{p}-{h}") for h in self.sender_names]
                 + [Node(r, "host", f"{p}-{r}") for r in self.receiver_names]
                 + [Node("s1", "switch", f"{p}-s1"), Node("s2", "switch", f"{p}-s2")])
        nic, sw, bn = self.port_spec("host_nic"), self.port_spec("switch"), self.port_spec("bottleneck")
        links = [Link(h, HOST_IFNAME, "s1", h, self.sender_link, nic, sw) for h in self.sender_names]
        links.append(Link("s1", "s2", "s2", "s1", self.bottleneck_link, bn, sw))
        links += [Link(r, HOST_IFNAME, "s2", r, self.receiver_link, nic, sw)  # type: ignore[arg-type]
                  for r in self.receiver_names]
        return tuple(nodes), tuple(links)

    @property
    def oversubscription(self) -> float:
        """Offered sender capacity over the bottleneck: (senders * sender rate) / bottleneck rate."""
        return self.senders * self.sender_link.rate_mbps / self.bottleneck_link.rate_mbps

    @property
    def base_rtt_ms(self) -> float:
        return 2 * (self.sender_link.delay_ms + self.bottleneck_link.delay_ms
                    + self.receiver_link.delay_ms)  # type: ignore[union-attr]

    def warnings(self) -> list[str]:
        out = []
        queues = {"host_nic": self.host_queue, "switch": self.switch_queue, "bottleneck": self.bottleneck_queue}
        marking = [t for t, q in queues.items() if q.marks_ecn]
        marking += [f"port {o.port}" for o in self.ports if o.queue is not None and o.queue.marks_ecn]
        if marking and not self.tcp.effective_ecn:
            out.append(f"queues mark ECN ({', '.join(marking)}) but host TCP has ECN off")
        if self.tcp.congestion_control == "dctcp" and not marking:
            out.append("dctcp without any ECN-marking queue behaves like reno with drops")
        if self.bottleneck_link.rate_mbps >= self.sender_link.rate_mbps * self.senders:
            out.append("the bottleneck link is not a bottleneck (it carries all senders at line rate)")
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "prefix": self.prefix,
            "senders": self.senders,
            "receivers": self.receivers,
            "hosts": self.senders + self.receivers,
            "nodes": len(self.nodes),
            "links": len(self.links),
            "sender_link": spec_dict(self.sender_link),
            "bottleneck_link": spec_dict(self.bottleneck_link),
            "receiver_link": spec_dict(self.receiver_link),
            "oversubscription": self.oversubscription,
            "base_rtt_ms": self.base_rtt_ms,
            "queues": {"host_nic": spec_dict(self.host_queue), "switch": spec_dict(self.switch_queue),
                       "bottleneck": spec_dict(self.bottleneck_queue)},
            "classes": spec_dict(self.classes),
            "ports": spec_dict(self.ports),
            "tcp": spec_dict(self.tcp),
            "seed": self.seed,
            "host_subnets": dict(self.address_plan.subnets),
            "warnings": self.warnings(),
        }


__all__ = ["DumbbellSpec"]
