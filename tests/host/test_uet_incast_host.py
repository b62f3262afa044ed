"""Packet trimming removes the incast's timeouts: 6 senders x 32 kB into one receiver through a switch port at
20 Mbit/s with a 12 kB drop-tail buffer (HTB + bfifo, as testbed.kernel.qdisc builds every port), 20 rounds over
kernel TCP (the default congestion control, rto_min 200 ms) and 20 rounds over the UET transport (traffic.uet) with
the trimming program (testbed/kernel/trim.bpf.c) on that port: threshold 6 kB of its virtual queue, trimmed headers
in a strict-priority class of their own.

Asserted from counters, not from time: TCP loses packets at the port and its senders' kernels count
retransmission timeouts (TcpExtTCPTimeouts); UET delivers every block verified with at most 2 RTOs (6 Python
senders on a shared 2-CPU machine: a descheduled thread can outlast its 50 ms timer) and under a fifth of TCP's,
the port's data queue drops nothing, every packet the program trimmed reached the receiver and its NACK reached the
sender, and the senders retransmitted on those NACKs. The round times are compared too (the 20 rounds of each side
are its repeats, analysis.stats.compare), as in test_compare_repeats's RTOmin test. Measured: see the test's
docstring. About 12 s a run.

Spraying is not exercised here (one switch, one path); the entropy values are on loopback
(tests/host/test_uet_transport.py) and over a 2-spine fabric (tests/host/test_uet_spray_host.py)."""

from __future__ import annotations

import os

import pytest

from analysis import stats
from testbed.kernel import links, netns, trim
from testbed.kernel.counters import tcp_counters
from testbed.kernel.qdisc import LeafQueue, PortClass, install_port
from testbed.kernel.qdiscdump import RawQdiscDump
from traffic.incast import IncastRounds
from traffic.uet_incast import UetIncastRounds

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")

SENDERS = 6
BLOCK_BYTES = 32_000
ROUNDS = 20
RATE_MBPS = 20.0
BUFFER_BYTES = 12_000
MAX_UET_RTO_EVENTS = 2  # spurious timer expiries tolerated per run (scheduling, not loss)
TRIM_THRESHOLD_BYTES = 6_000
DATA_MINOR, TRIM_MINOR = 0x10, 0x11
UET_OPTS = {"rto_min_ms": 50.0, "entropy_values": 8}


class Star:
    """A switch namespace with one routed port per host; the port toward the receiver is the shallow one."""

    def __init__(self):
        tag = f"tb-ut{os.getpid() % 10000}"
        self.sw = f"{tag}-sw"
        self.hosts = {f"s{i}": f"{tag}-s{i}" for i in range(SENDERS)} | {"r": f"{tag}-r"}
        self.ip = {h: f"10.79.{i}.1" for i, h in enumerate(self.hosts, 1)}
        self.made: list[str] = []
        self.trimmer: trim.Trimmer | None = None

    def build(self) -> None:
        for ns in (self.sw, *self.hosts.values()):
            netns.create(ns)
            self.made.append(ns)
        netns.sysctl_write(self.sw, "net.ipv4.ip_forward", "1")
        for i, (h, ns) in enumerate(self.hosts.items(), 1):
            links.add_veth(ns, "eth0", self.sw, f"p{h}")
            links.offloads_off(ns, "eth0")
            links.offloads_off(self.sw, f"p{h}")
            links.add_address(ns, "eth0", self.ip[h], 24)
            links.add_address(self.sw, f"p{h}", f"10.79.{i}.254", 24)
            with netns.ipr(ns) as ipr:
                ipr.route("add", dst="0.0.0.0/0", gateway=f"10.79.{i}.254")
        self.port = links.index(self.sw, "pr")
        with netns.ipr(self.sw) as ipr:
            install_port(ipr, self.port, RATE_MBPS,
                         [PortClass(DATA_MINOR, LeafQueue("bfifo", BUFFER_BYTES), prio=1),
                          PortClass(TRIM_MINOR, LeafQueue("bfifo", 256_000), prio=0)], DATA_MINOR, fresh=True)

    def endpoints(self) -> dict[str, tuple[str, str]]:
        return {h: (ns, self.ip[h]) for h, ns in self.hosts.items()}

    def trim_on(self) -> trim.Trimmer:
        with netns.ipr(self.sw) as ipr:
            self.trimmer = trim.install(ipr, self.port, RATE_MBPS, TRIM_THRESHOLD_BYTES, BUFFER_BYTES,
                                        trim_minor=TRIM_MINOR)
        return self.trimmer

    def queues(self) -> dict[int, tuple[int, int]]:
        """Leaf queue major -> (drops, sent packets) on the shallow port."""
        d = RawQdiscDump(self.sw)
        try:
            return {q.minor: (q.drops, q.sent_packets) for q in d.leaf_stats().get(self.port, [])}
        finally:
            d.close()

    def sent_bytes(self) -> int:
        """What the shallow port's HTB has sent (its root's counter)."""
        d = RawQdiscDump(self.sw)
        try:
            return d.root_stats(self.port).sent_bytes
        finally:
            d.close()

    def senders_tcp(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for h, ns in self.hosts.items():
            if h != "r":
                for k, v in tcp_counters(ns).items():
                    out[k] = out.get(k, 0) + v
        return out

    def close(self) -> None:
        if self.trimmer is not None:
            self.trimmer.close()
        for ns in reversed(self.made):
            netns.remove(ns)


@pytest.fixture
def star():
    s = Star()
    try:
        s.build()
        yield s
    finally:
        s.close()
    assert not any(ns in netns.list_ours() for ns in s.made)


def _round_ms(rows) -> list[float]:
    by: dict[int, tuple[float, float]] = {}
    for r, _h, t0, t1, _b in rows:
        a, b = by.get(r, (t0, t1))
        by[r] = (min(a, t0), max(b, t1))
    return [(b - a) * 1e3 for a, b in by.values()]


def test_trimming_answers_the_incast_without_timeouts(star):
    """Measured (host kernel, shared 2-CPU machine with other developers' runs, 4 runs of 20 rounds a side, the
    virtual queue draining at the port's full rate and capped at its buffer): TCP 28, 39, 42, 62 timeouts
    (TcpExtTCPTimeouts) with 2288-2529 drops at the port; UET 0 RTOs and 0 drops in all four, 5158-5644 packets
    trimmed (for 2760 data packets: each packet is trimmed 1.9-2.0 times on average, the price of 6 senders whose
    fair share is below one packet per RTT), every one NACKed and retransmitted; the virtual queue's peak
    10.9-11.9 kB of the 12 kB buffer. Median round 241-272 ms (TCP, rto_min-bound) vs 111-128 ms (UET); the ratio
    of medians 1.93-2.45, its 95% interval's low end 1.76-2.10. (Draining at 0.9 of the rate, 6 runs: 6832-7250
    trims, 2.5 a packet, median round 133-144 ms.) The asserted ratio low end (1.3) sits 0.4 below the lowest
    measured, where the intervals are 0.4-0.7 wide: room for a slower, busier machine."""
    senders = [h for h in star.hosts if h != "r"]
    ends = star.endpoints()
    # kernel TCP, no trimming
    tcp = IncastRounds(senders, "r", ends, netns.entered, BLOCK_BYTES)
    before, q0 = star.senders_tcp(), star.queues()
    try:
        tcp.connect()
        tcp_rows = tcp.run(ROUNDS)
    finally:
        tcp.close()
    after, q1 = star.senders_tcp(), star.queues()
    tcp_timeouts = after["TcpExtTCPTimeouts"] - before["TcpExtTCPTimeouts"]
    tcp_retrans = after["TcpRetransSegs"] - before["TcpRetransSegs"]
    tcp_drops = q1[DATA_MINOR][0] - q0[DATA_MINOR][0]
    # UET with the trimming program on the shallow port
    trimmer = star.trim_on()
    sent0 = star.sent_bytes()
    uet = UetIncastRounds(senders, "r", ends, netns.entered, BLOCK_BYTES, uet=UET_OPTS)
    try:
        uet.connect()
        uet_rows = uet.run(ROUNDS)
        c = uet.totals()
        mismatches = uet.mismatches
    finally:
        uet.close()
    q2 = star.queues()
    sent = star.sent_bytes() - sent0
    print(f"UET phase: the port sent {sent * 8 / 1e3 / sum(_round_ms(uet_rows)):.1f} Mbit/s over the rounds")
    prog = trimmer.stats()
    tx, rx = c["senders"], c["receiver"]
    uet_drops = q2[DATA_MINOR][0] - q1[DATA_MINOR][0]
    print(f"TCP: timeouts {tcp_timeouts}, retransmitted segments {tcp_retrans}, port drops {tcp_drops}")
    print(f"UET: {tx}\nreceiver {rx}\nprogram {prog}, port drops {uet_drops}, trim class {q2.get(TRIM_MINOR)}")
    assert tcp_drops > 0 and tcp_timeouts > 0 and tcp_retrans > 0
    assert mismatches == 0 and len(uet_rows) == ROUNDS * SENDERS
    # 6 Python senders on a shared 2-CPU machine: a thread descheduled past its 50 ms timer can expire it without a
    # loss; allow a couple, far below TCP's
    assert tx.get("rto_events", 0) <= MAX_UET_RTO_EVENTS and tx.get("rto_events", 0) * 5 < tcp_timeouts, tx
    assert uet_drops == 0
    assert prog["trimmed_packets"] > 0
    # every packet the program trimmed reached the receiver, and its NACK reached the sender, which resent
    assert prog["trimmed_packets"] == rx["trimmed_received"] == tx["nacks_received"], (prog, rx, tx)
    assert tx["nack_retransmits"] > 0
    d = stats.compare(_round_ms(tcp_rows), _round_ms(uet_rows))
    print(f"round times, TCP vs UET+trimming: {d.a.text()} vs {d.b.text()}; ratio {d.ratio:.2f} "
          f"[{d.ratio_low:.2f}, {d.ratio_high:.2f}], p {d.p_value:.2g}: {d.verdict}")
    assert d.verdict == "A > B" and d.ratio_low > 1.3, d
