"""Validation rules of the topology specs (topologies/spec/, leafspine.py, dumbbell.py)."""

import re

import pytest

from topologies import (ClassSpec, DumbbellSpec, HostTcpSpec, LeafSpineSpec, Link, LinkSpec, PortSpec, QueueSpec,
                        SpecError, root_ifname, validate_ifname)
from topologies.spec import load_balancing_sysctls

Q = QueueSpec("droptail", buffer_bytes=100_000)
PORT = PortSpec("host_nic", Q)


def leafspine(**kw):
    base = dict(spines=2, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(1000), fabric_link=LinkSpec(1000))
    base.update(kw)
    return LeafSpineSpec(**base)


def raises(match):
    return pytest.raises(SpecError, match=re.escape(match))


# ---- SpecError --------------------------------------------------------------------------------------------------


def test_spec_error_is_value_error_with_path_and_one_line():
    with pytest.raises(ValueError) as ei:
        LinkSpec(rate_mbps=-5)
    e = ei.value
    assert isinstance(e, SpecError)
    assert str(e) == "link.rate_mbps: must be > 0 (got -5)"
    assert e.path == "link.rate_mbps"
    assert "\n" not in str(e)


def test_spec_error_rebased():
    e = SpecError("link.rate_mbps", "must be > 0 (got -5)")
    assert str(e.rebased("link", "fabric_link")) == "fabric_link.rate_mbps: must be > 0 (got -5)"
    assert SpecError("class.xon_bytes", "x").rebased("class", "classes[1]").path == "classes[1].xon_bytes"
    assert e.rebased("class", "classes[1]").path == "link.rate_mbps"  # not ours to rename
    assert SpecError("hosts_per_leaf", "x").rebased("", "").path == "hosts_per_leaf"


# ---- LinkSpec ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, msg", [
    (dict(rate_mbps=-5), "link.rate_mbps: must be > 0 (got -5)"),
    (dict(rate_mbps=0), "link.rate_mbps: must be > 0 (got 0)"),
    (dict(rate_mbps=0.001), "link.rate_mbps: must be >= 0.01"),
    (dict(rate_mbps=200_000), "link.rate_mbps: must be <= 100000 (100 Gbit/s"),
    (dict(rate_mbps="fast"), "link.rate_mbps: must be a number (got 'fast')"),
    (dict(rate_mbps=True), "link.rate_mbps: must be a number (got True)"),
    (dict(rate_mbps=float("nan")), "link.rate_mbps: must be finite"),
    (dict(rate_mbps=100, delay_ms=-1), "link.delay_ms: must be >= 0 (got -1)"),
    (dict(rate_mbps=100, jitter_ms=-1), "link.jitter_ms: must be >= 0 (got -1)"),
    (dict(rate_mbps=100, delay_ms=1, jitter_ms=2), "link.jitter_ms: must be <= delay_ms (got jitter 2 > delay 1)"),
    (dict(rate_mbps=100, loss_percent=101), "link.loss_percent: must be <= 100 (got 101)"),
    (dict(rate_mbps=100, loss_percent=-0.5), "link.loss_percent: must be >= 0 (got -0.5)"),
    (dict(rate_mbps=100, mtu=500), "link.mtu: must be >= 576 (got 500)"),
    (dict(rate_mbps=100, mtu=9001), "link.mtu: must be <= 9000 (got 9001)"),
    (dict(rate_mbps=100, mtu=1500.5), "link.mtu: must be an integer (got 1500.5)"),
])
def test_link_rules(kw, msg):
    with raises(msg):
        LinkSpec(**kw)


def test_link_accepts_high_rates_without_silent_cap():
    l = LinkSpec(rate_mbps=40_000, delay_ms=0.5, jitter_ms=0.5, loss_percent=100, mtu=9000)
    assert l.rate_mbps == 40_000.0 and isinstance(l.rate_mbps, float)
    assert l.rate_bps == 40_000_000_000
    assert l.frame_bytes == 9014
    assert LinkSpec(rate_mbps=100_000).rate_mbps == 100_000


# ---- QueueSpec --------------------------------------------------------------------------------------------------


def test_queue_unknown_discipline_lists_allowed():
    with raises("queue.discipline: unknown discipline 'codel' (allowed: droptail, red, step)"):
        QueueSpec("codel", buffer_bytes=1000)


@pytest.mark.parametrize("kw, msg", [
    (dict(), "queue.buffer_bytes: set exactly one of buffer_bytes or buffer_packets (got neither)"),
    (dict(buffer_bytes=1, buffer_packets=1), "set exactly one of buffer_bytes or buffer_packets (got both)"),
    (dict(buffer_bytes=0), "queue.buffer_bytes: must be >= 1 (got 0)"),
    (dict(buffer_packets=-3), "queue.buffer_packets: must be >= 1 (got -3)"),
    (dict(buffer_bytes=10_000, k_packets=3), "queue.k_packets: only used by discipline 'step'"),
    (dict(buffer_bytes=10_000, min_bytes=3), "queue.min_bytes: only used by discipline 'red'"),
    (dict(buffer_bytes=10_000, ecn=True), "queue.ecn: only used by discipline 'red'"),
])
def test_droptail_rules(kw, msg):
    with raises(msg):
        QueueSpec("droptail", **kw)


def test_droptail_ok_and_units():
    assert QueueSpec(buffer_packets=100).limit_bytes == 150_000
    assert QueueSpec(buffer_packets=100, avpkt_bytes=1000).limit_bytes == 100_000
    q = QueueSpec(buffer_bytes=5000)
    assert q.limit_bytes == 5000 and not q.marks_ecn and not q.drops_early and q.threshold_bytes is None


def red(**kw):
    base = dict(buffer_bytes=200_000, min_bytes=30_000, max_bytes=90_000, probability=0.1)
    base.update(kw)
    return QueueSpec("red", **base)


def test_red_min_must_be_below_max():
    with raises("queue.min_bytes: must be < max_bytes (got min 90000 >= max 90000)"):
        red(min_bytes=90_000)
    with raises("queue.min_bytes: must be < max_bytes (got min 100000 >= max 90000)"):
        red(min_bytes=100_000)


def test_red_max_must_fit_buffer():
    with raises("queue.max_bytes: must be <= the buffer (got max 300000 > buffer 200000 bytes)"):
        red(max_bytes=300_000)
    red(max_bytes=200_000)  # equal is fine


@pytest.mark.parametrize("kw, msg", [
    (dict(probability=0), "queue.probability: must be > 0 (got 0)"),
    (dict(probability=1.5), "queue.probability: must be <= 1 (got 1.5)"),
    (dict(probability=None), "queue.probability: required for discipline 'red'"),
    (dict(min_bytes=None), "queue.min_bytes: required for discipline 'red'"),
    (dict(burst_packets=0), "queue.burst_packets: must be >= 1 (got 0)"),
    (dict(k_bytes=100), "queue.k_bytes: only used by discipline 'step'"),
    (dict(ecn="yes"), "queue.ecn: must be true or false (got 'yes')"),
])
def test_red_rules(kw, msg):
    with raises(msg):
        red(**kw)


def test_red_ecn_flags():
    assert red().drops_early and not red().marks_ecn
    assert red(ecn=True).marks_ecn and not red(ecn=True).drops_early


def test_step_k_must_be_below_buffer():
    with raises("queue.k_packets: K must be < the buffer (got K 100 packets >= buffer 100 packets)"):
        QueueSpec("step", buffer_packets=100, k_packets=100)
    with raises("queue.k_bytes: K must be < the buffer (got K 200000 bytes >= buffer 100000 bytes)"):
        QueueSpec("step", buffer_bytes=100_000, k_bytes=200_000)
    with raises("queue.k_packets: K must be < the buffer (got K 100 packets x 1500 bytes >= buffer 100000 bytes)"):
        QueueSpec("step", buffer_bytes=100_000, k_packets=100)


def test_step_rules_and_threshold():
    with raises("queue.k_packets: discipline 'step' needs exactly one of k_packets or k_bytes (got neither)"):
        QueueSpec("step", buffer_bytes=100_000)
    with raises("(got both)"):
        QueueSpec("step", buffer_bytes=100_000, k_packets=1, k_bytes=1)
    with raises("queue.min_bytes: only used by discipline 'red'"):
        QueueSpec("step", buffer_bytes=100_000, k_bytes=1000, min_bytes=10)
    q = QueueSpec("step", buffer_bytes=300_000, k_packets=65)
    assert q.marks_ecn and not q.drops_early and q.threshold_bytes == 65 * 1500
    assert QueueSpec("step", buffer_packets=100, k_bytes=30_000).threshold_bytes == 30_000


# ---- ClassSpec --------------------------------------------------------------------------------------------------


def lossless(**kw):
    base = dict(name="rdma", dscp={26}, priority=1, lossless=True, pcp=3, xoff_bytes=50_000, xon_bytes=20_000,
                headroom_bytes=30_000)
    base.update(kw)
    return ClassSpec(**base)


def test_xon_must_be_below_xoff():
    with raises("class.xon_bytes: must be < xoff_bytes (got xon 50000 >= xoff 50000)"):
        lossless(xon_bytes=50_000)
    with raises("class.xon_bytes: must be < xoff_bytes (got xon 60000 >= xoff 50000)"):
        lossless(xon_bytes=60_000)


def test_xoff_plus_headroom_must_fit_own_buffer():
    with raises("class.xoff_bytes: xoff_bytes + headroom_bytes must fit the buffer (got 50000 + 30000 = 80000 > "
                "70000 bytes of its own queue)"):
        lossless(queue=QueueSpec(buffer_bytes=70_000))
    lossless(queue=QueueSpec(buffer_bytes=80_000))


def test_lossless_forbids_red_drop_but_allows_red_ecn_and_step():
    with raises("class.lossless: a lossless class cannot use a RED queue without ecn"):
        lossless(queue=red())
    lossless(queue=red(ecn=True))
    lossless(queue=QueueSpec("step", buffer_bytes=200_000, k_bytes=30_000))


@pytest.mark.parametrize("kw, msg", [
    (dict(name="Bad Name"), "class.name: must be 1..15 characters"),
    (dict(dscp={64}), "class.dscp: must be <= 63 (got 64)"),
    (dict(dscp=26), "class.dscp: must be a set of DSCP values"),
    (dict(priority=None), "class.priority: set exactly one of priority (strict) or weight (weighted) (got neither)"),
    (dict(weight=3), "(got both)"),
    (dict(priority=8), "class.priority: must be <= 7 (got 8)"),
    (dict(pcp=None), "class.pcp: a lossless class needs the 802.1p priority"),
    (dict(headroom_bytes=None), "class.headroom_bytes: required for a lossless class"),
    (dict(lossless=False), "class.xoff_bytes: only used by lossless classes"),
])
def test_class_rules(kw, msg):
    with raises(msg):
        lossless(**kw)


def test_weighted_class_and_dscp_normalised():
    c = ClassSpec("bulk", dscp=[0, 8, 8], weight=10, default=True)
    assert c.dscp == frozenset({0, 8}) and c.priority is None
    with raises("class.weight: must be >= 1 (got 0)"):
        ClassSpec("bulk", weight=0)


# ---- HostTcpSpec ------------------------------------------------------------------------------------------------


def test_tcp_rules():
    with raises("tcp.congestion_control: unknown congestion control 'vegas' (allowed: cubic, reno, dctcp, bbr)"):
        HostTcpSpec("vegas")
    with raises("tcp.ecn: dctcp requires ECN (got false)"):
        HostTcpSpec("dctcp", ecn=False)
    with raises("tcp.rto_min_ms: must be >= 1 (got 0)"):
        HostTcpSpec(rto_min_ms=0)
    with raises("tcp.rto_min_ms: must be <= 120000"):
        HostTcpSpec(rto_min_ms=200_000)
    with raises("tcp.tcp_rmem_bytes: must satisfy min <= default <= max"):
        HostTcpSpec(tcp_rmem_bytes=(8192, 4096, 65536))
    with raises("tcp.tcp_wmem_bytes: must be [min, default, max] in bytes"):
        HostTcpSpec(tcp_wmem_bytes=(4096, 8192))
    with raises("tcp.tcp_wmem_bytes: must be >= 4096 (got 100)"):
        HostTcpSpec(tcp_wmem_bytes=(100, 8192, 9000))


def test_tcp_effective_ecn_and_sysctls():
    assert HostTcpSpec("dctcp").effective_ecn
    assert not HostTcpSpec("cubic").effective_ecn
    assert HostTcpSpec("cubic", ecn=True).effective_ecn
    s = HostTcpSpec("dctcp", rto_min_ms=5, tcp_rmem_bytes=[4096, 131072, 6291456]).sysctls()
    assert s == {"net.ipv4.tcp_congestion_control": "dctcp", "net.ipv4.tcp_ecn": "1",
                 "net.ipv4.tcp_rmem": "4096 131072 6291456"}


def test_load_balancing_sysctls():
    assert load_balancing_sysctls("ecmp")["net.ipv4.fib_multipath_hash_policy"] == "1"
    with raises("load_balancing: unknown load-balancing mode 'conga' (allowed: ecmp, spray, flowlet, adaptive)"):
        load_balancing_sysctls("conga")


# ---- interface names --------------------------------------------------------------------------------------------


def test_interface_name_length_limit():
    validate_ifname("x", "a" * 15)
    with raises("link.a_port: interface name 'abcdefghijklmnop' is 16 characters; Linux allows at most 15"):
        Link("h1", "abcdefghijklmnop", "leaf1", "h1", LinkSpec(100), PORT, PORT)
    with raises("link.b_port: interface name 'a:b' is not valid"):
        Link("h1", "eth0", "leaf1", "a:b", LinkSpec(100), PORT, PORT)
    with raises("interface name must be a non-empty string"):
        validate_ifname("x", "")


def test_generated_interface_names_fit_ifnamsiz():
    t = LeafSpineSpec(spines=255, leaves=128, hosts_per_leaf=253, host_link=LinkSpec(100),
                      fabric_link=LinkSpec(100))
    # names are generated without building the graph: check the longest ones directly
    assert len(t.host_name(128, 253)) <= 15
    assert len(f"spine{t.spines}") <= 15 and len(f"leaf{t.leaves}") <= 15
    assert root_ifname("tbabcdef", 32767, "b") == "tbabcdef32767b"
    small = leafspine(spines=3, leaves=4, hosts_per_leaf=5)
    for link in small.links:
        for name in (link.a_port, link.b_port):
            assert 1 <= len(name) <= 15


def test_prefix_rules():
    with raises("prefix: must be 1..8 characters"):
        leafspine(prefix="toolongprefix")
    with raises("prefix: must be 1..8 characters"):
        leafspine(prefix="Tb")
    t = leafspine(prefix="run7")
    assert t.namespace("leaf1") == "run7-leaf1"
    assert {n.namespace for n in t.nodes} == {f"run7-{n.name}" for n in t.nodes}


# ---- LeafSpineSpec ----------------------------------------------------------------------------------------------


def test_too_many_hosts_per_leaf():
    with raises("hosts_per_leaf: 300 hosts exceed the /24 address plan (max 253)"):
        leafspine(hosts_per_leaf=300)
    leafspine(hosts_per_leaf=253, leaves=1, spines=1)


@pytest.mark.parametrize("kw, msg", [
    (dict(spines=0), "spines: must be >= 1 (got 0)"),
    (dict(leaves=0), "leaves: must be >= 1 (got 0)"),
    (dict(leaves=256), "leaves: 256 leaves exceed the address plan"),
    (dict(hosts_per_leaf=2.5), "hosts_per_leaf: must be an integer (got 2.5)"),
    (dict(load_balancing="conga"),
     "load_balancing: unknown load-balancing mode 'conga' (allowed: ecmp, spray, flowlet, adaptive)"),
    (dict(seed=-1), "seed: must be >= 0 (got -1)"),
    (dict(host_link=1000), "host_link: must be a LinkSpec (got 1000)"),
    (dict(fabric_link=LinkSpec(1000, mtu=1500), host_link=LinkSpec(1000, mtu=9000)), "fabric_link.mtu: must be >="),
    (dict(spine_queue=QueueSpec(buffer_bytes=1000)), "spine_queue.buffer_bytes: must hold one 1514-byte frame"),
])
def test_leafspine_rules(kw, msg):
    with raises(msg):
        leafspine(**kw)


def fabric_classes(**rdma_kw):
    return (ClassSpec("bulk", dscp={0}, weight=1, default=True), lossless(**rdma_kw))


def test_class_set_rules():
    with raises("classes: exactly one class must have default = true (got 0)"):
        leafspine(classes=(lossless(),))
    with raises("classes[1].dscp: DSCP 0 already belongs to class 'bulk'"):
        leafspine(classes=fabric_classes(dscp={0, 26}))
    with raises("classes[1].name: duplicate class name 'bulk'"):
        leafspine(classes=fabric_classes(name="bulk"))
    with raises("classes: at most 8 classes (got 9)"):
        leafspine(classes=tuple(ClassSpec(f"c{i}", dscp={i}, weight=1, default=i == 0) for i in range(9)))


def test_lossless_class_checked_against_each_tier_buffer():
    with raises("classes[1].xoff_bytes: xoff_bytes + headroom_bytes must fit the buffer (got 50000 + 30000 = "
                "80000 > 60000 bytes of the spine_queue buffer)"):
        leafspine(classes=fabric_classes(), spine_queue=QueueSpec(buffer_bytes=60_000))
    with raises("classes[1].lossless: a lossless class cannot use a RED queue without ecn (the leaf_up_queue "
                "buffer drops early)"):
        leafspine(classes=fabric_classes(), leaf_up_queue=red())
    t = leafspine(classes=fabric_classes(), leaf_up_queue=red(ecn=True))
    port = t.port_spec("leaf_up")
    assert [c.name for c in port.classes] == ["bulk", "rdma"]
    assert all(c.queue == t.leaf_up_queue for c in port.classes)


def test_class_with_own_queue_keeps_it_on_every_tier():
    own = QueueSpec("step", buffer_bytes=500_000, k_bytes=60_000)
    t = leafspine(classes=fabric_classes(queue=own), spine_queue=QueueSpec(buffer_bytes=10_000))
    assert t.port_spec("spine").classes[1].queue == own
    assert t.port_spec("spine").classes[0].queue == t.spine_queue


@pytest.mark.parametrize("spines, hpl, host, fabric, expect", [
    (2, 4, 1000, 1000, 2.0),
    (4, 4, 1000, 1000, 1.0),
    (2, 8, 1000, 4000, 1.0),
    (3, 16, 100, 400, 16 * 100 / (3 * 400)),
    (4, 2, 1000, 1000, 0.5),
])
def test_oversubscription(spines, hpl, host, fabric, expect):
    t = leafspine(spines=spines, hosts_per_leaf=hpl, host_link=LinkSpec(host), fabric_link=LinkSpec(fabric))
    assert t.oversubscription == pytest.approx(expect)
    assert t.describe()["oversubscription"] == pytest.approx(expect)


def test_nodes_links_and_tiers():
    t = leafspine(spines=3, leaves=4, hosts_per_leaf=5)
    assert [n.name for n in t.hosts] == [f"h{i}" for i in range(1, 21)]
    assert sum(n.role == "leaf" for n in t.nodes) == 4
    assert sum(n.role == "spine" for n in t.nodes) == 3
    assert len(t.links) == 20 + 12
    assert t.leaf_of("h6") == "leaf2" and t.hosts_of("leaf2") == ("h6", "h7", "h8", "h9", "h10")
    h = t.links[0]
    assert (h.a, h.a_port, h.b, h.b_port) == ("h1", "eth0", "leaf1", "h1")
    assert (h.a_egress.tier, h.b_egress.tier) == ("host_nic", "leaf_down")
    f = t.links[20]
    assert (f.a, f.a_port, f.b, f.b_port) == ("leaf1", "spine1", "spine1", "leaf1")
    assert (f.a_egress.tier, f.b_egress.tier) == ("leaf_up", "spine")
    ports = t.egress_ports()
    assert len(ports) == 2 * len(t.links)
    assert len({(p.node, p.ifname) for p in ports}) == len(ports)


def test_describe_is_json_and_warns():
    import json
    t = leafspine(spine_queue=QueueSpec("step", buffer_bytes=300_000, k_packets=20))
    d = json.loads(json.dumps(t.describe()))
    assert d["kind"] == "leafspine" and d["hosts"] == 4 and d["links"] == 8
    assert d["queues"]["spine"]["k_packets"] == 20
    assert any("ECN off" in w for w in d["warnings"])
    assert not leafspine(tcp=HostTcpSpec("dctcp"), spine_queue=t.spine_queue).warnings()


def test_specs_are_frozen_and_hashable():
    t = leafspine()
    with pytest.raises(AttributeError):
        t.spines = 3  # type: ignore[misc]
    assert hash(t) == hash(leafspine()) and t == leafspine()


# ---- DumbbellSpec -----------------------------------------------------------------------------------------------


def test_dumbbell_shape():
    d = DumbbellSpec(senders=4, sender_link=LinkSpec(1000), bottleneck_link=LinkSpec(100, delay_ms=1),
                     bottleneck_queue=QueueSpec("red", buffer_bytes=100_000, min_bytes=10_000, max_bytes=30_000,
                                                probability=0.2, ecn=True))
    assert [n.name for n in d.nodes] == ["h1", "h2", "h3", "h4", "r1", "s1", "s2"]
    assert {n.role for n in d.nodes} == {"host", "switch"}
    bn = [l for l in d.links if {l.a, l.b} == {"s1", "s2"}]
    assert len(bn) == 1 and bn[0].a_egress.tier == "bottleneck" and bn[0].b_egress.tier == "switch"
    assert bn[0].a_egress.queue.discipline == "red"
    assert d.receiver_link == d.sender_link
    assert d.oversubscription == 40
    assert d.base_rtt_ms == 2.0


def test_dumbbell_rules():
    with raises("senders: 300 hosts exceed the /24 address plan (max 253)"):
        DumbbellSpec(senders=300, sender_link=LinkSpec(1000), bottleneck_link=LinkSpec(100))
    with raises("senders: must be >= 1 (got 0)"):
        DumbbellSpec(senders=0, sender_link=LinkSpec(1000), bottleneck_link=LinkSpec(100))
    with raises("bottleneck_queue.buffer_packets: must hold one 1514-byte frame"):
        DumbbellSpec(senders=2, sender_link=LinkSpec(1000), bottleneck_link=LinkSpec(100),
                     bottleneck_queue=QueueSpec(buffer_packets=1, avpkt_bytes=1000))
