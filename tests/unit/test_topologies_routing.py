"""Address plan and static routes (topologies/addressing.py, routing.py)."""

import ipaddress
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topologies import (DumbbellSpec, HostTcpSpec, LeafSpineSpec, LinkSpec, SpecError, check_reachability,
                        compute_routes, path_links, ports_on_paths)
from topologies.addressing import BENCHMARK_NET, FABRIC_NET, fabric_pair, host_subnet, mac_address


def leafspine(spines=2, leaves=3, hosts_per_leaf=3, **kw):
    return LeafSpineSpec(spines=spines, leaves=leaves, hosts_per_leaf=hosts_per_leaf, host_link=LinkSpec(1000),
                         fabric_link=LinkSpec(1000), **kw)


def dumbbell(**kw):
    return DumbbellSpec(**{"senders": 3, "sender_link": LinkSpec(1000), "bottleneck_link": LinkSpec(100), **kw})


TOPOS = [leafspine(), leafspine(spines=4, leaves=2, hosts_per_leaf=1), leafspine(spines=1, leaves=1),
         dumbbell(), dumbbell(receivers=2)]


# ---- addresses --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", TOPOS)
def test_every_interface_addressed_once_and_unique(t):
    ports = {(p.node, p.ifname) for p in t.egress_ports()}
    assert set(t.addresses) == ports
    gw = {f"198.18.{n}.254" for n in range(1, 256)}
    ips = [i.ip for i in t.addresses.values() if i.ip not in gw]
    assert len(ips) == len(set(ips))
    macs = [i.mac for i in t.addresses.values()]
    assert len(macs) == len(set(macs))


@pytest.mark.parametrize("t", TOPOS)
def test_only_benchmark_range(t):
    for itf in t.addresses.values():
        ip = ipaddress.IPv4Address(itf.ip)
        assert ip in BENCHMARK_NET
        assert ip not in ipaddress.IPv4Network("10.0.0.0/8")
        if itf.prefixlen == 31:
            assert ip in FABRIC_NET


@pytest.mark.parametrize("t", TOPOS)
def test_macs_locally_administered_unicast(t):
    for itf in t.addresses.values():
        first = int(itf.mac.split(":")[0], 16)
        assert first & 0x02 and not first & 0x01


def test_leafspine_address_plan():
    t = leafspine()
    a = t.addresses
    assert a[("h1", "eth0")].cidr == "198.18.1.1/32"
    assert a[("h4", "eth0")].cidr == "198.18.2.1/32"
    assert a[("h9", "eth0")].cidr == "198.18.3.3/32"
    assert a[("leaf2", "h5")].cidr == "198.18.2.254/32"
    assert a[("leaf1", "spine1")].cidr == "198.19.0.0/31" and a[("spine1", "leaf1")].cidr == "198.19.0.1/31"
    assert a[("leaf3", "spine2")].ip == "198.19.0.10"
    assert t.host_ip("h5") == "198.18.2.2"
    assert dict(t.address_plan.subnets) == {"leaf1": "198.18.1.0/24", "leaf2": "198.18.2.0/24",
                                            "leaf3": "198.18.3.0/24"}
    # both ends of a /31 share the network
    for l in t.links:
        x, y = a[(l.a, l.a_port)], a[(l.b, l.b_port)]
        if x.prefixlen == 31:
            assert ipaddress.IPv4Interface(x.cidr).network == ipaddress.IPv4Interface(y.cidr).network


def test_macs_are_deterministic():
    assert leafspine().addresses == leafspine().addresses
    assert mac_address("leaf", 0x0102, 0x0304) == "02:02:01:02:03:04"


def test_plan_limits():
    assert host_subnet(255) == "198.18.255.0/24"
    with pytest.raises(SpecError):
        host_subnet(256)
    assert fabric_pair(32767) == ("198.19.255.254", "198.19.255.255")
    with pytest.raises(SpecError, match="exceed the 198.19.0.0/16"):
        fabric_pair(32768)
    with pytest.raises(SpecError, match="spines: 255 x 255 fabric links exceed"):
        LeafSpineSpec(spines=255, leaves=255, hosts_per_leaf=1, host_link=LinkSpec(1), fabric_link=LinkSpec(1))


def test_dumbbell_address_plan():
    d = dumbbell(receivers=2)
    assert d.host_ip("h3") == "198.18.1.3" and d.host_ip("r2") == "198.18.2.2"
    assert d.addresses[("s1", "s2")].cidr == "198.19.0.0/31"
    assert d.addresses[("s2", "s1")].cidr == "198.19.0.1/31"


# ---- routes -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", TOPOS)
def test_every_host_reaches_every_other_host(t):
    check_reachability(t)
    for s, d in itertools.permutations([h.name for h in t.hosts], 2):
        paths = path_links(t, s, d)
        assert paths
        for p in paths:
            assert p[0].node == s and p[0].port == "eth0" and p[-1].peer == d
            for x, y in zip(p, p[1:]):
                assert x.peer == y.node


@pytest.mark.parametrize("spines", [1, 2, 4, 7])
def test_ecmp_nexthops_equal_spines(spines):
    t = leafspine(spines=spines, leaves=3, hosts_per_leaf=2)
    plan = t.address_plan
    for leaf in ("leaf1", "leaf2", "leaf3"):
        remote = [r for r in t.routes_of(leaf) if r.dst.endswith("/24")]
        assert sorted(r.dst for r in remote) == sorted(s for l, s in plan.subnets.items() if l != leaf)
        for r in remote:
            assert len(r.nexthops) == spines
            assert {nh.ifname for nh in r.nexthops} == {f"spine{i}" for i in range(1, spines + 1)}
            for nh in r.nexthops:
                peer = t.addresses[(f"spine{nh.ifname[5:]}", leaf)]
                assert nh.gateway == peer.ip
            assert r.ecmp == (spines > 1)
    assert len(path_links(t, "h1", "h6")) == spines
    assert len(path_links(t, "h1", "h2")) == 1


def test_route_shapes():
    t = leafspine(tcp=HostTcpSpec(rto_min_ms=5))
    routes = compute_routes(t)
    assert tuple(routes) == t.routes
    h = t.routes_of("h4")
    assert len(h) == 1 and h[0].dst == "0.0.0.0/0" and h[0].onlink and h[0].rto_min_ms == 5
    assert h[0].nexthops == (("eth0", "198.18.2.254"),)
    leaf = t.routes_of("leaf2")
    local = [r for r in leaf if r.dst.endswith("/32")]
    assert [(r.dst, r.nexthops[0]) for r in local] == [("198.18.2.1/32", ("h4", None)),
                                                      ("198.18.2.2/32", ("h5", None)),
                                                      ("198.18.2.3/32", ("h6", None))]
    assert all(r.rto_min_ms is None for r in leaf)
    for s in ("spine1", "spine2"):
        sr = t.routes_of(s)
        assert len(sr) == 3 and all(len(r.nexthops) == 1 for r in sr)
        assert {r.nexthops[0].ifname for r in sr} == {"leaf1", "leaf2", "leaf3"}


def test_path_links_names_queues():
    t = leafspine(spines=2, leaves=2, hosts_per_leaf=1)
    paths = path_links(t, "h1", "h2")
    assert ports_on_paths(paths) == {("h1", "eth0"), ("leaf1", "spine1"), ("leaf1", "spine2"),
                                     ("spine1", "leaf2"), ("spine2", "leaf2"), ("leaf2", "h2")}
    assert path_links(t, "h1", "h1") == {()}
    with pytest.raises(ValueError):
        path_links(t, "h1", "leaf1")


def test_dumbbell_paths_cross_bottleneck():
    d = dumbbell()
    (p,) = path_links(d, "h2", "r1")
    assert [(x.node, x.port) for x in p] == [("h2", "eth0"), ("s1", "s2"), ("s2", "r1")]
    (back,) = path_links(d, "r1", "h2")
    assert [(x.node, x.port) for x in back] == [("r1", "eth0"), ("s2", "s1"), ("s1", "h2")]


@settings(max_examples=25, deadline=None)
@given(spines=st.integers(1, 4), leaves=st.integers(1, 4), hpl=st.integers(1, 3))
def test_random_leafspine_reachable_and_unique(spines, leaves, hpl):
    t = leafspine(spines=spines, leaves=leaves, hosts_per_leaf=hpl)
    check_reachability(t)
    host_ips = [t.host_ip(h.name) for h in t.hosts]
    assert len(set(host_ips)) == len(host_ips) == leaves * hpl
    fabric = [i.ip for i in t.addresses.values() if i.prefixlen == 31]
    assert len(set(fabric)) == len(fabric) == 2 * spines * leaves
    if leaves > 1:
        assert len(path_links(t, "h1", f"h{leaves * hpl}")) == spines
