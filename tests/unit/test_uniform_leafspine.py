"""topologies.uniform_leaf_spine: the leaf-spine every command and scenario builds from its --set parameters."""

from __future__ import annotations

import pytest

from topologies import (DEFAULT_QUEUE, ClassSpec, HostTcpSpec, LeafSpineSpec, LinkSpec, QueueSpec, SpecError,
                        uniform_leaf_spine)


def test_rates_shape_and_defaults():
    s = uniform_leaf_spine(2, 3, 4, 25.0, 50.0)
    assert isinstance(s, LeafSpineSpec)
    assert (s.spines, s.leaves, s.hosts_per_leaf, s.host_count) == (2, 3, 4, 12)
    assert s.host_link == LinkSpec(25.0) and s.fabric_link == LinkSpec(50.0)
    assert s.host_queue == s.leaf_down_queue == s.leaf_up_queue == s.spine_queue == DEFAULT_QUEUE
    assert s == LeafSpineSpec(spines=2, leaves=3, hosts_per_leaf=4, host_link=LinkSpec(25.0),
                              fabric_link=LinkSpec(50.0))
    # every host link at the host rate, every leaf-spine link at the fabric rate
    rates = {(l.a.rstrip("0123456789"), l.b.rstrip("0123456789")): l.spec.rate_mbps for l in s.links}
    assert rates == {("h", "leaf"): 25.0, ("leaf", "spine"): 50.0}


def test_delay_and_mtu_on_both_tiers():
    s = uniform_leaf_spine(1, 2, 2, 10, 20, delay_ms=1.5, mtu=9000)
    assert s.host_link == LinkSpec(10, delay_ms=1.5, mtu=9000)
    assert s.fabric_link == LinkSpec(20, delay_ms=1.5, mtu=9000)
    assert s.base_rtt_ms == pytest.approx(2 * 4 * 1.5)


def test_queues_switch_tiers_and_bottleneck():
    nic, sw, k = QueueSpec(buffer_bytes=1_000_000), QueueSpec(buffer_bytes=30_000), QueueSpec("step", 64_000,
                                                                                                 k_bytes=20_000)
    s = uniform_leaf_spine(2, 2, 2, 20, 20, host_queue=nic, switch_queue=sw)
    assert s.host_queue == nic and s.leaf_down_queue == s.leaf_up_queue == s.spine_queue == sw
    s = uniform_leaf_spine(2, 2, 2, 20, 20, host_queue=nic, switch_queue=sw, leaf_down_queue=k)
    assert (s.host_queue, s.leaf_down_queue, s.leaf_up_queue, s.spine_queue) == (nic, k, sw, sw)
    s = uniform_leaf_spine(2, 2, 2, 20, 20, leaf_down_queue=k)  # the incast bottleneck only
    assert s.leaf_down_queue == k and s.host_queue == s.leaf_up_queue == s.spine_queue == DEFAULT_QUEUE
    s = uniform_leaf_spine(2, 2, 2, 20, 20, switch_queue=sw, leaf_up_queue=nic, spine_queue=k)
    assert (s.host_queue, s.leaf_down_queue, s.leaf_up_queue, s.spine_queue) == (DEFAULT_QUEUE, sw, nic, k)


def test_other_fields_pass_through():
    tcp = HostTcpSpec(congestion_control="dctcp", ecn=True, rto_min_ms=5)
    classes = (ClassSpec("bulk", dscp=[0], priority=0, default=True), ClassSpec("rdma", dscp=[26], priority=1))
    s = uniform_leaf_spine(2, 2, 2, 20, 20, tcp=tcp, seed=7, load_balancing="flowlet", flowlet_gap_ms=2.0,
                           classes=classes, prefix="tq")
    assert (s.tcp, s.seed, s.load_balancing, s.flowlet_gap_ms, s.classes, s.prefix) == (
        tcp, 7, "flowlet", 2.0, classes, "tq")
    assert s.nodes[0].namespace == "tq-h1"


@pytest.mark.parametrize("kwargs,path", [
    (dict(spines=0, leaves=2, hosts_per_leaf=2, host_rate_mbps=10, fabric_rate_mbps=10), "spines"),
    (dict(spines=1, leaves=2, hosts_per_leaf=2, host_rate_mbps=0, fabric_rate_mbps=10), "link.rate_mbps"),
    (dict(spines=1, leaves=2, hosts_per_leaf=2, host_rate_mbps=10, fabric_rate_mbps=10, delay_ms=-1),
     "link.delay_ms"),
    (dict(spines=1, leaves=2, hosts_per_leaf=2, host_rate_mbps=10, fabric_rate_mbps=10, load_balancing="x"),
     "load_balancing"),
])
def test_bad_values_are_spec_errors(kwargs, path):
    with pytest.raises(SpecError) as e:
        uniform_leaf_spine(**kwargs)
    assert str(e.value).startswith(path)


def test_links_cannot_also_be_given_whole():
    with pytest.raises(TypeError):
        uniform_leaf_spine(1, 2, 2, 10, 10, host_link=LinkSpec(5))
