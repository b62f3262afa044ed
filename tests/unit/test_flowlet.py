"""Flowlet and adaptive load balancing, the pure parts: the plan (uplinks, destination slots, the queues on each
path), the path metric, the parameters' validation and what such a fabric needs from the kernel."""

from __future__ import annotations

import pytest

from testbed.kernel.flowlet import ps_per_byte
from testbed.vm.needs import fabric_needs
from topologies.flowlet import drain_delay_us, flowlet_plans, path_congestion
from topologies.leafspine import LeafSpineSpec
from topologies.spec import LinkSpec, SpecError
from topologies.spray import spray_groups


def spec(**kw) -> LeafSpineSpec:
    kw = {"spines": 2, "leaves": 3, "hosts_per_leaf": 2, "host_link": LinkSpec(10), "fabric_link": LinkSpec(10),
          **kw}
    return LeafSpineSpec(**kw)


def test_every_leaf_balances_over_its_uplinks_with_one_slot_per_other_leaf():
    t = spec(load_balancing="adaptive")
    plans = {p.node: p for p in flowlet_plans(t, spray_groups(t))}
    assert sorted(plans) == ["leaf1", "leaf2", "leaf3"]
    p = plans["leaf1"]
    assert p.ports == ("spine1", "spine2")
    leaf2 = {t.host_ip(h) for h in ("h3", "h4")}
    leaf3 = {t.host_ip(h) for h in ("h5", "h6")}
    assert set(p.slot_of) == leaf2 | leaf3  # leaf1's own hosts are not reached through the uplinks
    assert len({p.slot_of[ip] for ip in leaf2}) == 1 and len({p.slot_of[ip] for ip in leaf3}) == 1
    s2 = p.slot_of[t.host_ip("h3")]
    # the path through spine2 to leaf2 crosses leaf1's uplink to spine2 and spine2's port to leaf2
    assert p.paths[(s2, 1)] == (("leaf1", "spine2"), ("spine2", "leaf2"))
    assert p.queues == {("leaf1", "spine1"), ("leaf1", "spine2"), ("spine1", "leaf2"), ("spine2", "leaf2"),
                        ("spine1", "leaf3"), ("spine2", "leaf3")}


def test_a_path_is_as_congested_as_its_worst_queue():
    t = spec(load_balancing="adaptive")
    p = {p.node: p for p in flowlet_plans(t, spray_groups(t))}["leaf1"]
    s2 = p.slot_of[t.host_ip("h3")]
    delay = {("leaf1", "spine1"): 100, ("spine1", "leaf2"): 30_000, ("leaf1", "spine2"): 5_000}
    cong = path_congestion(p, delay)
    assert cong[(s2, 0)] == 30_000 and cong[(s2, 1)] == 5_000
    assert cong[(p.slot_of[t.host_ip("h5")], 0)] == 100  # towards leaf3 spine1's port to leaf2 does not count


def test_drain_delay_and_byte_time_follow_the_rate():
    assert drain_delay_us(12_500, 10.0) == 10_000  # 100 kbit at 10 Mbit/s: 10 ms
    assert drain_delay_us(12_500, 2.5) == 40_000  # a quarter of the rate: four times as long
    assert drain_delay_us(1000, 0) == 0
    assert ps_per_byte(10.0) == 800_000 and ps_per_byte(2.5) == 3_200_000
    assert ps_per_byte(100_000) == 80


def test_flowlet_modes_are_load_balancing_choices_with_checked_parameters():
    for mode in ("flowlet", "adaptive"):
        t = spec(load_balancing=mode, flowlet_gap_ms=5)
        assert t.describe()["flowlet_gap_ms"] == 5
        assert "bpf:flowlet" in fabric_needs(t) and "cls:basic+meta" not in fabric_needs(t)
    assert "adaptive_poll_ms" in spec(load_balancing="adaptive").describe()
    assert "flowlet_gap_ms" not in spec().describe()
    with pytest.raises(SpecError, match="flowlet_gap_ms"):
        spec(load_balancing="flowlet", flowlet_gap_ms=0)
    with pytest.raises(SpecError, match="load-balancing mode"):
        spec(load_balancing="conga")


def test_the_collective_takes_the_modes_and_refuses_a_bad_gap():
    from testbed.errors import UsageError
    from testbed.scenario import get

    coll = get("collective")
    p = {x.name: x.default for x in coll.params}
    p.update(load_balancing="adaptive", flowlet_gap_ms=4.0)
    coll.validate(p)
    p["flowlet_gap_ms"] = -1
    with pytest.raises((UsageError, ValueError), match="flowlet_gap_ms"):
        coll.validate(p)
