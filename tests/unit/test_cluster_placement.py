"""Splitting a fabric over servers (testbed.network.cluster.place, on Mininet's SwitchBinPlacer): a leaf and its hosts
share
a server, spines are spread, only leaf-spine links cross, and a split that cannot be made is refused. Pure logic."""

from __future__ import annotations

import pytest

from testbed.network.cluster import place
from testbed.errors import UsageError
from topologies.mininet_topo import LeafSpineTopo, spec_from_topo


def spec(spines, leaves, hosts_per_leaf):
    return spec_from_topo(LeafSpineTopo(spines=spines, leaves=leaves, hosts_per_leaf=hosts_per_leaf))


def test_each_leaf_goes_with_its_hosts_and_only_leaf_spine_links_cross():
    t = spec(2, 4, 2)
    p = place(t, 2)
    assert p.servers == ("server-1", "server-2")
    for l in t.links:
        if "h" in (l.a[0], l.b[0]):  # a host link never crosses
            assert p.server_of[l.a] == p.server_of[l.b], l
    leaves = {n: p.server_of[n] for n in ("leaf1", "leaf2", "leaf3", "leaf4")}
    assert sorted(leaves.values()) == ["server-1", "server-1", "server-2", "server-2"], leaves
    assert p.server_of["spine1"] != p.server_of["spine2"]
    crossing = [(t.links[i].a, t.links[i].b) for i in p.crossing]
    assert len(crossing) == 4 and all({a[:4], b[:4]} == {"leaf", "spin"} for a, b in crossing), crossing
    assert place(t, 1).crossing == () and set(place(t, 1).server_of.values()) == {"server-1"}


def test_three_servers_take_even_bins_of_switches():
    p = place(spec(3, 3, 1), 3)
    assert sorted(p.nodes_on("server-2")) == ["h2", "leaf2", "spine2"]


@pytest.mark.parametrize("servers, message", [(5, "servers=5: the fabric has only 4 switches"),
                                              (0, "servers must be an integer 1..16"),
                                              (True, "servers must be an integer 1..16")])
def test_a_split_that_cannot_be_made_is_one_line(servers, message):
    with pytest.raises(UsageError, match=message):
        place(spec(2, 2, 2), servers)
