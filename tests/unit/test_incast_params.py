"""Incast parameters and fabric planning, without a kernel: every mistake is one line before anything is built."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testbed.errors import UsageError
from testbed.network.fabric import Fabric
from testbed.network.portplan import leaf_queue, plan_port
from testbed.params import resolve
from testbed.scenario import get
from testbed.workloads.bottleneck import build_spec
from topologies import ClassSpec, LeafSpineSpec, LinkSpec, QueueSpec

PARAMS = get("incast").params


def p(*sets):
    return resolve(PARAMS, list(sets))


def test_registered_with_units_and_ranges():
    sc = get("incast")
    assert sc.name == "incast"
    assert set(sc.needs) == {"qdisc:htb", "qdisc:bfifo"}
    base = {x.name: x.default for x in sc.params}
    assert set(sc.needs_of(base)) == {"qdisc:htb", "qdisc:bfifo"}  # drop-tail + cubic: any kernel with HTB
    assert "qdisc:red+ecn" in sc.needs_of({**base, "discipline": "step"})
    assert {"tcp:dctcp", "sysctl:ecn"} <= set(sc.needs_of({**base, "cc": "dctcp", "ecn": True}))
    assert "cls:basic+meta" in sc.needs_of({**base, "load_balancing": "spray"})
    names = {x.name for x in sc.params}
    assert names >= {"senders", "block_bytes", "rounds", "host_rate_mbps", "fabric_rate_mbps", "buffer_bytes",
                     "discipline", "ecn", "k_bytes", "cc", "rto_min_ms", "seed", "topology"}
    assert "bytes" in sc.help() and "Mbit/s" in sc.help()


@pytest.mark.parametrize("bad", ["senders=0", "senders=lots", "discipline=codel", "cc=vegas", "buffer_bytes=10",
                                 "topology=torus", "rto_min_ms=0", "nope=1"])
def test_bad_values_are_usage_errors(bad):
    with pytest.raises(UsageError):
        p(bad)


@pytest.mark.parametrize("sets, words", [
    (["cc=dctcp"], "dctcp requires ECN"),
    (["discipline=step", "k_bytes=64000", "buffer_bytes=64000"], "k_bytes"),
    (["discipline=red", "k_bytes=70000", "buffer_bytes=64000"], "k_bytes"),
])
def test_inconsistent_sets_fail_validation(sets, words):
    sc = get("incast")
    with pytest.raises(UsageError, match=words):
        sc.validate(p(*sets))


def test_leafspine_places_senders_off_the_receivers_leaf():
    topo, rx, senders, bn = build_spec(p("senders=6", "hosts_per_leaf=4"))
    assert rx == "h1" and bn == ("leaf1", "h1")
    assert len(senders) == 6 and all(topo.leaf_of(h) != "leaf1" for h in senders)
    assert topo.leaves == 3
    assert topo.port_spec("leaf_down").queue.buffer_bytes == 64_000
    assert topo.tcp.rto_min_ms == 200


def test_dumbbell_bottleneck_is_the_receiver_port():
    topo, rx, senders, bn = build_spec(p("topology=dumbbell", "senders=3", "discipline=step", "k_bytes=10000"))
    assert rx == "r1" and bn == ("s2", "r1") and senders == ["h1", "h2", "h3"]
    eg = {(e.node, e.ifname): e for e in topo.egress_ports()}
    assert eg[bn].port.queue.discipline == "step"
    assert eg[bn].link.rate_mbps == 20.0


def test_cli_rejects_before_building():
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "incast", "--set", "senders=0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "senders" in r.stderr and "Traceback" not in r.stderr


def test_fabric_plan_is_pure_and_named_per_run():
    topo = LeafSpineSpec(spines=2, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(10), fabric_link=LinkSpec(10))
    f = Fabric(topo, "ab12")
    assert f.ns("leaf1") == "tb-ab12-leaf1"
    assert len(f.ports()) == 2 * len(topo.links)
    assert ("leaf1", "tb-ab12-leaf1", "spine2") in f.ports()
    with pytest.raises(UsageError):
        Fabric(topo, "Bad/Id")


def test_queue_mapping():
    assert leaf_queue(QueueSpec("droptail", buffer_bytes=5000)).tc_args() == ("bfifo", {"limit": 5000})
    assert leaf_queue(QueueSpec("droptail", buffer_packets=50)).tc_args() == ("pfifo", {"limit": 50})
    kind, args = leaf_queue(QueueSpec("step", buffer_bytes=100_000, k_packets=10)).tc_args()
    assert kind == "red" and args["min"] == 15_000 and args["probability"] == 1.0 and args["instantaneous"]
    kind, args = leaf_queue(QueueSpec("red", buffer_bytes=100_000, min_bytes=10_000, max_bytes=30_000,
                                      probability=0.2, ecn=True)).tc_args()
    assert kind == "red" and args["ecn"] and args["max"] == 30_000
    assert "burst" not in args and "bandwidth" not in args


def test_red_burst_and_link_rate_reach_the_kernel_encoding():
    """burst_packets sets RED's EWMA weight (Wlog: a longer tolerated burst averages more slowly), the link rate its
    idle damping, both as iproute2's `tc qdisc add ... red burst B bandwidth R` computes them."""
    from testbed.kernel.tcext import _red

    spec = dict(buffer_bytes=200_000, min_bytes=30_000, max_bytes=90_000, probability=0.1, ecn=True)
    kind, args = leaf_queue(QueueSpec("red", burst_packets=60, **spec)).tc_args(1_250_000)
    assert args["burst"] == 60 and args["bandwidth"] == 1_250_000

    def parms(q):
        return dict(_red.get_parameters(q[1])["attrs"])

    tc_default = parms(leaf_queue(QueueSpec("red", **spec)).tc_args(1_250_000))["TCA_RED_PARMS"]
    slow = parms((kind, args))
    # default burst (2 min + max) / (3 avpkt) = 34 packets; 60 packets -> a smaller weight 2^-Wlog
    assert slow["TCA_RED_PARMS"]["Wlog"] > tc_default["Wlog"]
    fast_link = parms(leaf_queue(QueueSpec("red", burst_packets=60, **spec)).tc_args(125_000_000))
    assert (fast_link["TCA_RED_PARMS"]["Scell_log"], fast_link["TCA_RED_STAB"]) != \
        (slow["TCA_RED_PARMS"]["Scell_log"], slow["TCA_RED_STAB"])


def test_classes_map_to_htb_classes():
    classes = (ClassSpec("bulk", dscp=[0], weight=3, default=True), ClassSpec("ctrl", dscp=[46], priority=0),
               ClassSpec("rest", dscp=[8, 10], weight=1))
    topo = LeafSpineSpec(spines=1, leaves=2, hosts_per_leaf=1, host_link=LinkSpec(10), fabric_link=LinkSpec(10),
                         classes=classes)
    plan = plan_port(topo.egress_ports()[0])
    assert [c[1] for c in plan.classes] == ["bulk", "ctrl", "rest"]
    assert plan.default_minor == 0x10
    bulk, ctrl, rest = plan.classes
    assert bulk[4] == 3.0 and rest[4] == 1.0 and bulk[3] == rest[3] == 7 and ctrl[3] == 0  # prio, DRR weight
    assert plan.class_label(0x11) == "ctrl"


def test_round_percentiles_are_analysis_nearest_rank():
    """incast's round_ms_* come from analysis.summary.round_metrics over rounds.csv (nearest rank: an observed
    round), no longer from a linear-interpolation copy in the scenario."""
    import pandas as pd

    from analysis.summary import round_metrics

    rounds = pd.DataFrame({"round": [0, 1, 2, 3], "sender": "h2", "start_s": [0.0, 1.0, 2.0, 3.0],
                           "end_s": [0.001, 1.002, 2.003, 3.004], "bytes": 1000})
    r = round_metrics(rounds)
    assert r["round_ms_p50"] == pytest.approx(2.0) and r["round_ms_p99"] == pytest.approx(4.0)
    assert r["rounds_n"] == 4 and r["round_goodput_mbps"] == pytest.approx(4000 * 8 / 0.010 / 1e6)


def test_class_quanta_follow_weights_per_prio():
    from testbed.kernel.qdisc import LeafQueue, PortClass, class_quanta

    q = LeafQueue("bfifo", limit=10_000)
    classes = [PortClass(0x10, q, prio=7, weight=3), PortClass(0x11, q, prio=0), PortClass(0x12, q, prio=7, weight=1),
               PortClass(0x13, q, prio=7, weight=1000)]
    assert class_quanta(classes, 1514) == {0x10: 3 * 1514, 0x11: 1514, 0x12: 1514, 0x13: 64 * 1514}
    with pytest.raises(ValueError, match="prio must be 0..7"):
        PortClass(0x10, q, prio=8)
    with pytest.raises(ValueError, match="weight must be > 0"):
        PortClass(0x10, q, weight=0)


def test_sampled_ports_are_the_switch_queues_the_incast_can_cross():
    from topologies.routing import switch_ports_between

    topo, rx, senders, bn = build_spec(p("senders=2", "hosts_per_leaf=2", "spines=2"))
    ports = switch_ports_between(topo, senders, rx)
    assert bn in ports and {("leaf2", "spine1"), ("leaf2", "spine2")} <= ports  # both ECMP uplinks
    assert all(topo.node(n).role != "host" for n, _ in ports)  # the hosts' NICs are not switch queues
    assert not any(n == "leaf1" and port != "h1" for n, port in ports)  # nothing else on the receiver's leaf
