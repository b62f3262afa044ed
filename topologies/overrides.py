"""Per-port overrides: one egress port with its own shaped rate and queue, different from its tier's.

    LeafSpineSpec(..., ports=(PortOverride("spine1:leaf2", rate_mbps=5,
                                           queue=QueueSpec("droptail", buffer_bytes=30_000)),))

or, in a topology file (topologies/load.py)::

    [[ports]]
    port = "spine1:leaf2"
    rate_mbps = 5
    queue = { discipline = "droptail", buffer_bytes = 30000 }

``port`` names an egress as ``NODE:IFNAME`` (one of ``Topology.egress_ports()``: the names testbed.faults.plan
accepts). ``rate_mbps`` shapes that direction only: the link's other direction keeps the link rate, and delay,
jitter, loss and MTU stay the link's. ``queue`` replaces the tier queue on that one port: the classless queue, or
the queue of every class that has no queue of its own (a class's own queue is kept). Checks, each a
:class:`SpecError` naming the field (``ports[1].rate_mbps``): the rate within LinkSpec's range, the port exists, no
port listed twice, the queue holds one frame of the port's link, every lossless class fits it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Iterable, Mapping

from .spec import (ClassSpec, Link, LinkSpec, PortSpec, QueueSpec, SpecError, resolve_port, validate_ifname,
                   validate_node_name)
from .spec.base import _got, _set

#: how many of a topology's egress ports an unknown-port error lists as examples
EXAMPLE_PORTS = 6


def parse_port_name(path: str, text: Any) -> tuple[str, str]:
    """``"spine1:leaf2"`` -> ``("spine1", "leaf2")``; a SpecError at ``path`` unless it is NODE:IFNAME."""
    if not isinstance(text, str) or text.count(":") != 1:
        raise SpecError(path, f"must be NODE:IFNAME, an egress port such as 'spine1:leaf2' (got {_got(text)})")
    node, ifname = text.split(":")
    validate_node_name(path, node)
    validate_ifname(path, ifname)
    return node, ifname


@dataclass(frozen=True)
class PortOverride:
    """One egress port's own ``rate_mbps`` and/or ``queue`` (see the module docstring); None keeps the tier's."""

    port: str
    rate_mbps: float | None = None
    queue: QueueSpec | None = None

    KIND: ClassVar[str] = "port"

    def __post_init__(self) -> None:
        k = self.KIND
        parse_port_name(f"{k}.port", self.port)
        if self.rate_mbps is None and self.queue is None:
            raise SpecError(k, f"override of {self.port} sets neither rate_mbps nor queue (it would change nothing)")
        if self.rate_mbps is not None:
            try:  # the range of a link's rate, with its reasons (LinkSpec's checks, not a copy of them)
                _set(self, "rate_mbps", LinkSpec(self.rate_mbps).rate_mbps)
            except SpecError as e:
                raise e.rebased(LinkSpec.KIND, k) from None
        if self.queue is not None and not isinstance(self.queue, QueueSpec):
            raise SpecError(f"{k}.queue", f"must be a QueueSpec (got {_got(self.queue)})")

    @property
    def node(self) -> str:
        return self.port.split(":")[0]

    @property
    def ifname(self) -> str:
        return self.port.split(":")[1]


def validate_port_overrides(overrides: Any, path: str = "ports") -> tuple[PortOverride, ...]:
    """A spec's ``ports``: a list of :class:`PortOverride`, no port twice. Whether the ports exist is checked
    against the topology's links (:func:`apply_port_overrides`)."""
    if isinstance(overrides, (str, bytes, Mapping)) or not isinstance(overrides, Iterable):
        raise SpecError(path, f"must be a list of port overrides (got {_got(overrides)})")
    overrides = tuple(overrides)
    first: dict[str, int] = {}
    for i, o in enumerate(overrides):
        if not isinstance(o, PortOverride):
            raise SpecError(f"{path}[{i}]", f"must be a PortOverride (got {_got(o)})")
        if o.port in first:
            raise SpecError(f"{path}[{i}].port", f"port {o.port} is already overridden by {path}[{first[o.port]}] "
                                                 f"(one entry per port)")
        first[o.port] = i
    return overrides


def _unknown_port(port: str, links: tuple[Link, ...]) -> str:
    node = port.split(":")[0]
    ends = [f"{n}:{p}" for l in links for n, p in ((l.a, l.a_port), (l.b, l.b_port))]
    own = [e for e in ends if e.startswith(node + ":")]
    if own:
        more = f", ... ({len(own)} ports)" if len(own) > EXAMPLE_PORTS else ""
        return f"no egress port {port}: {node}'s egress ports are {', '.join(own[:EXAMPLE_PORTS])}{more}"
    half = EXAMPLE_PORTS // 2
    some = list(dict.fromkeys(ends[:half] + ends[-half:]))
    return f"no egress port {port}: no node {node!r} (write NODE:IFNAME, e.g. {', '.join(some)})"


def _override_end(base: PortSpec, link: LinkSpec, o: PortOverride, classes: tuple[ClassSpec, ...],
                  path: str) -> PortSpec:
    """The PortSpec of one overridden egress: ``o.queue`` (if set) resolved as its tier's queue was, checked to hold
    one frame of ``link`` and to suit every lossless class; ``o.rate_mbps`` as the port's own rate."""
    if o.queue is None:
        return replace(base, rate_mbps=o.rate_mbps)
    qpath = f"{path}.queue"
    try:
        port = resolve_port(base.tier, o.queue, classes, queue_path=qpath, frame_bytes=link.frame_bytes)
    except SpecError as e:
        if e.path.startswith(qpath):
            raise
        # a class check failed: the override's queue is what does not suit that class
        i = int(e.path.split("[")[1].split("]")[0])
        raise SpecError(qpath, f"does not suit lossless class {classes[i].name!r} ({e.path}): {e.message}") from None
    return replace(port, rate_mbps=o.rate_mbps)


def apply_port_overrides(links: Iterable[Link], overrides: tuple[PortOverride, ...],
                         classes: tuple[ClassSpec, ...] = (), path: str = "ports") -> tuple[Link, ...]:
    """``links`` with the egress of every overridden port replaced (:func:`_override_end`). ``classes``: the
    spec's class set as written (a class without its own queue uses the overridden queue)."""
    links = tuple(links)
    by_end: dict[tuple[str, str], tuple[int, PortOverride]] = {}
    ends = {(n, p) for l in links for n, p in ((l.a, l.a_port), (l.b, l.b_port))}
    for i, o in enumerate(overrides):
        if (o.node, o.ifname) not in ends:
            raise SpecError(f"{path}[{i}].port", _unknown_port(o.port, links))
        by_end[(o.node, o.ifname)] = (i, o)
    out = []
    for l in links:
        a, b = by_end.get((l.a, l.a_port)), by_end.get((l.b, l.b_port))
        if a is None and b is None:
            out.append(l)
            continue
        a_egress = _override_end(l.a_egress, l.spec, a[1], classes, f"{path}[{a[0]}]") if a else l.a_egress
        b_egress = _override_end(l.b_egress, l.spec, b[1], classes, f"{path}[{b[0]}]") if b else l.b_egress
        out.append(replace(l, a_egress=a_egress, b_egress=b_egress))
    return tuple(out)


__all__ = ["PortOverride", "apply_port_overrides", "parse_port_name", "validate_port_overrides"]
