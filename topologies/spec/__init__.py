"""Pure topology specifications: frozen, validated dataclasses. No kernel access.

Every spec validates itself in ``__post_init__`` and raises :class:`SpecError` with a one-line message that names
the field, e.g. ``link.rate_mbps: must be > 0 (got -5)``. Units are part of the field names (``_mbps``, ``_ms``,
``_bytes``, ``_packets``, ``_percent``).

The records a fabric builder consumes (:class:`Node`, :class:`Link`, :class:`PortSpec`, :class:`Interface`,
:class:`Route`, :class:`Hop`) also live here; the :class:`~topologies.topology.Topology` base shared by every
topology is in topology.py (above addressing and routing, which it uses), so the builder treats leaf-spine and
dumbbell fabrics the same way.

One module per kind: ``base`` (limits, :class:`SpecError`, validators), ``queue``, ``classes``, ``link`` (links and
host TCP), ``records`` (what a builder consumes). Import from ``topologies.spec``.
"""

from .base import (CONGESTION_CONTROLS, DISCIPLINES, ETH_HEADER_BYTES, HOST_IFNAME, IFNAMSIZ, LOAD_BALANCING_MODES,
                   MAX_IFNAME_LEN, MAX_RATE_MBPS, MIN_RATE_MBPS, ROLES, SpecError, root_ifname, validate_ifname,
                   validate_node_name, validate_prefix)
from .classes import ClassSpec, validate_classes
from .link import HostTcpSpec, LinkSpec, load_balancing_sysctls
from .queue import QueueSpec
from .records import (EgressPort, Hop, Interface, Link, NextHop, Node, PortSpec, Route, check_graph, resolve_port,
                      spec_dict)

__all__ = [
    "SpecError", "QueueSpec", "ClassSpec", "LinkSpec", "HostTcpSpec", "PortSpec", "Node", "Link", "EgressPort",
    "Interface", "NextHop", "Route", "Hop", "validate_ifname", "validate_node_name", "validate_prefix",
    "validate_classes", "resolve_port", "check_graph", "load_balancing_sysctls", "root_ifname", "spec_dict",
    "DISCIPLINES", "CONGESTION_CONTROLS", "LOAD_BALANCING_MODES", "ROLES", "IFNAMSIZ", "MAX_IFNAME_LEN",
    "MAX_RATE_MBPS", "MIN_RATE_MBPS", "HOST_IFNAME", "ETH_HEADER_BYTES",
]
