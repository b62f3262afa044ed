"""Fault specs (testbed.faults.plan), routes without a link (topologies.routing), fault intervals (analysis.faults):
pure logic."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from analysis.faults import (describe, fault_intervals, fault_summary, overlapping, reaction_ms,
                             trimmed_while_slow)
from testbed.faults import plan as faultplan
from testbed.errors import UsageError
from topologies import LeafSpineSpec, LinkSpec
from topologies.routing import compute_routes, route_diff


def leafspine(spines=2, leaves=2, hosts_per_leaf=2):
    return LeafSpineSpec(spines=spines, leaves=leaves, hosts_per_leaf=hosts_per_leaf, host_link=LinkSpec(20),
                         fabric_link=LinkSpec(20))


def test_parse_and_print_round_trip():
    f = faultplan.parse("flap leaf1-spine1 at_s=1 down_s=0.2 up_s=0.3 count=3 detect_ms=300")
    assert (f.kind, f.target, f.at_s, f.get("count"), f.get("detect_ms")) == ("flap", "leaf1-spine1", 1.0, 3.0, 300)
    assert faultplan.parse(str(f)) == f
    assert f.end_s == pytest.approx(1 + 3 * 0.5)
    assert faultplan.parse("link-down leaf1-spine1 at_s=2").end_s == math.inf
    assert faultplan.make("slow-port", "spine1:leaf2", at_s=0, fraction=0.25) == \
        faultplan.parse("slow-port spine1:leaf2 at_s=0 fraction=0.25")


@pytest.mark.parametrize("text, says", [
    ("", "KIND TARGET"),
    ("explode leaf1-spine1 at_s=1", "unknown kind"),
    ("link-down leaf1-spine1", "at_s= is required"),
    ("link-down leaf1-spine1 at_s=-1", "at_s must be >= 0"),
    ("link-down leaf1-spine1 at_s=1 for_s=0", "for_s must be > 0"),
    ("link-down leaf1-spine1 at_s=nan", "finite"),
    ("link-down leaf1-spine1 at_s=1 speed=3", "unknown parameter 'speed'"),
    ("link-down leaf1-spine1 at_s=x", "not a number"),
    ("link-down leaf1-spine1 at_s", "not key=value"),
    ("flap leaf1-spine1 at_s=1 down_s=0.1 up_s=0.1 count=2.5", "whole number"),
    ("flap leaf1-spine1 at_s=1 down_s=0.1 up_s=0.1 count=0", "whole number"),
    ("slow-port spine1:leaf2 at_s=1 fraction=0", "a rate of 0 is a dead link"),
    ("slow-port spine1:leaf2 at_s=1 fraction=1.5", "fraction must be in (0, 1]"),
    ("netem leaf1:spine1 at_s=1", "at least one of"),
    ("netem leaf1:spine1 at_s=1 loss_percent=101", "loss_percent must be 0..100"),
    ("netem leaf1:spine1 at_s=1 delay_ms=1 jitter_ms=2", "jitter_ms must not exceed delay_ms"),
    ("link-down leaf1-spine1 at_s=1 detect_ms=70000", "detect_ms must be 0..60000"),
])
def test_bad_specs_are_one_line(text, says):
    with pytest.raises(UsageError) as e:
        faultplan.parse(text)
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, says", [
    ("link-down leaf1-spine9 at_s=1", "unknown link"),
    ("link-down leaf1-leaf2 at_s=1", "no link between leaf1 and leaf2"),
    ("slow-port spine1:leaf9 at_s=1 fraction=0.5", "no such egress port"),
    ("slow-port spine1 at_s=1 fraction=0.5", "no such egress port"),
    ("link-down leaf1-spine1 at_s=10", "past the end of the workload (5 s)"),
])
def test_targets_and_times_are_checked_against_the_topology(text, says):
    with pytest.raises(UsageError) as e:
        faultplan.check([faultplan.parse(text)], leafspine(), horizon_s=5.0)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_links_by_node_names_either_order_or_full_name():
    t = leafspine()
    a = faultplan.find_link(t, "leaf1-spine2")
    assert {a.a, a.b} == {"leaf1", "spine2"}
    assert faultplan.find_link(t, "spine2-leaf1") is a
    assert faultplan.find_link(t, a.name) is a
    assert faultplan.find_link(t, "h1-leaf1").a in ("h1", "leaf1")
    faultplan.check([faultplan.parse("netem spine1:leaf2 at_s=0 loss_percent=1")], t, None)


def test_steps_of_each_kind():
    flap = faultplan.parse("flap leaf1-spine1 at_s=1 down_s=0.2 up_s=0.3 count=2")
    assert [(s.t_s, s.op) for s in faultplan.steps(flap)] == [(1.0, "cut"), (1.2, "mend"), (1.5, "cut"),
                                                              (pytest.approx(1.7), "mend")]
    slow = faultplan.parse("slow-port spine1:leaf2 at_s=0.5 fraction=0.25 for_s=2")
    assert [(s.t_s, s.op, s.value) for s in faultplan.steps(slow)] == [(0.5, "rate", 0.25), (2.5, "rate", 1.0)]
    net = faultplan.parse("netem spine1:leaf2 at_s=0 loss_percent=2 delay_ms=5")
    assert [(s.op, s.value) for s in faultplan.steps(net)] == [("netem", {"loss_percent": 2, "delay_ms": 5})]
    assert faultplan.needs([net]) == ("cls:u32", "act:mirred", "qdisc:netem")
    assert faultplan.needs([slow]) == ()


def test_parse_file(tmp_path):
    p = tmp_path / "faults.txt"
    p.write_text("# a flapping uplink\nflap leaf1-spine1 at_s=1 down_s=0.1 up_s=0.1 count=2\n\n"
                 "slow-port spine1:leaf2 at_s=0 fraction=0.5  # for good\n")
    assert [f.kind for f in faultplan.parse_file(p)] == ["flap", "slow-port"]
    with pytest.raises(UsageError, match="--faults"):
        faultplan.parse_file(tmp_path / "missing.txt")


def test_routes_without_a_spine_link_go_around_it():
    t = leafspine()
    dead = faultplan.find_link(t, "leaf1-spine1")
    before, after = compute_routes(t), compute_routes(t, down=[dead])
    assert compute_routes(t, down=[]) == before == list(t.routes)
    leaf1 = {r.dst: r for r in after if r.node == "leaf1"}
    leaf2 = {r.dst: r for r in after if r.node == "leaf2"}
    spine1 = {r.dst: r for r in after if r.node == "spine1"}
    remote = [d for d in leaf1 if d.endswith("/24")]
    assert remote and all([nh.ifname for nh in leaf1[d].nexthops] == ["spine2"] for d in remote)
    # shortest paths, as a link-state protocol computes them: leaf2 reaches leaf1 only through spine2 now, and
    # spine1 reaches leaf1 the long way, through leaf2 and spine2 (a valley path: used only by what is already
    # at spine1)
    leaf1_subnet = t.address_plan.subnets["leaf1"]
    assert [nh.ifname for nh in leaf2[leaf1_subnet].nexthops] == ["spine2"]
    assert [nh.ifname for nh in spine1[leaf1_subnet].nexthops] == ["leaf2"]
    changes = route_diff(before, after)
    assert set(changes) == {"leaf1", "leaf2", "spine1"}
    assert [r.dst for r in changes["spine1"][0]] == [leaf1_subnet] and changes["spine1"][1] == []
    assert route_diff(after, before)["spine1"][0][0].dst == leaf1_subnet
    # a leaf cut off from every spine: nobody reaches its subnet, and its routes are gone
    alone = compute_routes(t, down=[faultplan.find_link(t, "leaf1-spine1"), faultplan.find_link(t, "leaf1-spine2")])
    assert not [r for r in alone if r.dst == leaf1_subnet]
    assert not [r for r in alone if r.node == "leaf1" and r.dst.endswith("/24")]
    assert route_diff(before, before) == {}


def test_a_host_link_down_removes_the_hosts_routes():
    t = leafspine()
    after = compute_routes(t, down=[faultplan.find_link(t, "h1-leaf1")])
    assert not [r for r in after if r.node == "h1"]
    assert not [r for r in after if r.dst == f"{t.host_ip('h1')}/32"]
    assert [r for r in after if r.node == "h2"]


def _events(rows):
    return pd.DataFrame(rows, columns=["t_s", "kind", "target", "detail"])


def test_fault_intervals_pair_starts_and_ends():
    ev = _events([(10.0, "link_down", "leaf1-spine1", "detect_ms=50"),
                  (10.06, "routes_withdrawn", "leaf1-spine1", "routes_changed=4"),
                  (10.2, "link_up", "leaf1-spine1", ""),
                  (10.25, "routes_restored", "leaf1-spine1", "routes_changed=4"),
                  (11.0, "port_slow", "spine1:leaf2", "rate_mbps=5;of_mbps=20"),
                  (12.0, "link_down", "leaf1-spine1", "")])
    iv = fault_intervals(ev, run_end=13.0)
    got = [(r.what, r.target, round(r.start_s, 3), round(r.end_s, 3)) for r in iv.itertuples()]
    assert got == [("down", "leaf1-spine1", 10.0, 10.2), ("withdrawn", "leaf1-spine1", 10.06, 10.25),
                   ("slow", "spine1:leaf2", 11.0, 13.0), ("down", "leaf1-spine1", 12.0, 13.0)]
    assert reaction_ms(ev) == [pytest.approx(60.0)]
    s = fault_summary(ev, run_end=13.0)
    assert s["link_down_events"] == 2 and s["routes_withdrawn_events"] == 1
    assert s["down_ms_total"] == pytest.approx(1200.0) and s["slow_ms_total"] == pytest.approx(2000.0)
    ov = overlapping(iv, 10.1, 10.3)
    assert describe(ov) == "leaf1-spine1 withdrawn for 150 ms, leaf1-spine1 down for 100 ms"
    assert overlapping(iv, 5, 6) == [] and describe([]) == ""
    assert fault_summary(_events([])) == {} and fault_intervals(None).empty


def test_restored_at_close_ends_every_open_withdrawal():
    ev = _events([(1.0, "routes_withdrawn", "a-b", ""), (2.0, "routes_withdrawn", "c-d", ""),
                  (3.0, "routes_restored", "all", "at_close")])
    iv = fault_intervals(ev)
    assert sorted(iv["end_s"]) == [3.0, 3.0]


def test_trims_while_slow_count_from_the_trim_rate_after_port_slow_to_the_one_after_port_restored():
    ev = _events([(1.0, "port_slow", "leaf1:h1", "rate_mbps=5;of_mbps=20"),
                  (1.0, "trim_rate", "leaf1:h1", "drain_rate_mbps=5;trimmed_packets=40;vq_bytes=0"),
                  (3.0, "port_restored", "leaf1:h1", "rate_mbps=20"),
                  (3.0, "trim_rate", "leaf1:h1", "drain_rate_mbps=20;trimmed_packets=940;vq_bytes=9000"),
                  (4.0, "port_slow", "leaf1:h1", "rate_mbps=5;of_mbps=20"),  # trimming finished before its end:
                  (4.0, "trim_rate", "leaf1:h1", "drain_rate_mbps=5;trimmed_packets=950;vq_bytes=0"),
                  (5.0, "port_slow", "spine1:leaf1", "rate_mbps=4;of_mbps=40"),  # no trimming program there
                  (6.0, "port_restored", "spine1:leaf1", "rate_mbps=40")])
    assert trimmed_while_slow(ev) == {"leaf1:h1": 900}  # the second interval had no restoring trim_rate: uncounted
    s = fault_summary(ev)
    assert s["trim_rate_events"] == 3 and s["trimmed_while_slow_packets"] == 900
    assert trimmed_while_slow(_events([])) == {}


# ---- host faults ----

def test_host_faults_parse_with_words_and_defaults():
    f = faultplan.parse("host-config h3 cc=reno ecn=0")
    assert (f.at_s, f.get("cc"), f.get("ecn")) == (0.0, "reno", 0.0) and faultplan.parse(str(f)) == f
    assert [(s.t_s, s.op, s.value) for s in faultplan.steps(f)] == [(0.0, "host-open", {"cc": "reno", "ecn": 0.0})]
    live = faultplan.parse("host-config h3 at_s=1 for_s=2 mtu_bytes=1000 rto_min_ms=200")
    assert [(s.t_s, s.op) for s in faultplan.steps(live)] == [(1.0, "host-live"), (3.0, "host-restore")]
    slow = faultplan.make("slow-host", "h2", at_s=0.5, cpu_fraction=0.1, for_s=1)
    assert [(s.t_s, s.op, s.value) for s in faultplan.steps(slow)] == [(0.5, "cpu", 0.1), (1.5, "cpu", None)]
    assert faultplan.needs([slow, f, faultplan.parse("host-config h1 cc=dctcp ecn=1")]) == \
        ("cgroup:cpu", "tcp:reno", "tcp:dctcp", "sysctl:ecn")
    faultplan.check([f, slow], leafspine())


@pytest.mark.parametrize("text, says", [
    ("host-config h3", "give at least one of cc, ecn, mtu_bytes, rto_min_ms"),
    ("host-config h3 cc=reno at_s=1", "cc is fixed when a connection opens"),
    ("host-config h3 cc=reno ecn=1 for_s=1", "cc/ecn are fixed when a connection opens"),
    ("host-config h3 cc=Reno!", "not a congestion control's name"),
    ("host-config h3 ecn=2", "ecn must be 0 or 1"),
    ("host-config h3 mtu_bytes=100", "mtu_bytes must be a whole number 576..9000"),
    ("host-config h3 rto_min_ms=0.5", "rto_min_ms must be a whole number"),
    ("host-config h3 mtu=1000", "unknown parameter 'mtu'"),
    ("slow-host h2 at_s=0 cpu_fraction=0", "cpu_fraction must be in (0, 1]"),
    ("slow-host h2 at_s=0 cpu_fraction=1.5", "cpu_fraction must be in (0, 1]"),
    ("slow-host h2 at_s=0 cpu_fraction=0.005", "at least 1 ms"),
    ("slow-host h2 cpu_fraction=0.5", "at_s= is required"),
])
def test_bad_host_faults_say_what_is_wrong(text, says):
    with pytest.raises(UsageError, match=re.escape(says)):
        faultplan.parse(text)


def test_a_host_fault_on_a_node_that_is_no_host_is_refused():
    for text in ("slow-host leaf1 at_s=0 cpu_fraction=0.5", "host-config h9 cc=reno"):
        with pytest.raises(UsageError, match="no such host"):
            faultplan.check([faultplan.parse(text)], leafspine())


def test_throttling_and_host_changes_are_intervals_and_the_kernel_time_is_summed():
    ev = _events([(1.0, "host_config", "h2", "cc=reno"),
                  (2.0, "cpu_throttled", "h3", "cpu_fraction=0.01;period_ms=100;processes=1"),
                  (2.5, "host_changed", "h4", "mtu_bytes=1000"),
                  (3.0, "host_restored", "h4", "mtu_bytes"),
                  (4.0, "cpu_restored", "h3", "throttled_ms=1935;throttled_periods=28")])
    iv = fault_intervals(ev, run_end=5.0)
    got = [(r.what, r.target, r.start_s, r.end_s) for r in iv.itertuples()]
    assert got == [("configured differently", "h2", 1.0, 5.0), ("throttled", "h3", 2.0, 4.0),
                   ("reconfigured", "h4", 2.5, 3.0)]
    s = fault_summary(ev, run_end=5.0)
    assert s["throttled_ms_total"] == pytest.approx(2000.0) and s["cpu_throttled_ms_kernel"] == 1935.0
    assert describe(overlapping(iv, 2.4, 2.6)) == \
        "h2 configured differently for 200 ms, h3 throttled for 200 ms, h4 reconfigured for 100 ms"


def test_a_pause_storm_needs_a_lossless_class_at_its_port():
    from topologies import ClassSpec

    f = faultplan.parse("pause-storm leaf2:h4 at_s=0.5 for_s=2")
    assert [(s.t_s, s.op) for s in faultplan.steps(f)] == [(0.5, "storm"), (2.5, "storm-end")]
    assert faultplan.needs([f]) == ("qdisc:plug",)
    with pytest.raises(UsageError, match="no lossless class for PFC to pause"):
        faultplan.check([f], leafspine())
    lossless = LeafSpineSpec(spines=1, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(20), fabric_link=LinkSpec(20),
                             classes=(ClassSpec("bulk", dscp=[0], weight=1, default=True),
                                      ClassSpec("rdma", dscp=[26], weight=1, lossless=True, pcp=3, xoff_bytes=16_000,
                                                xon_bytes=8_000, headroom_bytes=100_000)))
    faultplan.check([f], lossless)


def test_a_fault_can_start_at_an_iteration():
    f = faultplan.parse("link-down leaf1-spine1 at_iteration=3 at_s=0.05 for_s=0.4")
    assert f.at_iteration == 3 and faultplan.parse(str(f)) == f
    assert faultplan.parse("slow-port spine1:leaf2 fraction=0.5 at_iteration=0").at_s == 0.0
    faultplan.check([f], leafspine(), iterations=4)
    faultplan.check([f], leafspine())  # the number of iterations is not known yet (the Lab API): not checked
    with pytest.raises(UsageError, match=re.escape("past the last iteration (2)")):
        faultplan.check([f], leafspine(), iterations=3)
    with pytest.raises(UsageError, match="needs a workload with iterations"):
        faultplan.check([f], leafspine(), iterations=0)
    with pytest.raises(UsageError, match="unknown parameter 'at_iteration'"):
        faultplan.parse("host-config h1 cc=reno at_iteration=2")
    assert faultplan.parse("link-down leaf1-spine1 at_s=99 at_iteration=1").at_iteration == 1
    faultplan.check([faultplan.parse("link-down leaf1-spine1 at_s=99 at_iteration=1")], leafspine(), horizon_s=5,
                    iterations=3)  # at_s counts from the iteration: the time horizon does not apply


def test_a_pause_storm_is_an_interval_and_the_watchdog_releases_are_counted():
    ev = _events([(1.0, "iteration_reached", "leaf2:h4", "iteration=1;fault=pause-storm"),
                  (1.1, "pause_storm", "leaf2:h4", "prio=3"),
                  (1.25, "pfc_watchdog", "leaf2:h4", "prio=3;backlog_bytes=9000"),
                  (1.6, "pfc_watchdog", "h3:eth0", "prio=3;backlog_bytes=100"),
                  (3.1, "pause_storm_end", "leaf2:h4", "prio=3")])
    iv = fault_intervals(ev, run_end=4.0)
    assert [(r.what, r.target, r.start_s, r.end_s) for r in iv.itertuples()] == [("storming", "leaf2:h4", 1.1, 3.1)]
    s = fault_summary(ev, run_end=4.0)
    assert s["storming_ms_total"] == pytest.approx(2000.0) and s["pfc_watchdog_fired"] == 2, s


def test_a_ports_configured_rate_over_rounds_counts_a_slow_port_faults_rate_while_it_held():
    from analysis.faults import configured_rate_mbps

    ev = _events([(10.0, "port_slow", "leaf1:h1", "rate_mbps=5;of_mbps=20"),
                  (10.0, "port_slow", "leaf2:h3", "rate_mbps=1;of_mbps=20"),  # another port: not this one's
                  (12.0, "port_restored", "leaf1:h1", "rate_mbps=20")])
    # rounds 9-11 (half slow) and 11.5-12.5 (half slow): (20 x 1 + 5 x 1) + (5 x 0.5 + 20 x 0.5) over 3 s
    assert configured_rate_mbps(ev, "leaf1:h1", 20.0, [(9.0, 11.0), (11.5, 12.5)]) == pytest.approx(37.5 / 3)
    assert configured_rate_mbps(ev, "leaf1:h2", 20.0, [(9.0, 11.0)]) == 20.0   # never slowed
    assert configured_rate_mbps(None, "leaf1:h1", 20.0, [(9.0, 11.0)]) == 20.0  # no faults at all
    open_ = ev.iloc[:1]  # slowed for the whole run: the timeline restores it only when the lab ends
    assert configured_rate_mbps(open_, "leaf1:h1", 20.0, [(10.0, 11.0), (11.0, 13.0)]) == pytest.approx(5.0)
    assert configured_rate_mbps(ev, "leaf1:h1", 20.0, []) == 20.0


def test_a_second_slow_step_replaces_the_rate_and_faults_elsewhere_are_named():
    from analysis.faults import configured_rate_mbps, faulted_elsewhere

    ev = _events([(10.0, "port_slow", "leaf1:h1", "rate_mbps=10;of_mbps=20"),
                  (11.0, "port_slow", "leaf1:h1", "rate_mbps=2;of_mbps=20"),
                  (12.0, "port_restored", "all", "")])
    assert configured_rate_mbps(ev, "leaf1:h1", 20.0, [(10.0, 12.0)]) == pytest.approx(6.0)
    assert configured_rate_mbps(ev, "leaf1:h1", 20.0, [(9.0, 13.0)]) == pytest.approx((20 + 10 + 2 + 20) / 4)
    up = _events([(10.0, "port_slow", "spine1:leaf1", "rate_mbps=4;of_mbps=40")])  # slowed for the whole run
    assert faulted_elsewhere(up, "leaf1:h1", [(10.5, 11.0)]) == ["spine1:leaf1"]
    assert faulted_elsewhere(up, "leaf1:h1", [(9.0, 9.5)]) == []  # rounds before the fault
    assert faulted_elsewhere(up, "spine1:leaf1", [(10.5, 11.0)]) == [] and faulted_elsewhere(None, "x", []) == []
