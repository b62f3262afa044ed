"""Whether a server's NIC carries its share's tunnels and whether it merges them (testbed.network.servernic): the
MTU each server needs from the placement, the one-line refusals and the GRO caveat. Pure logic."""

from __future__ import annotations

from types import SimpleNamespace

from testbed.network import servernic, share
from topologies.leafspine import uniform_leaf_spine

SERVERS = [("rack1", "10.0.0.1", 9000), ("rack2", "10.0.0.2", 9000), ("rack3", "10.0.0.3", 9000)]
NIC = {"ifname": "eth0", "mtu": 1500, "prefixlen": 24,
       "gro": {"rx-gro": False, "rx-gro-hw": False, "rx-gro-list": False, "rx-udp-gro-forwarding": True}}


def test_each_server_needs_its_largest_crossing_link_plus_vxlan_and_a_server_without_one_needs_none():
    topo = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
    p = share.plan(topo, SERVERS[:2])
    need = servernic.needed_mtu(topo, p)
    assert {s: m for s, (m, _) in need.items()} == {"rack1": 1500, "rack2": 1500}
    one = share.plan(topo, SERVERS[:1])
    assert servernic.needed_mtu(topo, one) == {}


def test_the_largest_crossing_link_sets_the_need_and_names_itself():
    def link(a, b, mtu):
        return SimpleNamespace(a=a, a_port=b, b=b, b_port=a, spec=SimpleNamespace(mtu=mtu))
    topo = SimpleNamespace(links=[link("x", "y", 1500), link("x", "z", 9000), link("y", "z", 1400)])
    placement = SimpleNamespace(crossing=(0, 1), server_of={"x": "s1", "y": "s2", "z": "s3"})
    assert servernic.needed_mtu(topo, placement) == {"s1": (9050, "x:z-z:x"), "s2": (1550, "x:y-y:x"),
                                                     "s3": (9050, "x:z-z:x")}


def test_an_address_on_no_interface_is_refused_naming_what_is_there():
    found = {"ifname": None, "others": ["10.0.0.7/24 on eth0", "127.0.0.1/8 on lo"]}
    line = servernic.problem("rack2", "10.0.0.2", found, 1500, "x", ns="tb-ab-nic2")
    assert line.startswith("server rack2: address 10.0.0.2") and "namespace tb-ab-nic2" in line
    assert "10.0.0.7/24 on eth0" in line and "\n" not in line
    assert "found: none" in servernic.problem("rack2", "10.0.0.2", {"ifname": None, "others": []}, None, "")


def test_an_mtu_below_the_need_is_refused_and_equal_passes():
    assert servernic.problem("rack2", "10.0.0.2", NIC, 1500, "links") is None
    assert servernic.problem("rack2", "10.0.0.2", NIC, None, "") is None          # no crossing link: address only
    line = servernic.problem("rack2", "10.0.0.2", NIC, 1550, "the crossing link a:p1-b:p1 (MTU 1500 + VXLAN's 50)")
    assert "on eth0 with MTU 1500, but the crossing link a:p1-b:p1 (MTU 1500 + VXLAN's 50) needs 1550" in line


def test_gro_is_a_caveat_only_where_it_merges_crossing_frames():
    assert not servernic.gro_on(NIC)                            # UDP GRO forwarding alone merges no tunnel frames
    assert servernic.gro_caveat("rack2", NIC, True) is None
    on = {**NIC, "gro": {**NIC["gro"], "rx-gro": True}}
    assert servernic.gro_on(on)
    assert servernic.gro_caveat("rack2", on, False) is None     # receives no crossing traffic
    line = servernic.gro_caveat("rack2", on, True)
    assert line.startswith("server rack2: GRO is on on eth0 (rx-gro)") and "64 KB" in line
    assert servernic.gro_on({**NIC, "gro": {"rx-gro-hw": True}})
    assert not servernic.gro_on({"ifname": "eth0", "mtu": 1500})   # an agent that did not report it
