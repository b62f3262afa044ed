"""Mininet ``Topo`` classes for the testbed's topologies, and any user-written ``Topo`` turned into a spec.

    from topologies.mininet_topo import LeafSpineTopo
    topo = LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=40)
    topo.spec            # the validated LeafSpineSpec the fabric is built from

* :class:`SpecTopo` wraps a validated spec (:class:`~topologies.LeafSpineSpec`, :class:`~topologies.DumbbellSpec`
  or :class:`GraphSpec`): hosts are Mininet hosts, leaves/spines/switches are Mininet *switches* (in the testbed
  they are L3 routers: forwarding, static routes, ECMP), and every link carries the spec's port names.
* :func:`spec_from_topo` reads a Mininet ``Topo`` written the usual way (``addHost``, ``addSwitch``,
  ``addLink(a, b, **opts)``) into a :class:`GraphSpec`. Link options: ``rate_mbps`` (or Mininet's ``bw``, Mbit/s),
  ``delay_ms`` (or ``delay='5ms'``), ``jitter_ms``, ``loss_percent`` (or ``loss``), ``mtu``, ``queue`` (a
  :class:`~topologies.QueueSpec` on both ends' egress; ``queue1``/``queue2`` for one end; Mininet's
  ``max_queue_size`` in packets gives a drop-tail queue). Switches become routers with the usual address plan
  (hosts attach by one link to a switch).
* ``topos`` lets ``mn --custom topologies/mininet_topo.py --topo leafspine,2,2,2`` build the same shapes (with
  Mininet's own switches: see docs/mininet.md for what that gives up).

Pure: imports Mininet's ``Topo`` and the spec modules, never the testbed's kernel side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from mininet.topo import Topo

from .dumbbell import DumbbellSpec
from .leafspine import DEFAULT_QUEUE, uniform_leaf_spine
from .spec import HostTcpSpec, Link, LinkSpec, Node, QueueSpec, SpecError, resolve_port, spec_dict
from .topology import Topology

#: the default link of a user-written Topo that names no rate (Mininet's links are unshaped; the testbed shapes
#: every port, so an unnamed rate gets this one)
DEFAULT_RATE_MBPS = 100.0
_DELAY_RE = re.compile(r"^\s*([0-9.]+)\s*(us|ms|s)?\s*$")
_LINK_OPTS = {"rate_mbps", "bw", "delay_ms", "delay", "jitter_ms", "jitter", "loss_percent", "loss", "mtu", "queue",
              "queue1", "queue2", "max_queue_size", "intfName1", "intfName2", "port1", "port2", "node1", "node2",
              "key", "use_htb", "cls"}


@dataclass(frozen=True)
class GraphSpec(Topology):
    """A topology given as an explicit graph (from a user-written Mininet ``Topo``): nodes with roles host|switch,
    links with their :class:`LinkSpec` and each end's resolved port."""

    graph_nodes: tuple[Node, ...] = ()
    graph_links: tuple[Link, ...] = ()
    tcp: HostTcpSpec = field(default_factory=HostTcpSpec)
    load_balancing: str = "ecmp"
    seed: int = 0
    prefix: str = "tb"
    name: str = "graph"

    kind: ClassVar[str] = "graph"

    def _build(self):
        return self.graph_nodes, self.graph_links

    def warnings(self) -> list[str]:
        return []

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "prefix": self.prefix, "nodes": len(self.nodes),
                "hosts": len(self.hosts), "links": [{"a": f"{l.a}:{l.a_port}", "b": f"{l.b}:{l.b_port}",
                                                     "link": spec_dict(l.spec),
                                                     "a_queue": spec_dict(l.a_egress.queue),
                                                     "b_queue": spec_dict(l.b_egress.queue)}
                                                    for l in self.links],
                "load_balancing": self.load_balancing, "tcp": spec_dict(self.tcp), "seed": self.seed,
                "host_subnets": dict(self.address_plan.subnets)}


class SpecTopo(Topo):
    """A Mininet ``Topo`` made from a validated testbed spec: what ``Mininet(topo=...)`` and ``net['h1']`` see."""

    def build(self, spec: Topology) -> None:  # type: ignore[override]
        self.spec = spec
        for n in spec.nodes:
            if n.is_host:
                self.addHost(n.name, role=n.role)
            else:
                self.addSwitch(n.name, role=n.role)
        for l in spec.links:
            self.addLink(l.a, l.b, intfName1=l.a_port, intfName2=l.b_port)


class LeafSpineTopo(SpecTopo):
    """A leaf-spine fabric: ``LeafSpineTopo(spines, leaves, hosts_per_leaf, host_rate_mbps=..., ...)``; any other
    keyword is a :class:`~topologies.uniform_leaf_spine` one (queues, classes, tcp, load_balancing, seed); a
    ``host_link``/``fabric_link`` given whole replaces the rate's."""

    def __init__(self, spines: int = 2, leaves: int = 2, hosts_per_leaf: int = 2, host_rate_mbps: float = 20,
                 fabric_rate_mbps: float = 40, **spec: Any):
        links = {k: spec.pop(k) for k in ("host_link", "fabric_link") if k in spec}
        topo = uniform_leaf_spine(int(spines), int(leaves), int(hosts_per_leaf), float(host_rate_mbps),
                                  float(fabric_rate_mbps), **spec)
        super().__init__(replace(topo, **links) if links else topo)


class DumbbellTopo(SpecTopo):
    """A dumbbell: ``senders`` hosts -> s1 -> bottleneck -> s2 -> ``receivers`` hosts."""

    def __init__(self, senders: int = 2, receivers: int = 1, host_rate_mbps: float = 20,
                 bottleneck_rate_mbps: float = 10, **spec: Any):
        spec.setdefault("sender_link", LinkSpec(rate_mbps=float(host_rate_mbps)))
        spec.setdefault("bottleneck_link", LinkSpec(rate_mbps=float(bottleneck_rate_mbps)))
        super().__init__(DumbbellSpec(senders=int(senders), receivers=int(receivers), **spec))


def _delay_ms(path: str, value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    m = _DELAY_RE.match(str(value))
    if not m:
        raise SpecError(path, f"not a delay like '5ms' (got {value!r})")
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3, None: 1.0}[m.group(2)]
    return float(m.group(1)) * scale


def _link_spec(path: str, opts: dict) -> LinkSpec:
    unknown = sorted(set(opts) - _LINK_OPTS)
    if unknown:
        raise SpecError(path, f"unknown link option(s) {', '.join(unknown)} (known: rate_mbps/bw, delay_ms/delay, "
                              "jitter_ms, loss_percent/loss, mtu, queue, queue1, queue2, max_queue_size)")
    rate = opts.get("rate_mbps", opts.get("bw", DEFAULT_RATE_MBPS))
    return LinkSpec(rate_mbps=float(rate),
                    delay_ms=_delay_ms(f"{path}.delay", opts.get("delay_ms", opts.get("delay", 0.0))),
                    jitter_ms=_delay_ms(f"{path}.jitter", opts.get("jitter_ms", opts.get("jitter", 0.0))),
                    loss_percent=float(opts.get("loss_percent", opts.get("loss", 0.0))),
                    mtu=int(opts.get("mtu", 1500)))


def _queue(opts: dict, end: str) -> QueueSpec:
    q = opts.get(f"queue{end}", opts.get("queue"))
    if q is None and opts.get("max_queue_size") is not None:
        q = QueueSpec(buffer_packets=int(opts["max_queue_size"]))
    return q if q is not None else DEFAULT_QUEUE


def spec_from_topo(topo: Topo, tcp: HostTcpSpec | None = None, seed: int | None = None,
                   load_balancing: str | None = None, prefix: str = "tb") -> Topology:
    """The spec of a Mininet ``Topo``: a :class:`SpecTopo` gives its own; any other becomes a :class:`GraphSpec`
    (see the module docstring). The hosts' TCP settings, the seed and the load balancing come from the arguments,
    else from the Topo's attributes ``tcp`` (a :class:`HostTcpSpec`), ``seed``, ``load_balancing``. SpecError (one
    line, naming the link) on what the testbed cannot build."""
    if isinstance(topo, SpecTopo):
        return topo.spec
    tcp = tcp or getattr(topo, "tcp", None)
    seed = seed if seed is not None else getattr(topo, "seed", 0)
    load_balancing = load_balancing or getattr(topo, "load_balancing", "ecmp")
    nodes = []
    for name in topo.nodes():
        info = topo.nodeInfo(name)
        role = "switch" if topo.isSwitch(name) else "host"
        nodes.append(Node(name, info.get("role", role), f"{prefix}-{name}"))
    links = []
    for i, (a, b, info) in enumerate(topo.links(sort=False, withInfo=True)):
        path = f"links[{i}] ({a}-{b})"
        opts = {k: v for k, v in info.items() if k not in ("node1", "node2")}
        spec = _link_spec(path, opts)
        a_port = info.get("intfName1") or f"{a}-eth{info.get('port1', 0)}"
        b_port = info.get("intfName2") or f"{b}-eth{info.get('port2', 0)}"
        ports = [resolve_port("port", _queue(opts, end), (), queue_path=f"{path}.queue{end}",
                              frame_bytes=spec.frame_bytes) for end in ("1", "2")]
        links.append(Link(a, a_port, b, b_port, spec, ports[0], ports[1]))
    return GraphSpec(graph_nodes=tuple(nodes), graph_links=tuple(links), tcp=tcp or HostTcpSpec(), seed=seed,
                     load_balancing=load_balancing, prefix=prefix, name=type(topo).__name__)


#: for ``mn --custom topologies/mininet_topo.py --topo leafspine,2,2,2``
topos = {"leafspine": LeafSpineTopo, "dumbbell": DumbbellTopo}

__all__ = ["DumbbellTopo", "GraphSpec", "LeafSpineTopo", "SpecTopo", "spec_from_topo", "topos"]
