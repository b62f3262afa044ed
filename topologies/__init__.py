"""Pure topology specs for the testbed: validation, address plan, static routes. No kernel access.

    from topologies import LeafSpineSpec, LinkSpec, QueueSpec
    topo = LeafSpineSpec(spines=2, leaves=4, hosts_per_leaf=4,
                         host_link=LinkSpec(rate_mbps=1000), fabric_link=LinkSpec(rate_mbps=1000))
    topo.nodes, topo.links, topo.addresses, topo.routes

See docs/topologies.md.
"""

from .addressing import AddressPlan, plan_addresses
from .dumbbell import DumbbellSpec
from .leafspine import DEFAULT_QUEUE, LeafSpineSpec, uniform_leaf_spine
from .load import dumps_toml, from_dict, load_topology, loads_toml, loads_yaml, to_dict
from .overrides import PortOverride
from .routing import RoutingError, check_reachability, compute_routes, path_links, ports_on_paths
from .spec import (ClassSpec, EgressPort, Hop, HostTcpSpec, Interface, Link, LinkSpec, NextHop, Node, PortSpec,
                   QueueSpec, Route, SpecError, load_balancing_sysctls, root_ifname, validate_ifname)
from .topology import Topology

__all__ = [
    "AddressPlan", "ClassSpec", "DEFAULT_QUEUE", "DumbbellSpec", "EgressPort", "Hop", "HostTcpSpec", "Interface",
    "LeafSpineSpec", "Link", "LinkSpec", "NextHop", "Node", "PortOverride", "PortSpec", "QueueSpec", "Route",
    "RoutingError", "SpecError", "Topology", "check_reachability", "compute_routes", "dumps_toml", "from_dict",
    "load_balancing_sysctls", "load_topology", "loads_toml", "loads_yaml", "path_links", "plan_addresses",
    "ports_on_paths", "root_ifname", "to_dict", "uniform_leaf_spine", "validate_ifname",
]
