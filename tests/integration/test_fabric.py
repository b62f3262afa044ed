"""The fabric builder on the real kernel: a 2-spine x 2-leaf x 2-host leaf-spine (and a dumbbell for the shaped
path), asserted on TCP reachability, the per-spine qdisc counters, the shaper's own byte count and what teardown
leaves behind. Every test builds and removes its own fabric (conftest checks for leftovers after each test)."""

from __future__ import annotations

import itertools
import secrets
import socket
import threading
import time

import pytest

from testbed.network.fabric import Fabric, tcp_connect_ok
from testbed.kernel import counters, netns, qdisc, spray
from testbed.kernel.state import RunState
from testbed.kernel.qdiscdump import RawQdiscDump
from testbed.measure.telemetry import QueueSampler
from tests.fabricdrive import built, bulk, fab_ipr, shaped_path_ratio
from topologies import ClassSpec, DumbbellSpec, HostTcpSpec, LeafSpineSpec, LinkSpec, QueueSpec


def leafspine(rate=50.0, **kw) -> LeafSpineSpec:
    return LeafSpineSpec(spines=2, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(rate), fabric_link=LinkSpec(rate),
                         **kw)


def test_leafspine_connects_spreads_over_spines_and_tears_down():
    """One 2x2x2 build (each build + conftest's leftover check costs about a minute in the emulated VM): every host
    pair handshakes, parallel flows between the leaves use both spines, teardown leaves no namespace."""
    topo = leafspine()
    rid = secrets.token_hex(2)
    state = RunState(rid)
    fab = Fabric(topo, rid)
    try:
        fab.build(state)
        mine = [n for n in netns.list_ours() if n.startswith(f"tb-{rid}-")]
        assert sorted(mine) == sorted(fab.namespaces.values())
        assert sorted(state.data["namespaces"]) == sorted(fab.namespaces.values())  # `testbed clean` finds them
        d = fab.describe()  # the builder's own description lands in the manifest
        assert "offloads" in d["builder"] and d["builder"]["namespaces"]["leaf1"] == fab.ns("leaf1")

        hosts = [h.name for h in topo.hosts]
        bad = [(a, b) for a, b in itertools.permutations(hosts, 2) if not tcp_connect_ok(fab, a, b)]
        assert not bad, f"no TCP handshake between {bad}"

        pairs = [("h1", "h3"), ("h2", "h4")] * 6  # 12 flows leaf1 -> leaf2, distinct source ports
        def spine_bytes(node, ports):
            return {p: sum(x.sent_bytes for x in qdisc.port_stats(fab.ns(node), p)) for p in ports}
        before = spine_bytes("leaf1", ("spine1", "spine2"))
        got = bulk(fab, pairs, 1.5)
        after = spine_bytes("leaf1", ("spine1", "spine2"))
        per_spine = {s: after[s] - before[s] for s in after}
        print("per-spine sent bytes:", per_spine, "flows:", got)
        assert all(g > 0 for g in got), got
        assert per_spine["spine1"] > 50_000 and per_spine["spine2"] > 50_000, per_spine
        for s in ("spine1", "spine2"):  # and each spine forwarded what it got down to leaf2
            assert spine_bytes(s, ("leaf2",))["leaf2"] > 50_000
    finally:
        fab.teardown()
        state.drop()
    assert not [n for n in netns.list_ours() if n.startswith(f"tb-{rid}-")]


def test_spray_mode_spreads_one_flow_over_both_spines():
    """load_balancing="spray": a single TCP flow leaf1 -> leaf2 goes over both spines packet by packet (with ECMP
    it would hash onto one). Reordering makes TCP retransmit spuriously: recorded, it is the lesson."""
    topo = leafspine(rate=20.0, load_balancing="spray")
    with built(topo) as fab:
        d = fab.describe()["builder"]
        assert d["spray"]["leaf1"]["ports"] == ["spine1", "spine2"], d["spray"]
        assert d["shared_macs"]["spine1:leaf1"] == d["shared_macs"]["spine2:leaf1"]

        def spine_bytes():
            return {s: sum(x.sent_bytes for x in qdisc.port_stats(fab.ns("leaf1"), s)) for s in ("spine1", "spine2")}

        before, tcp0 = spine_bytes(), counters.tcp_counters(fab.ns("h1"))
        got = bulk(fab, [("h1", "h3")], 3.0)
        after, tcp1 = spine_bytes(), counters.tcp_counters(fab.ns("h1"))
        per_spine = {s: after[s] - before[s] for s in after}
        total = sum(per_spine.values())
        retrans = tcp1["TcpRetransSegs"] - tcp0["TcpRetransSegs"]
        out = tcp1["TcpOutSegs"] - tcp0["TcpOutSegs"]
        with fab_ipr(fab, "leaf1") as ipr:
            moved = {s: spray.moved_packets(ipr, s) for s in ("spine1", "spine2")}
        print(f"spray, one flow: per-spine bytes {per_spine} (spine1 share {per_spine['spine1'] / total:.3f}); "
              f"received {got[0]} B = {got[0] * 8 / 3.0 / 1e6:.1f} Mbit/s; sprayer moved {moved} packets; "
              f"TCP retransmitted {retrans} of {out} segments ({retrans / max(out, 1):.2%})")
        # (the split is the point, not the rate: a CPU-starved VM stalled this flow to 0.7 Mbit/s once)
        assert got[0] > 200_000 and total > 200_000, got
        for s in ("spine1", "spine2"):
            assert 0.3 <= per_spine[s] / total <= 0.7, per_spine
        assert sum(moved.values()) > 0, moved


@pytest.mark.parametrize("rate", [10.0])
def test_shaped_path_runs_at_the_configured_rate(rate):
    """10 Mbit/s in the lab VM (measured 0.95 of the rate). At 100 Mbit/s the software-emulated VM, whose two vCPUs
    also run both TCP ends and forward every packet through two routers, carried 0.91 while its timers woke on time
    (p95 0.69 ms late): that rate is checked on the real CPU by tests/host/test_shaper_real_cpu.py (measured
    0.97-1.00)."""
    m = shaped_path_ratio(rate)
    assert 0.93 <= m["ratio"] <= 1.02, m["why"]


def test_netem_delay_sits_on_the_wire_not_in_the_queue():
    topo = DumbbellSpec(senders=1, sender_link=LinkSpec(50), bottleneck_link=LinkSpec(50, delay_ms=10))
    with built(topo) as fab:
        assert fab.ifb, "no IFB/netem built for a delayed link"
        rip = fab.host_ip("r1")
        with netns.entered(fab.ns("r1")):
            ls = socket.socket()
        ls.bind((rip, 5410))
        ls.listen(1)
        with netns.entered(fab.ns("h1")):
            c = socket.socket()
        t = time.monotonic()
        c.connect((rip, 5410))
        rtt = time.monotonic() - t
        c.close()
        ls.close()
        print(f"handshake RTT over a 10 ms-per-direction link: {rtt * 1e3:.1f} ms")
        assert rtt >= 0.019, rtt
        # the shaped egress s1 -> s2 holds no netem: its only leaf is the droptail queue
        kinds = [s.kind for s in qdisc.port_stats(fab.ns("s1"), "s2")]
        assert kinds == ["bfifo"], kinds


def test_queues_follow_the_spec_and_the_sampler_sees_them(tmp_path):
    red = QueueSpec("red", buffer_bytes=200_000, min_bytes=20_000, max_bytes=60_000, probability=0.1, ecn=True)
    step = QueueSpec("step", buffer_bytes=200_000, k_packets=20)
    topo = leafspine(leaf_down_queue=red, spine_queue=step, tcp=HostTcpSpec(ecn=True, rto_min_ms=5))
    with built(topo) as fab:
        assert [s.kind for s in qdisc.port_stats(fab.ns("leaf1"), "h1")] == ["red"]
        assert [s.kind for s in qdisc.port_stats(fab.ns("spine1"), "leaf1")] == ["red"]  # step = RED, W=1
        assert [s.kind for s in qdisc.port_stats(fab.ns("leaf1"), "spine1")] == ["bfifo"]
        assert netns.sysctl_read(fab.ns("h1"), "net.ipv4.tcp_ecn") == "1"
        assert netns.sysctl_read(fab.ns("leaf1"), "net.ipv4.fib_multipath_hash_policy") == "1"
        assert netns.sysctl_read(fab.ns("spine1"), "net.ipv4.ip_forward") == "1"
        sampler = QueueSampler(fab, interval_s=0.001)
        with sampler:
            bulk(fab, [("h3", "h1")], 0.5)
        # the lean netlink parser the sampler uses reads what pyroute2 + qdisc.leaf_stats read
        for node, port in (("leaf1", "h1"), ("spine1", "leaf1")):
            ns = fab.ns(node)
            with netns.entered(ns):
                idx = socket.if_nametoindex(port)
            raw = RawQdiscDump(ns)
            try:
                fast = raw.leaf_stats()[idx]
            finally:
                raw.close()
            ref = qdisc.port_stats(ns, port)
            assert [(q.minor, q.kind, q.marks, q.drops) for q in fast] == \
                   [(q.minor, q.kind, q.marks, q.drops) for q in ref]
            assert abs(fast[0].sent_bytes - ref[0].sent_bytes) <= 0.01 * ref[0].sent_bytes + 200
        rows = [r for r in sampler.rows if (r[1], r[2]) == ("leaf1", "h1")]
        assert rows and max(r[8] for r in rows) > 0, "sampler saw no bytes on leaf1:h1"
        assert len(sampler.ports) == len(fab.ports()) == 2 * len(topo.links)
        sampler.write(_Dir(tmp_path))
        head = (tmp_path / "queues.csv").read_text().splitlines()[0]
        assert head == "t_s,node,port,class,backlog_bytes,backlog_packets,drops,marks,sent_bytes,sent_packets," \
                       "overlimits"
        print(f"sampler: {sampler.ticks} rounds over {len(sampler.ports)} ports, achieved interval "
              f"{sampler.achieved_interval_s * 1e3:.2f} ms (asked 1 ms), CPU busy {sampler.cpu.mean_busy:.2f}")


class _Dir:
    """The one RunDir method the sampler uses."""

    def __init__(self, path):
        self.path = path

    def write_csv(self, name, columns, rows):
        import csv

        with open(self.path / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns)
            w.writerows(rows)


def test_dscp_classes_and_strict_priority_starves_the_low_class():
    """DSCP 46 lands in the strict-priority class "ctrl", everything else in the weighted default "bulk"; when both
    saturate the 10 Mbit/s uplink, ctrl keeps (nearly) the whole link and bulk is starved, per the class counters."""
    classes = (ClassSpec("bulk", dscp=[0], weight=1, default=True), ClassSpec("ctrl", dscp=[46], priority=0))
    topo = LeafSpineSpec(spines=1, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(20), fabric_link=LinkSpec(10),
                         classes=classes)
    with built(topo) as fab:
        plan = fab.port_plan("leaf1", "spine1")

        def by_class():
            return {plan.class_label(q.minor): q.sent_bytes for q in qdisc.port_stats(fab.ns("leaf1"), "spine1")}

        got = bulk(fab, [("h1", "h3")], 0.5, port=5420, tos={0: 46 << 2})  # a short ctrl-only flow: classification
        first = by_class()
        print("leaf1 -> spine1 bytes per class, ctrl flow alone:", first, got)
        assert first["ctrl"] > 0.9 * got[0] and first["bulk"] < 20_000, first

        # both saturating: counters read over a window inside the flows' lifetime (after it, bulk drains its
        # socket buffer onto an idle link)
        window = {}

        def measure():
            time.sleep(1.0)
            t0, a = time.monotonic(), by_class()
            time.sleep(2.0)
            window.update(seconds=time.monotonic() - t0, a=a, b=by_class())

        m = threading.Thread(target=measure)
        m.start()
        got = bulk(fab, [("h1", "h3"), ("h2", "h4")], 3.5, port=5421, tos={0: 46 << 2})
        m.join()
        rate = {k: (window["b"][k] - window["a"][k]) * 8 / window["seconds"] / 10e6 for k in window["a"]}
        print(f"both saturating the 10 Mbit/s uplink: share of the link per class {rate}; received {got}")
        assert rate["ctrl"] >= 0.85, rate
        assert rate["bulk"] <= 0.05, rate

