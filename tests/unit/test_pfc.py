"""PFC emulation without a kernel: plug netlink messages, who feeds whom, the XOFF/XON hysteresis and pause logic
against fake plug sockets, headroom math, and the pfc-hol scenario's one-line input errors."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest

from testbed.errors import UsageError
from testbed.network.fabric import Fabric
from testbed.params import resolve
from testbed.kernel.plug import (NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, PLUG_BUFFER,
                                 PLUG_RELEASE_INDEFINITE, RTM_NEWQDISC, plug_message, tc_handle)
from testbed.kernel.qdisc import QueueSample
from testbed.pfc.controller import PfcController, _Sockets
from testbed.pfc.queues import feeders_of, headroom_needed
from analysis.metrics import maxmin_share
from testbed.workloads.lossless_incast import build_spec, effective
from testbed.scenario import get

PARAMS = get("pfc-hol").params


def p(*sets):
    return resolve(PARAMS, list(sets))


def test_plug_message_layout():
    msg = plug_message(RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 7, 3,
                       tc_handle(0x11), tc_handle(1, 0x11), PLUG_BUFFER, 150_000)
    ln, typ, flags, seq, pid = struct.unpack_from("=LHHLL", msg)
    assert (ln, typ, seq, pid) == (len(msg), RTM_NEWQDISC, 7, 0) and flags & NLM_F_CREATE
    fam, ifindex, handle, parent, info = struct.unpack_from("=BxxxiIII", msg, 16)
    assert (fam, ifindex, handle, parent, info) == (0, 3, 0x00110000, 0x00010011, 0)
    # TCA_KIND "plug\0" padded to 4, then TCA_OPTIONS struct tc_plug_qopt {int action; u32 limit}
    assert struct.unpack_from("=HH", msg, 36) == (9, 1) and msg[40:45] == b"plug\0"
    assert struct.unpack_from("=HHiI", msg, 48) == (12, 2, PLUG_BUFFER, 150_000)
    assert len(msg) == 60
    change = plug_message(RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK, 8, 3, 0x110000, 0x10011, PLUG_RELEASE_INDEFINITE)
    assert struct.unpack_from("=iI", change, 52) == (PLUG_RELEASE_INDEFINITE, 0)
    assert not struct.unpack_from("=LHH", change)[2] & NLM_F_CREATE


def _controller(mode="lossless", **kw):
    params = p(f"mode={mode}", *[f"{k}={v}" for k, v in kw.items()])
    topo = build_spec(params)[0]
    return PfcController(Fabric(topo, "unit"), interval_s=0.001), topo


def test_feeders_are_the_neighbours_pointing_at_the_switch():
    _, topo = _controller()
    f = feeders_of(topo)
    assert f[("leaf1", "h1")] == [("h2", "eth0"), ("h3", "eth0"), ("spine1", "leaf1")]
    assert f[("spine1", "leaf1")] == [("leaf2", "spine1")]
    assert f[("leaf2", "spine1")] == [("h4", "eth0"), ("h5", "eth0"), ("h6", "eth0")]
    assert ("h1", "eth0") not in f  # hosts are never watched, only paused


def test_every_port_has_the_lossless_class_and_its_thresholds():
    ctl, _ = _controller()
    assert len(ctl.queues) == 16  # 6 host NICs + 10 switch ports, class rdma (minor 0x11)
    q = ctl.queues[("leaf1", "h1", 0x11)]
    assert (q.pcp, q.xoff, q.xon, q.headroom, q.limit, q.leaf_kind) == (3, 15_000, 7_500, 100_000, 120_000, "bfifo")
    assert ctl.queues[("h4", "eth0", 0x11)].limit == 1_000_000
    ecn, _ = _controller("lossless_ecn")
    assert ecn.queues[("leaf1", "h1", 0x11)].leaf_kind == "step"


class FakePlugs:
    def __init__(self):
        self.calls = []

    def block(self, ifindex, handle, parent):
        self.calls.append(("block", ifindex))

    def release(self, ifindex, handle, parent):
        self.calls.append(("release", ifindex))


def test_hysteresis_pauses_feeders_and_cascades():
    ctl, _ = _controller()
    plugs = FakePlugs()
    fake = {q.ns: plugs for q in ctl.queues.values()}
    for i, q in enumerate(ctl.queues.values()):
        q.ifindex = i + 1
    leaf1 = [q for q in ctl.queues.values() if q.node == "leaf1"]
    down = ctl.queues[("leaf1", "h1", 0x11)]

    def tick(q, t, backlog):
        if ctl._watch(q, t, backlog):
            ctl._drive([x for x in ctl.queues.values() if x.node == q.node], fake)

    tick(down, 1.0, 10_000)  # below XOFF: nothing
    assert not plugs.calls
    tick(down, 1.1, 16_000)  # above XOFF: h2, h3 and spine1 -> leaf1 paused, not h1 (the congested port's peer)
    paused = {(q.node, q.port) for q in ctl.queues.values() if q.paused}
    assert paused == {("h2", "eth0"), ("h3", "eth0"), ("spine1", "leaf1")}
    assert ctl.reactions and ctl.reactions[0] >= 0.1 - 1e-9  # ack - last sample below XOFF (1.0)
    tick(down, 1.2, 10_000)  # between XON and XOFF: still paused
    assert ctl.queues[("spine1", "leaf1", 0x11)].paused
    # the paused spine port fills and pauses leaf2 -> spine1 in turn
    sp = ctl.queues[("spine1", "leaf1", 0x11)]
    tick(sp, 1.25, 20_000)
    assert ctl.queues[("leaf2", "spine1", 0x11)].paused
    tick(down, 1.3, 7_500)  # at XON: leaf1's feeders resume
    assert not ctl.queues[("spine1", "leaf1", 0x11)].paused
    assert ctl.queues[("leaf2", "spine1", 0x11)].paused  # spine1 is still congested
    ev = [e[4] for e in ctl.events]
    assert ev.count("above_xoff") == 2 and ev.count("below_xon") == 1 and ev.count("xoff") == 4
    assert ev.count("xon") == 3
    assert all(q.pause_events <= 1 for q in leaf1)


class FakeDump:
    """A namespace's qdisc dump: each lossless queue at the backlog set in ``backlog`` (by (node, port))."""

    def __init__(self, queues, backlog):
        self.queues, self.backlog = queues, backlog

    def leaf_stats(self):
        return {q.ifindex: [QueueSample(q.minor, "bfifo", self.backlog.get((q.node, q.port), 0), 0, 0, 0, 1000, 1, 0)]
                for q in self.queues}


class NoCommands:
    def poll(self):
        return False


def test_the_poll_loop_samples_every_queue_pauses_on_a_crossing_and_releases_everything_at_the_end():
    """The controller process's tick (testbed.pfc.controller: _tick, _sample, _release_all) over fake dumps and
    plugs: every tick writes one queues.csv row per sampled queue (hosts every host_every ticks), a switch queue above
    XOFF pauses its feeders, and leaving the loop resumes every paused port with an xon row."""
    ctl, _ = _controller()
    ctl.host_every = 2
    ctl._cmds = NoCommands()
    plugs = FakePlugs()
    for i, q in enumerate(ctl.queues.values()):
        q.ifindex = i + 1
    backlog = {}
    socks = _Sockets()
    for q in ctl.queues.values():
        socks.queues.setdefault(q.ns, []).append(q)
    socks.order = sorted(socks.queues, key=lambda ns: not any(q.is_switch for q in socks.queues[ns]))
    socks.is_switch = {ns: any(q.is_switch for q in qs) for ns, qs in socks.queues.items()}
    socks.dumps = {ns: FakeDump(qs, backlog) for ns, qs in socks.queues.items()}
    socks.plugs = {ns: plugs for ns in socks.queues}
    switch_queues = sum(q.is_switch for q in ctl.queues.values())

    ctl._tick(socks)  # tick 0: switches and hosts
    assert len(ctl.queue_rows) == len(ctl.queues) and not plugs.calls
    ctl._tick(socks)  # tick 1: switches only
    assert len(ctl.queue_rows) == len(ctl.queues) + switch_queues
    backlog[("leaf1", "h1")] = 16_000  # above XOFF: leaf1's feeders pause
    ctl._tick(socks)
    assert {(q.node, q.port) for q in ctl.queues.values() if q.paused} == {("h2", "eth0"), ("h3", "eth0"),
                                                                           ("spine1", "leaf1")}
    assert [c[0] for c in plugs.calls] == ["block"] * 3 and ctl.ticks == 3
    ctl.t_stop = ctl.queues[("h2", "eth0", 0x11)].paused_since + 0.5
    ctl._release_all(socks.plugs)
    assert not any(q.paused for q in ctl.queues.values())
    assert [c[0] for c in plugs.calls].count("release") == 3
    assert [e[4] for e in ctl.events].count("xon") == 3
    assert ctl.queues[("h2", "eth0", 0x11)].paused_total == pytest.approx(0.5)


def test_watchdog_releases_and_ignores_pauses_for_a_while():
    ctl, _ = _controller()
    ctl.watchdog_s, ctl.restore_s = 0.0, 10.0
    plugs = FakePlugs()
    fake = {q.ns: plugs for q in ctl.queues.values()}
    down = ctl.queues[("leaf1", "h1", 0x11)]
    ctl._watch(down, 1.0, 50_000)
    ctl._drive([x for x in ctl.queues.values() if x.node == "leaf1"], fake)
    ctl._watchdog(fake)
    sp = ctl.queues[("spine1", "leaf1", 0x11)]
    assert not sp.paused and sp.watchdog_events == 1
    assert any(e[4] == "watchdog" and e[1] == "spine1" for e in ctl.events)
    ctl._drive([x for x in ctl.queues.values() if x.node == "leaf1"], fake)  # still congested, but ignored
    assert not sp.paused


def test_summary_keys():
    ctl, _ = _controller()
    s = ctl.summary()
    for k in ("pfc_pause_events", "pfc_paused_ms_total", "pfc_paused_fraction_max", "pfc_watchdog_events",
              "pfc_reaction_ms_p95", "pfc_headroom_needed_bytes"):
        assert k in s


def test_headroom_and_fair_share_math():
    assert headroom_needed(1_500_000, 0.05) == 75_000 + 2 * 1514
    assert maxmin_share(1, [0.5, 0.5], 3) == 1  # the fabric fits everything: the victim's line rate
    assert maxmin_share(10, [5, 5], 20) == 10
    assert maxmin_share(10, [10], 15) == 7.5
    assert maxmin_share(4, [4, 4, 4], 8) == 2


def test_modes():
    assert effective(p("mode=lossy")) == {"discipline": "droptail", "ecn": False, "cc": "reno", "lossless": False}
    assert effective(p("mode=lossless_ecn")) == {"discipline": "step", "ecn": True, "cc": "dctcp", "lossless": True}
    topo, rx, rv, senders, victim = build_spec(p("senders=3"))
    assert (rx, rv, senders, victim) == ("h1", "h2", ["h5", "h6", "h7"], "h8")
    c = {x.name: x for x in topo.port_spec("spine").classes}
    assert c["rdma"].lossless and c["rdma"].pcp == 3 and not c["bulk"].lossless and c["bulk"].default
    assert not {x.name: x for x in build_spec(p("mode=lossy"))[0].port_spec("spine").classes}["rdma"].lossless


@pytest.mark.parametrize("sets, words", [
    (["xon_bytes=40000"], "xon_bytes: must be < xoff_bytes"),
    (["xon_bytes=15000"], "xon_bytes: must be < xoff_bytes"),
    (["mode=lossy", "xon_bytes=15000"], "xon_bytes: must be < xoff_bytes"),
    (["xoff_bytes=30000"], "xoff_bytes + headroom_bytes must fit the buffer"),
    (["discipline=red"], "lossless class cannot use a RED queue without ecn"),
    (["mode=lossless_ecn", "k_bytes=119000"], "k_bytes"),
])
def test_bad_input_is_one_usage_error(sets, words):
    with pytest.raises(UsageError) as e:
        build_spec(p(*sets))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_red_with_ecn_is_a_legal_lossless_queue_and_red_drop_is_fine_when_lossy():
    build_spec(p("discipline=red", "mode=lossless_ecn"))
    build_spec(p("discipline=red", "mode=lossy"))


def test_cli_exits_2_with_one_line_before_building():
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "pfc-hol", "--set", "xon_bytes=30000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "xon_bytes" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_registered():
    sc = get("pfc-hol")
    assert sc.name == "pfc-hol" and "qdisc:plug" in sc.needs
    assert {"mode", "xoff_bytes", "xon_bytes", "headroom_bytes", "watchdog_ms"} <= {x.name for x in sc.params}


class FakeFrames:
    def __init__(self):
        self.sent = []

    def send(self, ns, ifname, pcp, pause):
        self.sent.append((ns, ifname, pcp, pause))


def test_each_pause_and_resume_is_a_frame_from_the_paused_ports_peer():
    ctl, _ = _controller()
    ctl.frames = FakeFrames()
    plugs = FakePlugs()
    fake = {q.ns: plugs for q in ctl.queues.values()}
    down = ctl.queues[("leaf1", "h1", 0x11)]
    leaf1 = [x for x in ctl.queues.values() if x.node == "leaf1"]
    ctl._watch(down, 1.0, 16_000)
    ctl._drive(leaf1, fake)
    # leaf1 is congested towards h1: it sends XOFF out of its ports to h2, h3 and spine1 (the paused feeders)
    ns = ctl.fabric.ns("leaf1")
    assert sorted(ctl.frames.sent) == sorted([(ns, "h2", 3, True), (ns, "h3", 3, True), (ns, "spine1", 3, True)])
    ctl._watch(down, 1.1, 7_000)
    ctl._drive(leaf1, fake)
    assert sorted(ctl.frames.sent[3:]) == sorted([(ns, "h2", 3, False), (ns, "h3", 3, False),
                                                  (ns, "spine1", 3, False)])


def test_pfc_frame_layout():
    from testbed.pfc.frame import pfc_frame

    f = pfc_frame("02:00:00:00:00:01", 3, 0xFFFF)
    assert len(f) == 60  # padded to the 64-byte minimum (without FCS)
    assert f[:6] == bytes.fromhex("0180c2000001") and f[6:12] == bytes.fromhex("020000000001")
    assert struct.unpack("!HHH", f[12:18]) == (0x8808, 0x0101, 1 << 3)  # MAC control, PFC, priority 3 enabled
    times = struct.unpack("!8H", f[18:34])
    assert times == (0, 0, 0, 0xFFFF, 0, 0, 0, 0)
    assert struct.unpack("!8H", pfc_frame("02:00:00:00:00:01", 3, 0)[18:34]) == (0,) * 8  # XON
    with pytest.raises(ValueError):
        pfc_frame("02:00:00:00:00:01", 8, 1)


def test_a_lossy_fabric_is_watched_on_the_same_class_without_pausing():
    from testbed.pfc.run import PfcRun, watch_class

    topo = build_spec(p("mode=lossy"))[0]
    fabric = Fabric(topo, "unit")
    assert not PfcController(fabric).queues  # no lossless class to find
    ctl = watch_class(fabric, "rdma", pcp=3, xoff_bytes=15_000, xon_bytes=7_500, headroom_bytes=100_000,
                      interval_s=0.001)
    assert not ctl.enabled and len(ctl.queues) == 16
    q = ctl.queues[("leaf1", "h1", 0x11)]
    assert (q.pcp, q.xoff, q.xon, q.headroom, q.limit, q.is_switch) == (3, 15_000, 7_500, 100_000, 120_000, True)
    run = PfcRun(ctl, rundir=None)
    assert len(run.switch_ports) == 10 and len(run.host_ports) == 6
    # the drop accounting: what the counters grew by between start() and finish()
    from types import SimpleNamespace as S

    run.before = {("leaf1", "h1"): S(drops=2, marks=0), ("h1", "eth0"): S(drops=0, marks=0)}
    run.after = {("leaf1", "h1"): S(drops=7, marks=3), ("h1", "eth0"): S(drops=1, marks=0)}
    assert run.delta("drops", run.switch_ports) == 5 and run.delta("drops", run.host_ports) == 1
    assert run.delta("marks", run.switch_ports) == 3 and run.drops_by_port() == "leaf1:h1=5"
