"""Collectives over RDMA (RC verbs on an rxe SoftRoCE device per host) on the real kernel, in the lab VM.

4 hosts on a 2x2 leaf-spine. All-reduce and all-to-all (64 kB, 20 Mbit/s) complete with every rank's result
verified; the all-reduce runs are lab 09's (256 kB at 10 Mbit/s over TCP and RDMA, each without and with 1% random
loss on the packets arriving at h1; made once for the module and graded as the lab too): the loss moves rxe's
recovery counters and makes it send packets again; TCP is measured under the same loss. The two lossy runs are
captured at h1's port (tcpdump -s 128) and the wire's own count of go-back-N retransmitted RoCE packets and
retransmitted TCP segments (analysis.capture) is asserted and printed beside rxe's and the kernel's counters. An
RDMA incast (gather) into drop-tail buffers goes back N thousands of times; in a lossless class (PFC) it does not,
and sends far fewer packets for the same data. Timings are printed, never compared between single runs: the
assertions are on kernel (rxe, qdisc) counters. """

from __future__ import annotations

import csv
import json

import pytest

from testbed.commands.runner import run_scenario
from testbed.scenario import get
from tests.labdrive import assert_complete_once, runs_once

COLL = get("collective")


def params(**kw):
    p = {x.name: x.default for x in COLL.params}
    p.update(host_rate_mbps=20.0, fabric_rate_mbps=20.0, spines=2, leaves=2, hosts_per_leaf=2, ranks=4,
             sample_interval_ms=0.0, size="512K", iterations=2, warmup=1, timeout_s=240.0)
    p.update(kw)
    COLL.validate(p)
    return p


def run(tmp_path, name, **kw):
    """One run into tmp_path/name; its summary (key numbers printed for the log)."""
    try:
        s = run_scenario(COLL, params(**kw), 1, tmp_path / name, quiet=True)
    except Exception:
        for log in sorted((tmp_path / name).glob("agent-*.log")):
            print(f"--- {log.name}:\n{log.read_text()[-3000:]}")
        raise
    keys = ("transport", "collective", "loss_percent", "cct_ms_p50", "cct_ms_mean", "cct_ms_max", "bound_ms",
            "data_verified", "tcp_retrans_segs", "rdma_retransmit_events", "rdma_recovery_counters",
            "rdma_sent_pkts", "rdma_rcvd_pkts", "rdma_rcvd_seq_err", "rdma_out_of_seq_request",
            "rdma_duplicate_request", "rdma_completer_retry_err", "rdma_sequence_gaps", "rdma_timeout_retries",
            "rdma_path_mtu")
    print(name, json.dumps({k: s.get(k) for k in keys if k in s}))
    return s


def rdma_rows(path):
    return list(csv.DictReader(open(path / "rdma.csv")))


def rxe_delta(path, host, counter):
    """after - before of one rxe counter on one host (rdma.csv)."""
    v = {r["phase"]: int(r["value"]) for r in rdma_rows(path) if r["host"] == host and r["counter"] == counter}
    return v.get("after", 0) - v.get("before", 0)


def processes_mentioning(text):
    """PIDs whose command line contains text (a tcpdump left running would show up here)."""
    import os

    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    out.append(int(pid))
        except OSError:
            pass
    return out


def test_rdma_alltoall_verified(tmp_path):
    """All-to-all over RC verbs on 4 hosts: every rank writes a distinct block to each of the 3 others."""
    import time

    t = time.monotonic()
    s = run(tmp_path, "alltoall", collective="alltoall", transport="rdma", size="64K", iterations=2, warmup=0)
    print(f"alltoall 64K over rdma: CCT mean {s['cct_ms_mean']:.1f} ms (bound {s['bound_ms']:.1f} ms), "
          f"test {time.monotonic() - t:.1f} s")
    assert s["data_verified"] is True and s["transport"] == "rdma" and s["collective"] == "alltoall"
    assert s["cct_samples"] == 2 and s["mismatches"] == ""
    # each rank writes 3/4 of 64 KiB per op (16 KiB to each peer: 16 packets at MTU 1024), 2 ops
    assert s["rdma_sent_pkts"] >= 4 * 2 * 3 * 15, s
    assert s["cct_ms_p50"] >= 0.95 * s["bound_ms"], s
    assert "wire_packets" not in s  # no capture asked, none made


#: lab 09's runs (labs/09-roce-vs-tcp/lab.toml) as the (transport, loss percent) the tests below read them by
LAB09_RUNS = {("tcp", 0.0): "tcp-clean", ("tcp", 1.0): "tcp-loss", ("rdma", 0.0): "rdma-clean",
              ("rdma", 1.0): "rdma-loss"}


@pytest.fixture(scope="module")
def allreduce_runs(tmp_path_factory):
    """Lab 09's four runs, made once by the lab driver (`testbed lab run 9 --repeat 1`): one all-reduce (256 kB, 6
    ops after a warm-up, 4 ranks at 10 Mbit/s) over tcp and rdma, without and with 1% loss on the packets arriving
    at h1; the lossy runs, whose wire the assertions read, are captured at h1's port (the capture sees packets before
    the ingress loss drops them, so a go-back-N replay crosses it twice). One set of runs serves the lab's grading
    (test_lab_09_runs_once_complete_with_every_statements_metric) and this file's checks: CI's time budget (these
    tests made three runs of their own, 77 s in the VM). {(transport, loss): (summary, run dir)}."""
    out = tmp_path_factory.mktemp("lab09")
    lab, runs = runs_once("09", out)
    res = {key: runs[name] for key, name in LAB09_RUNS.items()}
    res["lab"] = (lab, out)
    return res


def test_lab_09_runs_once_complete_with_every_statements_metric(allreduce_runs):
    """Lab 09 as tests/integration/test_labs_vm.py grades a VM lab run once (tests/labdrive.py's checks)."""
    lab, out = allreduce_runs["lab"]
    assert_complete_once(lab, out)


def test_rdma_collective_verified(allreduce_runs):
    s, path = allreduce_runs[("rdma", 0.0)]
    assert s["data_verified"] is True and s["transport"] == "rdma"
    assert s["cct_samples"] == 6
    assert s["cct_ms_p50"] >= 0.95 * s["bound_ms"], s  # the shaped link is a ceiling for RDMA too
    rows = rdma_rows(path)
    assert list(rows[0]) == ["host", "device", "phase", "counter", "value"]
    assert {r["host"] for r in rows} == {"h1", "h2", "h3", "h4"}
    assert {r["phase"] for r in rows} == {"before", "after"}
    assert all(r["device"].startswith("tb-") for r in rows)
    # every payload byte went through rxe (256 kB messages, ring: 2 x 3/4 of it per rank and op, MTU 1024: ~384
    # packets per rank and op, 7 ops with the warm-up)
    assert s["rdma_sent_pkts"] > 4 * 7 * 350 and s["rdma_path_mtu"] == 1024
    # No injected loss: the 256 kB port buffers never overflow (rxe keeps a bounded number of packets in flight per
    # QP), so no packet is lost and no responder sees a PSN gap (lab 09's INSTRUCTOR.md: 0 in 15 of 15 runs; at 1 MB
    # messages a 20 Mbit/s fabric did drop and rxe went back N, ~120 rounds). A stalled emulated vCPU can still let
    # a requester's ACK timer fire with nothing lost (lab 09: 0 in two sets of 5 runs, 1-24 a run in a set on a busy
    # machine), so their number is not bounded here; every replay of the clean run is one of those, none a NAK's.
    assert s["rdma_sequence_gaps"] == 0 and s["rdma_rcvd_seq_err"] == 0, s
    assert s["rdma_sent_pkts"] == s["rdma_rcvd_pkts"], s  # every packet a host's rxe sent, one received
    assert s["rdma_retransmit_events"] == s["rdma_timeout_retries"], s
    m = json.loads((path / "manifest.json").read_text())
    assert m["topology"]["builder"]["rxe"]["h1"]["netdev"]


def test_loss_makes_rdma_go_back_n_and_tcp_retransmit_on_the_wire(allreduce_runs):
    res = {k: allreduce_runs[k][0] for k in LAB09_RUNS}
    for s in res.values():
        assert s["data_verified"] is True
    t1 = res[("tcp", 1.0)]
    r0, r1 = res[("rdma", 0.0)], res[("rdma", 1.0)]
    print("CCT mean ms with 1%% loss: tcp %.1f; rdma %.1f -> %.1f (x%.2f) against no loss" % (
        t1["cct_ms_mean"], r0["cct_ms_mean"], r1["cct_ms_mean"], r1["cct_ms_mean"] / r0["cct_ms_mean"]))
    # ECN codepoints of the RoCEv2 packets the hosts received (traffic class 0): from the hosts' IpExt counters
    tcp_csv = list(csv.DictReader(open(allreduce_runs[("rdma", 0.0)][1] / "tcp.csv")))
    ecn = {}
    for row in tcp_csv:
        if row["counter"].startswith("IpExtIn") and row["counter"].endswith("Pkts"):
            sign = 1 if row["phase"] == "after" else -1
            ecn[row["counter"]] = ecn.get(row["counter"], 0) + sign * int(row["value"])
    print("rdma run, IP packets received by hosts by ECN codepoint:", ecn)
    # with loss rxe shows go-back-N recovery (responders saw PSN gaps, requesters replayed), and the replays are
    # packets sent again: rxe's own count of packets sent rises against the run without loss (same payload). The op
    # times are not compared: one run a side cannot tell (measured x1.72 once, 1187 -> 2045 ms; in a fresh-clone CI
    # run 9.30 s with 1% loss against 9.26 s without, the clean run stalled by 13 ACK-timer retries; identical no-
    # loss runs differ by up to 20%). Measured for the counters (lab VM, 1 run, with the earlier 512 kB x 3-op
    # runs): rxe sent 9288 packets without loss, 10727 with it (+15%, 22 PSN gaps; CCT 404 -> 1477 ms). The clean
    # run's only replays are ACK-timer retries (0 here, 13 in the worst CI run, each a window of a few dozen
    # packets), so the margin is the loss's ~90 go-back-N replays of a window each: 1 run cannot give a flake rate,
    # the mechanism does (a false failure needs the clean run to replay more than the lossy one).
    assert r1["rdma_recovery_counters"] > 0 and r1["rdma_retransmit_events"] > 0, r1
    assert r1["rdma_sequence_gaps"] > 0 and r1["rdma_rcvd_seq_err"] > 0, r1
    # (the lossy run is captured and the clean one is not: tcpdump's CPU on the emulated machine could add ACK-timer
    # replays to the lossy run only, so this comparison leans towards passing; the PSN gaps and sequence errors above
    # are the loss's own evidence)
    assert r1["rdma_sent_pkts"] > r0["rdma_sent_pkts"], (r0, r1)
    assert t1["tcp_retrans_segs"] > 0 or t1["tcpinfo_total_retrans"] > 0

    # the wire at h1:eth0 against the end hosts' counters
    rd = allreduce_runs[("rdma", 1.0)][1]
    print("wire (h1:eth0) vs rxe, rdma with 1% loss at h1:")
    # rxe has no retransmitted-packet counter: duplicate_request counts only replayed packets a responder had
    # already accepted; the other pairs count the same events (the wire: h1's port only; rxe: h1, all hosts)
    for wire, rxe in (("wire_roce_retransmitted_packets", "duplicate_request"),
                      ("wire_roce_replays", "completer_retry_err"), ("wire_roce_nak_seq_err", "out_of_seq_request"),
                      ("wire_roce_nak_seq_err", "rcvd_seq_err")):
        print(f"  {wire:<34} {r1[wire]:>7}   rxe {rxe:<22} h1 {rxe_delta(rd, 'h1', rxe):>6}  "
              f"all hosts {r1['rdma_' + rxe]:>6}")
    print("  wire: %d RoCE packets (%d requests, %d ACKs, %d NAKs of which %d PSN sequence errors), %d PSN gaps, "
          "%d QPs, %s kernel drops in the capture; rxe h1 sent %d / received %d packets" % (
              r1["wire_roce_packets"], r1["wire_roce_requests"], r1["wire_roce_acks"], r1["wire_roce_naks"],
              r1["wire_roce_nak_seq_err"], r1["wire_roce_psn_gaps"], r1["wire_roce_qps"],
              r1["wire_capture_kernel_drops"],
              rxe_delta(rd, "h1", "sent_pkts"), rxe_delta(rd, "h1", "rcvd_pkts")))
    print("  tcp with 1%% loss: wire retransmitted segments %d, TcpRetransSegs (all hosts) %d, CE marks %d" % (
        t1["wire_tcp_retransmitted_segments"], t1["tcp_retrans_segs"], t1["wire_ce_marked_packets"]))
    assert (rd / "capture-h1-eth0.pcap").stat().st_size > 24 and r1["wire_capture_port"] == "h1:eth0"
    # h1's port carries its QPs to both ring neighbours (requests one way, ACKs/NAKs the other)
    assert r1["wire_roce_qps"] >= 2 and r1["wire_roce_requests"] > 1000, r1
    assert r1["wire_roce_retransmitted_packets"] > 0 and r1["wire_roce_replays"] > 0, r1
    assert r1["wire_roce_acks"] > 0
    # every replay on the wire was started by some requester's retry (NAK or ACK timeout; or an RNR retry)
    assert r1["wire_roce_replays"] <= r1["rdma_completer_retry_err"] + r1["rdma_rcvd_rnr_err"], r1
    assert t1["wire_tcp_segments"] > 1000 and t1["wire_tcp_retransmitted_segments"] > 0, t1
    assert processes_mentioning("capture-h1-eth0.pcap") == []  # tcpdump was stopped


def test_rdma_incast_goes_back_n_when_lossy_and_pfc_removes_it(tmp_path):
    """RoCE's reason for PFC. A gather (3 ranks -> h1, 256 kB each, RDMA) at 5 Mbit/s into 128 kB drop-tail port
    buffers: rxe has no congestion control, every overflow is a PSN gap and a go-back-N replay of everything after
    it, and the replays overflow the buffer again. The same collective in a lossless class (XOFF 16 kB) is paused
    instead. Measured (3 runs each): lossy 2721-3510 drops at leaf1:h1, 40-67 PSN gaps, CCT p50 3.22-4.69 s;
    lossless 0 drops, 0 gaps, 243-310 pauses, CCT p50 2.02-2.20 s with the default ACK timeout (3-7 ACK-timer
    retries: a pause longer than it makes rxe replay with nothing lost); with the 2.1 s timeout used below, 0 timer
    retries and 425-460 pauses (2 runs). Over TCP the same pair ends the other way round
    (test_collective: a few fast retransmits are cheaper than the pauses)."""
    kw = dict(transport="rdma", collective="gather", size="256K", iterations=2, warmup=0, host_rate_mbps=5.0,
              fabric_rate_mbps=5.0, buffer_bytes=128_000)
    lossy = run(tmp_path, "lossy", **kw)
    # The lossless run's ACK timeout is 2.1 s (rdma_timeout 19), not the default 268 ms: a pause longer than the
    # timeout makes rxe replay with nothing lost (3-7 such retries measured a run), and 8 in a row on one QP
    # (retry_cnt 7, ~2.1 s without progress, seen once in a suite run on a loaded machine) put it in the error
    # state: "work request flushed". What is compared, drops and go-back-N replays, is the queue's doing, not the
    # timer's.
    pfc = run(tmp_path, "pfc", pfc="on", pfc_xoff_bytes=16_000, pfc_xon_bytes=8_000, rdma_timeout=19, **kw)
    keys = ("cct_ms_p50", "switch_drops", "switch_drops_by_port", "host_nic_drops", "rdma_sequence_gaps",
            "rdma_timeout_retries", "lossless_drops", "pfc_pause_events", "pfc_reaction_ms_max",
            "pfc_headroom_used_max_bytes")
    print("rdma lossy:", {k: lossy.get(k) for k in keys})
    print("rdma lossless:", {k: pfc.get(k) for k in keys})
    assert lossy["data_verified"] is True and pfc["data_verified"] is True
    assert lossy["switch_drops"] > 0 and lossy["rdma_sequence_gaps"] > 0, lossy
    assert pfc["pfc_pause_events"] > 0, pfc
    # PFC removes (most of) the loss and with it go-back-N (the emulation's band, docs/pfc.md; measured: all)
    assert pfc["lossless_drops"] + pfc["host_nic_drops"] <= 0.05 * lossy["switch_drops"], (lossy, pfc)
    assert pfc["rdma_sequence_gaps"] <= 0.25 * lossy["rdma_sequence_gaps"], (lossy, pfc)
    # and without the replays far fewer packets are sent for the same data: why it finishes sooner (measured CCT
    # 1.46-2.32x; not asserted, one run a side: the packets rxe sent are the mechanism, counted). Not measured on
    # the counter itself yet (this branch's base cannot start the PFC controller, fixed on main): from the drops
    # measured above, the lossy run sends its ~1500 data packets plus 2721-3510 replays of dropped ones, the
    # lossless one the data plus a few ACK-timer replays: ~0.35-0.5 of the lossy count against the asserted 0.8.
    assert pfc["rdma_sent_pkts"] < 0.8 * lossy["rdma_sent_pkts"], (lossy, pfc)


def test_rdma_mtu_the_link_cannot_take_is_one_line():
    from testbed.errors import UsageError

    with pytest.raises(UsageError, match="rdma_mtu: 4096 does not fit"):
        params(transport="rdma", rdma_mtu=4096)
