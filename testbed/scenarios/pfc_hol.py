"""pfc-hol: PFC head-of-line blocking. An incast into one receiver in a lossless class, plus a victim flow that
shares the incast's upstream links but goes to an idle receiver.

    leaf-spine, 1 spine, 2 leaves:

        h(senders) on leaf2 --\\                                     /--> h1  (incast receiver: the congested port)
                               leaf2 ==[fabric]==> spine1 ==> leaf1
        h(victim)  on leaf2 --/                                     \\--> h2  (victim receiver: idle)

Every flow is kernel TCP with DSCP 26 (class ``rdma``, strict priority 1, 802.1p priority ``pcp``); ACKs carry
DSCP 0 (class ``bulk``, priority 0, lossy). mode:

* ``lossy``: no PFC; the incast overflows leaf1 -> h1 and drops.
* ``lossless``: ``rdma`` is lossless: testbed.pfc pauses every port feeding a switch whose ``rdma`` egress queue is
  above XOFF, until it drains to XON. leaf1 -> h1 fills -> spine1 -> leaf1 paused -> spine1's queue fills ->
  leaf2 -> spine1 paused -> the victim, which only shares those links, is stuck behind the incast.
* ``lossless_ecn``: the same plus DCTCP-style marking at K = k_bytes (< XOFF) on every switch queue and DCTCP on
  the hosts: the senders back off before XOFF, fewer pauses.

summary.json: incast goodput, loss and retransmits, victim goodput and its max-min fair share, PFC pause counts,
paused time, reaction time, lossless drops (switch ports; host NICs separately).
"""

from __future__ import annotations

import selectors
import socket
import threading
import time

from testbed.errors import UsageError
from testbed.params import Param
from testbed.scenario import RunContext, Scenario

PORT = 5401
DSCP_LOSSLESS = 26
PCP = 3

PARAMS = [
    Param("mode", str, "lossless", "", "lossy (no PFC), lossless (PFC), lossless_ecn (PFC + DCTCP marking at K)",
          choices=("lossy", "lossless", "lossless_ecn")),
    Param("senders", int, 2, "", "incast senders (on leaf2, with the victim)", min=1, max=8),
    Param("duration_s", float, 3.0, "s", "how long every flow sends", min=0.5, max=120),
    Param("host_rate_mbps", float, 1.0, "Mbit/s", "host link rate", min=0.1, max=10_000),
    Param("fabric_rate_mbps", float, 3.0, "Mbit/s", "leaf-spine link rate (default: senders + victim fit)",
          min=0.1, max=10_000),
    Param("buffer_bytes", int, 120_000, "bytes", "every switch port's queue", min=3000, max=1 << 30),
    Param("host_buffer_bytes", int, 1_000_000, "bytes", "host NIC queue", min=3000, max=1 << 30),
    Param("discipline", str, "droptail", "", "switch queue discipline (lossless_ecn turns droptail into step)",
          choices=("droptail", "red", "step")),
    Param("k_bytes", int, 10_000, "bytes", "ECN marking threshold K (step; RED min, max = min(3K, buffer))",
          min=1500, max=1 << 30),
    Param("xoff_bytes", int, 15_000, "bytes", "PFC XOFF threshold (a switch queue above it pauses its feeders)",
          min=1, max=1 << 30),
    Param("xon_bytes", int, 7_500, "bytes", "PFC XON threshold (resume at or below)", min=0, max=1 << 30),
    Param("headroom_bytes", int, 100_000, "bytes", "buffer kept above XOFF for what arrives during the reaction",
          min=0, max=1 << 30),
    Param("poll_interval_ms", float, 1.0, "ms", "PFC controller poll interval (one dump per namespace)", min=0.1,
          max=1000),
    Param("watchdog_ms", float, 0.0, "ms", "PFC watchdog: release a port paused longer than this (0: off)", min=0,
          max=60_000),
    Param("watchdog_restore_ms", float, 200.0, "ms", "after a watchdog release, ignore pauses for this long", min=0,
          max=60_000),
    Param("cc", str, "reno", "", "congestion control (lossless_ecn uses dctcp); reno: slow start runs until loss "
          "(cubic's HyStart leaves it early on a deep buffer)",
          choices=("cubic", "reno", "dctcp", "bbr")),
    Param("rto_min_ms", int, 200, "ms", "per-route TCP rto_min on the hosts", min=1, max=120_000),
    Param("pause_frames", bool, True, "", "send each pause and resume as a real 802.1Qbb PFC frame on the link "
          "(a capture shows them; the plug qdisc does the pausing either way)"),
    Param("capture", str, "", "", "packet capture at one port, NODE:IFNAME (e.g. spine1:leaf1, a port that gets "
          "paused: it receives the PFC frames); empty: none. Decoded into the wire_* summary numbers"),
    Param("seed", int, 0, "", "multipath hash seed (0: the run's --seed)", min=0, max=2**32 - 1),
]


def _queue(p: dict, discipline: str, ecn: bool):
    from topologies import QueueSpec

    b, k = p["buffer_bytes"], p["k_bytes"]
    if discipline == "droptail":
        return QueueSpec("droptail", buffer_bytes=b)
    if discipline == "red":
        return QueueSpec("red", buffer_bytes=b, min_bytes=k, max_bytes=min(3 * k, b), probability=0.1, ecn=ecn)
    return QueueSpec("step", buffer_bytes=b, k_bytes=k)


def effective(p: dict) -> dict:
    """What the mode implies: discipline, ecn, cc, lossless."""
    mode = p["mode"]
    disc = p["discipline"]
    ecn = mode == "lossless_ecn"
    if ecn and disc == "droptail":
        disc = "step"
    cc = "dctcp" if ecn else p["cc"]
    if cc == "dctcp":
        ecn = True
    return {"discipline": disc, "ecn": ecn, "cc": cc, "lossless": mode != "lossy"}


def build_spec(p: dict, seed: int = 0):
    """(topology, incast receiver, victim receiver, senders, victim). UsageError (one line) on bad input; the PFC
    thresholds are checked in every mode (lossy runs the same class, just without pauses)."""
    from topologies import ClassSpec, HostTcpSpec, LeafSpineSpec, LinkSpec, QueueSpec, SpecError

    e = effective(p)
    if e["discipline"] == "step" and p["k_bytes"] + 1500 > p["buffer_bytes"]:
        raise UsageError(f"k_bytes ({p['k_bytes']}) + one packet (1500) must be <= buffer_bytes "
                         f"({p['buffer_bytes']}) for step marking")
    if e["discipline"] == "red" and p["k_bytes"] >= p["buffer_bytes"]:
        raise UsageError(f"k_bytes ({p['k_bytes']}) must be < buffer_bytes ({p['buffer_bytes']}) for RED")
    try:
        thresholds = dict(pcp=PCP, xoff_bytes=p["xoff_bytes"], xon_bytes=p["xon_bytes"],
                          headroom_bytes=p["headroom_bytes"])
        # checked even in lossy mode (the same numbers would be used with PFC on)
        ClassSpec("rdma", dscp=[DSCP_LOSSLESS], priority=1, lossless=True, **thresholds)
        if e["lossless"]:
            rdma = ClassSpec("rdma", dscp=[DSCP_LOSSLESS], priority=1, lossless=True, **thresholds)
        else:
            rdma = ClassSpec("rdma", dscp=[DSCP_LOSSLESS], priority=1)
        bulk = ClassSpec("bulk", dscp=[0], priority=0, default=True)
        q = _queue(p, e["discipline"], e["ecn"])
        hq = QueueSpec("droptail", buffer_bytes=p["host_buffer_bytes"])
        tcp = HostTcpSpec(congestion_control=e["cc"], ecn=e["ecn"], rto_min_ms=p["rto_min_ms"])
        n = p["senders"]
        topo = LeafSpineSpec(spines=1, leaves=2, hosts_per_leaf=max(2, n + 1), host_link=LinkSpec(p["host_rate_mbps"]),
                             fabric_link=LinkSpec(p["fabric_rate_mbps"]), host_queue=hq, leaf_down_queue=q,
                             leaf_up_queue=q, spine_queue=q, classes=(bulk, rdma), tcp=tcp,
                             seed=(p["seed"] or seed) % 2**32)
    except SpecError as err:
        raise UsageError(str(err)) from None
    leaf2 = topo.hosts_of("leaf2")
    return topo, "h1", "h2", list(leaf2[:n]), leaf2[n]


def _validate(p: dict) -> None:
    from testbed import capture

    topo = build_spec(p)[0]
    capture.parse_spec(p["capture"], topo.addresses)


def maxmin_share(victim_cap: float, incast_caps: list[float], link: float) -> float:
    """Max-min fair rate of the victim on a link shared with the incast flows, each flow capped by its own
    bottleneck (water-filling)."""
    flows = sorted([(c, False) for c in incast_caps] + [(victim_cap, True)])
    left = link
    for k, (cap, is_victim) in enumerate(flows):
        rate = min(cap, left / (len(flows) - k))
        if is_victim:
            return rate
        left -= rate
    return 0.0


class _Sink(threading.Thread):
    """Reads every accepted connection; counts bytes per connection until the deadline."""

    def __init__(self, conns: dict[socket.socket, str]):
        super().__init__(name="pfc-sink", daemon=True)
        self.conns = conns
        self.bytes = {name: 0 for name in conns.values()}
        self.deadline = float("inf")
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        for c, name in self.conns.items():
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ, name)
        buf = bytearray(1 << 18)
        try:
            while not self.stopping.is_set():
                for key, _ in sel.select(timeout=0.1):
                    try:
                        k = key.fileobj.recv_into(buf)
                    except BlockingIOError:
                        continue
                    if k == 0:
                        sel.unregister(key.fileobj)
                        continue
                    if time.monotonic() <= self.deadline:
                        self.bytes[key.data] += k
        except BaseException as e:  # noqa: BLE001
            self.error = e
        finally:
            sel.close()


def _run(p: dict, ctx: RunContext) -> dict:
    from testbed.fabric import Fabric
    from testbed.kernel import counters, netns, qdisc
    from testbed.pfc import PfcController

    topo, rx_incast, rx_victim, senders, victim = build_spec(p, ctx.seed)
    e = effective(p)
    fabric = Fabric(topo, ctx.run_id)
    ctx.progress(f"pfc-hol {p['mode']}: {len(topo.nodes)} namespaces, incast {','.join(senders)} -> {rx_incast}, "
                 f"victim {victim} -> {rx_victim}, {e['discipline']} {p['buffer_bytes']} B, cc {e['cc']}")
    fabric.build(ctx.state, ctx.on_teardown)
    ctx.rundir.manifest["topology"] = fabric.describe()
    ctx.rundir.write_manifest()
    pfc = PfcController(fabric, interval_s=p["poll_interval_ms"] / 1000.0, watchdog_ms=p["watchdog_ms"],
                        watchdog_restore_ms=p["watchdog_restore_ms"], enabled=e["lossless"],
                        frames=p["pause_frames"])
    if not pfc.queues:  # lossy: watch the same class on every switch port anyway (queues.csv, drops)
        pfc = _lossy_watch(fabric, p)
    ctx.on_teardown(pfc.close)
    pfc.install()

    from testbed import capture as capm

    cap = None
    where = capm.parse_spec(p["capture"], topo.addresses)
    if where:
        cap = capm.PortCapture(fabric.ns(where[0]), where[0], where[1], ctx.rundir.path / capm.file_name(*where),
                               netns.popen)
        ctx.on_teardown(cap.stop)
        cap.start()
        ctx.progress(f"capturing {where[0]}:{where[1]} into {cap.path.name} (tcpdump -s {cap.snaplen})")

    cc = e["cc"].encode()
    tos = DSCP_LOSSLESS << 2
    listeners = {}
    for r in (rx_incast, rx_victim):
        with netns.entered(fabric.ns(r)):
            ls = socket.socket()
        ctx.on_teardown(ls.close)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc)
        ls.bind((fabric.host_ip(r), PORT))
        ls.listen(16)
        ls.settimeout(30)
        listeners[r] = ls
    flows = [(h, rx_incast) for h in senders] + [(victim, rx_victim)]
    socks = []
    conns: dict[socket.socket, str] = {}
    for h, r in flows:
        with netns.entered(fabric.ns(h)):
            s = socket.socket()
        ctx.on_teardown(s.close)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        s.settimeout(30)
        s.connect((fabric.host_ip(r), PORT))
        c, _ = listeners[r].accept()
        ctx.on_teardown(c.close)
        conns[c] = h
        socks.append((h, s))
    sink = _Sink(conns)

    switch_ports = [(n, i) for n, _, i in fabric.ports() if topo.node(n).role != "host"]
    host_ports = [(n, i) for n, _, i in fabric.ports() if topo.node(n).role == "host"]
    cls_minor = {q.minor for q in pfc.queues.values()}

    def class_stats():
        out = {}
        for n, i in switch_ports + host_ports:
            for s in qdisc.port_stats(fabric.ns(n), i):
                if s.minor in cls_minor:
                    out[(n, i)] = s
        return out

    hosts = [*senders, victim, rx_incast, rx_victim]
    before_q = class_stats()
    before = {h: counters.tcp_counters(fabric.ns(h)) for h in hosts}
    pfc.start()  # forks: before the sink and sender threads exist
    sink.start()
    dur = p["duration_s"]
    t0 = time.monotonic()
    sink.deadline = t0 + dur
    errors: list[BaseException] = []

    def send(s: socket.socket) -> None:
        buf = bytes(1 << 16)
        s.settimeout(0.2)
        try:
            while time.monotonic() < t0 + dur:
                try:
                    s.send(buf)
                except (socket.timeout, BlockingIOError):
                    pass
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    ctx.progress(f"{len(flows)} TCP flows for {dur} s (DSCP {DSCP_LOSSLESS}, pcp {PCP}, PFC "
                 f"{'on' if e['lossless'] else 'off'})")
    threads = [threading.Thread(target=send, args=(s,), daemon=True) for _, s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=dur + 30)
    time.sleep(0.05)
    t_end = time.monotonic()
    pfc.stop()
    cap_stats = cap.stop() if cap else {}
    sink.stopping.set()
    sink.join(timeout=5)
    after_q = class_stats()
    after = {h: counters.tcp_counters(fabric.ns(h)) for h in hosts}
    if errors:
        raise errors[0]
    if sink.error:
        raise sink.error

    pfc.write(ctx.rundir)
    ctx.rundir.write_csv("tcp.csv", ["host", "phase", "counter", "value"],
                         [(h, ph, k, d[h].get(k, 0)) for ph, d in (("before", before), ("after", after))
                          for h in hosts for k in counters.KEY_COUNTERS])

    def qd(ports, attr):
        return sum(getattr(after_q[x], attr) - getattr(before_q[x], attr) for x in ports if x in after_q)

    def td(key, hs):
        return sum(after[h].get(key, 0) - before[h].get(key, 0) for h in hs)

    bn = ("leaf1", rx_incast)
    bn_drops, bn_sent = qd([bn], "drops"), qd([bn], "sent_packets")
    incast_bytes = sum(sink.bytes[h] for h in senders)
    victim_mbps = sink.bytes[victim] * 8 / dur / 1e6
    hr, fr = p["host_rate_mbps"], p["fabric_rate_mbps"]
    n = len(senders)
    fair = maxmin_share(hr, [hr / n] * n, fr)  # incast flows share h1's link; all share leaf2 -> spine1
    s = {
        "mode": p["mode"],
        "senders": n,
        "duration_s": dur,
        "discipline": e["discipline"],
        "congestion_control": e["cc"],
        "incast_goodput_mbps": incast_bytes * 8 / dur / 1e6,
        "incast_drops": bn_drops,
        "incast_loss_rate": bn_drops / (bn_drops + bn_sent) if bn_drops + bn_sent else 0.0,
        "incast_retrans_segs": td("TcpRetransSegs", senders),
        "incast_timeouts": td("TcpExtTCPTimeouts", senders),
        "victim_goodput_mbps": victim_mbps,
        "victim_fair_share_mbps": fair,
        "victim_share_ratio": victim_mbps / fair if fair else 0.0,
        "victim_retrans_segs": td("TcpRetransSegs", [victim]),
        "lossless_class_drops": qd(switch_ports, "drops"),
        "lossless_drops": qd(switch_ports, "drops") if e["lossless"] else None,
        "lossless_drops_by_port": "; ".join(f"{n}:{i}={qd([(n, i)], 'drops')}" for n, i in switch_ports
                                            if qd([(n, i)], "drops")),
        "host_nic_drops": qd(host_ports, "drops"),
        "ecn_marks": qd(switch_ports, "marks"),
        "receiver_ce_packets": td("IpExtInCEPkts", [rx_incast, rx_victim]),
        "wall_s": t_end - t0,
    }
    s.update(pfc.summary())
    if cap:
        from testbed.capture import wire_summary

        s.update(wire_summary(cap, cap_stats, ctx.progress, "pfc-hol"))
    return s


def _lossy_watch(fabric, p):
    """A disabled controller over the rdma class of every port (lossy mode has no lossless class to find)."""
    from testbed.pfc import LosslessQueue, PfcController

    ctl = PfcController(fabric, interval_s=p["poll_interval_ms"] / 1000.0, enabled=False)
    for plan in fabric.port_plans:
        for i, (minor, name, leaf, *_rest) in enumerate(plan.classes):
            if name == "rdma":
                ctl.queues[(plan.node, plan.ifname, minor)] = LosslessQueue(
                    node=plan.node, port=plan.ifname, peer=plan.peer, ns=fabric.ns(plan.node), ifindex=0,
                    minor=minor, cls=name, pcp=PCP, xoff=p["xoff_bytes"], xon=p["xon_bytes"],
                    headroom=p["headroom_bytes"], limit=leaf.limit, rate_bps=plan.rate_mbps * 1e6 / 8,
                    is_switch=fabric.topology.node(plan.node).role != "host", leaf_kind=leaf.kind)
    return ctl


SCENARIO = Scenario(
    name="pfc-hol",
    summary="PFC head-of-line blocking: incast in a lossless class + a victim flow to an idle receiver",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo", "qdisc:red+ecn", "qdisc:plug", "tcp:dctcp"),
    run=_run,
    validate=_validate,
    table=(("mode", "mode"), ("incast_goodput_mbps", "incast goodput (Mbit/s)"),
           ("incast_drops", "incast drops (leaf1:h1)"), ("incast_loss_rate", "incast loss rate"),
           ("incast_retrans_segs", "incast retransmits"), ("victim_goodput_mbps", "victim goodput (Mbit/s)"),
           ("victim_fair_share_mbps", "victim fair share (Mbit/s)"), ("lossless_drops", "lossless drops"),
           ("pfc_pause_events", "PFC pause events"), ("pfc_paused_ms_total", "paused time total (ms)"),
           ("pfc_paused_fraction_max", "paused fraction (worst port)"),
           ("pfc_reaction_ms_p95", "reaction p95 (ms)"), ("pfc_watchdog_events", "watchdog events"),
           ("ecn_marks", "ECN marks")),
)
