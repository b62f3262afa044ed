"""DCQCN for SoftRoCE (testbed/kernel/dcqcn.py, docs/dcqcn.md) on real rxe traffic, in the lab VM.

h1 -> leaf1 -> h2, host links at 20 Mbit/s, leaf1's port to h2 at 5 Mbit/s with RED + ECN marking from 3 KB
(the congestion point). ib_write_bw (perftest, RC RDMA WRITE) from h1 to h2 for a few seconds with the programs
loaded on both hosts and their QP map filled from the RDMA netlink tables while the QPs come up. Asserted on
counters, never on one run's timing: the switch port CE-marked packets (only ECT packets can be marked: the
reaction point's ECT(0)); h2's notification point saw CE and sent CNPs; the CNPs were on the wire at h1 (tcpdump:
UDP 4791, BTH opcode 0x81) as many as h2 counts sent and h1 counts received; h1 cut the QP's rate at least once and
its current rate fell below the line rate (without DCQCN nothing paces rxe: it sends at whatever the path takes).
"""

from __future__ import annotations

import os
import re
import time

import pandas as pd
import pytest

from testbed.kernel import netns
from testbed.measure.dcqcn_rates import DcqcnRates
from testbed.rundir import RunDir

HOST_MBPS, BOTTLENECK_MBPS = 20.0, 5.0
RUN_S = 6
HOSTS = ("h1", "h2")


@pytest.fixture
def fabric():
    from testbed.network.fabric import Fabric
    from topologies import LeafSpineSpec, LinkSpec, PortOverride, QueueSpec

    red = QueueSpec("red", buffer_bytes=150_000, min_bytes=3000, max_bytes=30_000, probability=0.2, ecn=True)
    spec = LeafSpineSpec(spines=1, leaves=1, hosts_per_leaf=2, host_link=LinkSpec(HOST_MBPS),
                         fabric_link=LinkSpec(HOST_MBPS),
                         ports=(PortOverride("leaf1:h2", rate_mbps=BOTTLENECK_MBPS, queue=red),))
    fab = Fabric(spec, f"q{os.getpid() % 100000}", rxe=True)
    try:
        fab.build(None, None)
        yield fab
    finally:
        fab.teardown()


def write_bw(fabric, tmp_path, loaded: dict | None, wait: bool = True) -> tuple[str, DcqcnRates | None]:
    """ib_write_bw h1 -> h2, 64 KiB messages for RUN_S seconds (perftest's -D), with the QP mapper running when
    DCQCN is `loaded`; `wait=False`: the client is stopped after RUN_S + 1 s instead of waiting for perftest's end.
    Returns the CNPs tcpdump saw arriving at h1 (UDP 4791, BTH opcode 0x81: the byte after the UDP header)."""
    from traffic.rxe import find_device

    ip = {h: fabric.host_ip(h) for h in HOSTS}
    dev = {h: find_device(ip[h]) for h in HOSTS}
    cap = tmp_path / "cnp.txt"
    mapper = None
    if loaded is not None:
        # every 50 ms: the hosts' QP tables paired into their QP maps (the sender's first), the rates recorded
        mapper = DcqcnRates({h: (loaded[h], dev[h][0], ip[h]) for h in HOSTS}, interval_s=0.05, first=("h1",))
    # -u 20: the QP's ack timeout at 4.096 us * 2^20 = 4.3 s (perftest's default 14 is 67 ms). rxe's retransmit
    # timer runs while a paced packet waits in fq (a NIC's rate limiter sits before its transport timer): at the
    # 200 kbit/s floor a 64 KiB write alone takes 2.6 s, and with the default one run in eight ended in a
    # completion error (status 9, 3 of 131 writes completed) after retransmission storms.
    common = ["-s", "65536", "-D", str(RUN_S), "-F", "-p", "18515", "-u", "20"]
    procs = []  # every process started here ends in the finally, whatever fails
    try:
        procs.append(netns.popen(fabric.ns("h1"), ["tcpdump", "-i", "eth0", "-nn", "-l", "-Q", "in",
                                                   "udp dst port 4791 and udp[8] = 0x81"],
                                 stdout=open(cap, "w"), stderr=open(tmp_path / "tcpdump.err", "w")))
        procs.append(netns.popen(fabric.ns("h2"), ["ib_write_bw", "-d", dev["h2"][0], "-x", str(dev["h2"][1]),
                                                   *common],
                                 stdout=open(tmp_path / "srv.txt", "w"), stderr=open(tmp_path / "srv.err", "w")))
        time.sleep(1.0)  # tcpdump and the server listening
        if mapper is not None:
            mapper.start()
        argv = ["ib_write_bw", "-d", dev["h1"][0], "-x", str(dev["h1"][1]), *common, ip["h2"]]
        if wait:
            out = netns.run(fabric.ns("h1"), argv, timeout=120)
            assert out.returncode == 0, out.stdout[-500:] + out.stderr[-500:]
        else:
            procs.append(netns.popen(fabric.ns("h1"), argv, stdout=open(os.devnull, "w"),
                                     stderr=open(os.devnull, "w")))
            time.sleep(RUN_S + 1)
        time.sleep(0.5)  # the last CNPs land
    finally:
        if mapper is not None:
            mapper.stop()
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001
                p.kill()
                p.wait()
    # tcpdump really listened (so "no CNP seen" means none arrived, not that nothing was watching)
    assert "listening on eth0" in (tmp_path / "tcpdump.err").read_text()
    return cap.read_text(), mapper


def qdisc_counters(fabric, host: str) -> dict[str, int]:
    """From `tc -s qdisc` on the host's interface: how often fq held a packet until its departure time
    (fq_throttled), the packets fq dropped (fq_dropped), and the packets the clsact hooks' programs dropped
    (clsact_dropped: at ingress, the CNPs the reaction point consumed)."""
    text = netns.run(fabric.ns(host), ["tc", "-s", "qdisc", "show", "dev", "eth0"]).stdout
    out = {"fq_throttled": 0, "fq_dropped": 0, "clsact_dropped": 0}
    for block in re.split(r"\n(?=qdisc )", text):
        kind = block.split()[1] if block.startswith("qdisc ") else ""
        dropped = sum(int(n) for n in re.findall(r"\(dropped (\d+)", block))
        if kind == "fq":
            out["fq_dropped"] += dropped
            # "flows N (inactive N throttled N)" is the flows throttled right now: not the count
            out["fq_throttled"] += sum(int(n) for n in re.findall(r"\bthrottled (\d+)",
                                                                    re.sub(r"\([^)]*\)", "", block)))
        elif kind == "clsact":
            out["clsact_dropped"] += dropped
    return out


def test_cnps_on_the_wire_cut_the_senders_rate(fabric, tmp_path):
    """Measured (lab VM under a shared 2-CPU host, n=1 shown; the assertions are on counters): 569 CE-marked
    packets at h2, 234 CNPs sent (335 suppressed inside the 5 ms interval), 234 seen on the wire and received at
    h1, 224 cuts and 10 CNPs ignored inside the cut interval, the QP's rate down to the 200 kbit/s floor."""
    from testbed.kernel import dcqcn, qdisc
    from traffic.dcqcn import scaled

    params = scaled(HOST_MBPS)
    loaded = {h: dcqcn.install(fabric.ns(h), "eth0", params) for h in HOSTS}
    try:
        text, mapper = write_bw(fabric, tmp_path, loaded)
        tc = qdisc_counters(fabric, "h1")
        stats = {h: loaded[h].stats() for h in HOSTS}
        rates = loaded["h1"].rates()
    finally:
        for d in loaded.values():
            d.close()
    # close() put the host NICs' own drop-tail leaves back in fq's place and removed the programs' clsact
    for h in HOSTS:
        after = netns.run(fabric.ns(h), ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        assert " fq " not in after and "clsact" not in after and "bfifo" in after, after
    on_wire = sum(1 for line in text.splitlines() if "UDP" in line)
    port = qdisc.port_stats(fabric.ns("leaf1"), "h2")
    print("stats", stats, "rates", rates, "on the wire", on_wire, "h1", tc,
          "leaf1:h2", port)
    assert not mapper.errors, mapper.errors[:3]
    assert sum(q.marks for q in port) > 0  # the congestion point marked ECT(0) packets
    h1, h2 = stats["h1"], stats["h2"]
    # h2's notification point saw the port's CE marks (equal in 3 of 4 runs; once 523 of 548: not explained yet)
    assert 0.9 * sum(q.marks for q in port) <= h2["ce_seen"] <= sum(q.marks for q in port)
    assert h2["cnp_sent"] > 0 and h2["cnp_failed"] == 0
    assert h2["cnp_sent"] == h1["cnp_received"] == on_wire
    assert h1["unknown_qp"] == 0 and h1["paced_packets"] > 0
    assert h1["rate_cuts"] >= 1 and h1["rate_cuts"] + h1["cnp_ignored"] == h1["cnp_received"]
    # perftest ended, its QPs were destroyed: the mapper's last round dropped their map entries and rate states
    assert rates == []
    # dcqcn_rates.csv: the sender's QP's rate over time, cut below the line rate, its cuts counted up to the end
    mapper.write(RunDir(tmp_path / "run", "dcqcn-test", {}, 0))
    csv = pd.read_csv(tmp_path / "run" / "dcqcn_rates.csv")
    sender = csv[(csv["host"] == "h1") & (csv["peer"] == "h2")]
    assert len(sender) >= 20, csv.tail()  # 6 s at 50 ms: ~120 rounds (fewer under emulation)
    assert sender["rc_kbps"].min() < params.line_rate_kbps
    # the sampler's last round may come up to 50 ms before the last CNP: a cut or two after it (202 vs 203 seen once)
    assert sender["rate_cuts"].is_monotonic_increasing and 0 <= h1["rate_cuts"] - sender["rate_cuts"].iloc[-1] <= 3
    assert tc["fq_throttled"] > 0  # fq held packets to their departure times: the QP was paced
    assert tc["fq_dropped"] == 0  # and held them all: flow_limit is above what rxe keeps in flight
    assert tc["clsact_dropped"] == h1["cnp_received"]  # the CNPs stopped at h1's ingress, rxe never saw one


def test_without_dcqcn_rxe_is_not_ecn_capable_so_red_drops_instead_of_marking(fabric, tmp_path):
    """The same traffic with no programs loaded: rxe sends Not-ECT (the QP's traffic class is 0), so the RED port
    cannot mark and drops instead (rxe retransmits), no CNP is on the wire and nothing paces the sender.
    The client is stopped after the run's time rather than awaited: without DCQCN perftest's end waits out go-back-N
    retransmission storms (one -D 6 run took about 130 s and put 68 MB on the 5 Mbit/s port, 68369 drops against
    63187 sent; 30 messages of 64 KiB did not complete in 120 s), against 69 drops with DCQCN."""
    from testbed.kernel import qdisc

    text, _ = write_bw(fabric, tmp_path, None, wait=False)
    port = qdisc.port_stats(fabric.ns("leaf1"), "h2")
    print("leaf1:h2", port)
    assert sum(q.marks for q in port) == 0 and sum(q.drops for q in port) > 0
    assert not [line for line in text.splitlines() if "UDP" in line]
