"""A server's share of a fabric over machines (testbed.network.share): the placement with the servers file's names,
the MTU refusal before anything is built, the description's round trip and the run's VNI block. Pure logic."""

from __future__ import annotations

import json

import pytest

from testbed.errors import UsageError
from testbed.network import share
from topologies.leafspine import uniform_leaf_spine

SERVERS = [("rack1", "10.0.0.1", 1500), ("rack2", "10.0.0.2", 1500)]


def test_one_leaf_and_its_hosts_per_server_and_only_leaf_spine_links_cross():
    topo = uniform_leaf_spine(2, 2, 2, 20, 20, mtu=1450)
    p = share.plan(topo, SERVERS)
    assert p.servers == ("rack1", "rack2")
    assert sorted(p.nodes_on("rack2")) == ["h3", "h4", "leaf2", "spine2"]
    crossing = {(topo.links[i].a, topo.links[i].b) for i in p.crossing}
    assert crossing == {("leaf1", "spine2"), ("leaf2", "spine1")}


def test_a_crossing_link_too_big_for_vxlan_over_the_nics_is_refused_with_one_line():
    topo = uniform_leaf_spine(2, 2, 1, 20, 20)          # MTU 1500: 1550-byte VXLAN frames over 1500-byte NICs
    with pytest.raises(UsageError, match=r"crosses servers with MTU 1500.*VXLAN leaves 1450"):
        share.plan(topo, SERVERS)
    share.plan(topo, [("a", "10.0.0.1", 9000), ("b", "10.0.0.2", 9000)])     # jumbo NICs carry it
    with pytest.raises(UsageError, match="distinct names"):
        share.plan(topo, [("a", "10.0.0.1", 9000), ("a", "10.0.0.2", 9000)])


def test_the_description_survives_json_and_rebuilds_the_same_share():
    topo = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
    p = share.plan(topo, SERVERS)
    under = {"rack1": "10.0.0.1", "rack2": "10.0.0.2"}
    d = json.loads(json.dumps(share.describe(topo, "ab12", p, "rack2", under, share.vni_base("ab12"))))
    topo2, run_id, sh = share.from_description(d, underlay_ns="tb-x-nic")
    assert topo2 == topo and run_id == "ab12"
    assert (sh.server, sh.placement, sh.underlay, sh.underlay_ns) == ("rack2", p, under, "tb-x-nic")
    with pytest.raises(ValueError, match="which its placement does not name"):
        share.from_description({**d, "server": "rack9"})   # an empty share would have been built and reported
    d["server_of"].pop("h1")
    with pytest.raises(ValueError, match="exactly the topology's nodes"):
        share.from_description(d)
    with pytest.raises(UsageError, match="no server"):
        share.describe(topo, "ab12", p, "rack9", under, 0)


def test_each_run_has_its_own_vni_block_inside_24_bits():
    bases = {share.vni_base(f"{i:04x}") for i in range(200)}
    assert len(bases) > 190
    for b in bases:
        assert b % share.VNI_BLOCK == 0 and share.VNI_BLOCK <= b and b + share.VNI_BLOCK < (1 << 24) - 1


def test_a_balancer_the_shares_cannot_build_is_refused_before_any_description_is_sent():
    import dataclasses

    topo = dataclasses.replace(uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450), load_balancing="spray")
    with pytest.raises(UsageError, match="load_balancing=spray is not built over servers"):
        share.plan(topo, SERVERS)
