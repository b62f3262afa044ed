#!/usr/bin/env python3
"""pfc-hol: PFC head-of-line blocking. An incast into one receiver in a lossless class, plus a victim flow that
shares the incast's upstream links but goes to an idle receiver.

    leaf-spine, 1 spine, 2 leaves (testbed.workloads.lossless_incast):

        h(senders) on leaf2 --\\                                     /--> h1  (incast receiver: the congested port)
                               leaf2 ==[fabric]==> spine1 ==> leaf1
        h(victim)  on leaf2 --/                                     \\--> h2  (victim receiver: idle)

    sudo testbed run pfc-hol [--set mode=lossless_ecn]         (or: sudo .venv/bin/python scenarios/pfc_hol.py)

Every flow is kernel TCP with DSCP 26 (class ``rdma``, strict priority 1, 802.1p priority 3); ACKs carry DSCP 0
(class ``bulk``, priority 0, lossy). mode:

* ``lossy``: no PFC; the incast overflows leaf1 -> h1 and drops.
* ``lossless``: ``rdma`` is lossless: testbed.pfc.controller pauses every port feeding a switch whose ``rdma`` egress
queue is
  above XOFF, until it drains to XON. leaf1 -> h1 fills -> spine1 -> leaf1 paused -> spine1's queue fills ->
  leaf2 -> spine1 paused -> the victim, which only shares those links, is stuck behind the incast.
* ``lossless_ecn``: the same plus DCTCP-style marking at K = k_bytes (< XOFF) on every switch queue and DCTCP on
  the hosts: the senders back off before XOFF, fewer pauses.

summary.json: incast goodput, loss and retransmits, victim goodput and its max-min fair share, PFC pause counts,
paused time, reaction time (testbed.pfc.run), lossless drops (switch ports; host NICs separately), wire_* numbers.
"""

import sys
import time

from analysis.metrics import maxmin_share
from testbed.measure.capture import parse_spec, start_capture, wire_summary
from testbed.workloads.lossless_incast import DSCP_LOSSLESS, PCP, build_spec, effective
from testbed.params import Param
from testbed.pfc.run import start_pfc
from testbed.scenario import Scenario
from topologies.mininet_topo import SpecTopo

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


def experiment(p: dict, lab) -> dict:
    _, rx_incast, rx_victim, senders, victim = build_spec(p, lab.seed)
    e, dur = effective(p), p["duration_s"]
    lab.progress(f"pfc-hol {p['mode']}: incast {','.join(senders)} -> {rx_incast}, victim {victim} -> {rx_victim}, "
                 f"{e['discipline']} {p['buffer_bytes']} B, cc {e['cc']}")
    # the rdma class of every port is watched in every mode (queues.csv, drops); paused only when lossless
    pfc = start_pfc(lab.net.fabric, lab.rundir, lab.on_teardown, interval_ms=p["poll_interval_ms"],
                    watchdog_ms=p["watchdog_ms"], watchdog_restore_ms=p["watchdog_restore_ms"], enabled=e["lossless"],
                    frames=p["pause_frames"], start=False,
                    watch=dict(cls="rdma", pcp=PCP, xoff_bytes=p["xoff_bytes"], xon_bytes=p["xon_bytes"],
                               headroom_bytes=p["headroom_bytes"]))
    cap = start_capture(p["capture"], lab.net.fabric, lab.rundir.path, lab.on_teardown, lab.progress)
    tcp = lab.tcp_counters([*senders, victim, rx_incast, rx_victim])
    pfc.start()  # forks the controller: before the flows' threads exist
    lab.progress(f"{len(senders) + 1} TCP flows for {dur} s (DSCP {DSCP_LOSSLESS}, pcp {PCP}, PFC "
                 f"{'on' if e['lossless'] else 'off'})")
    flows = lab.flows([(h, rx_incast) for h in senders] + [(victim, rx_victim)], cc=e["cc"], dscp=DSCP_LOSSLESS,
                      ack_dscp=0)
    start = flows.snapshot()
    time.sleep(dur)
    end = flows.snapshot()  # what the receivers held when the flows' time was up
    pfc_summary = pfc.finish()  # pfc.csv, queues.csv (from the controller's samples)
    cap_stats = cap.stop() if cap else {}
    tcp_delta = tcp.stop(lab.rundir)
    flows.stop()
    tcp_sum = lambda counter, hosts: sum(tcp_delta[h][counter] for h in hosts)  # noqa: E731
    mbps = flows.goodput_mbps(start, end)
    n, hr, fr = len(senders), p["host_rate_mbps"], p["fabric_rate_mbps"]
    fair = maxmin_share(hr, [hr / n] * n, fr)  # incast flows share h1's link; all share leaf2 -> spine1
    bn = [("leaf1", rx_incast)]
    bn_drops, bn_sent = pfc.delta("drops", bn), pfc.delta("sent_packets", bn)
    s = {
        "mode": p["mode"], "senders": n, "duration_s": dur, "discipline": e["discipline"],
        "congestion_control": e["cc"],
        "incast_goodput_mbps": sum(mbps[:n]),
        "incast_drops": bn_drops,
        "incast_loss_rate": bn_drops / (bn_drops + bn_sent) if bn_drops + bn_sent else 0.0,
        "incast_retrans_segs": tcp_sum("TcpRetransSegs", senders),
        "incast_timeouts": tcp_sum("TcpExtTCPTimeouts", senders),
        "victim_goodput_mbps": mbps[n],
        "victim_fair_share_mbps": fair,
        "victim_share_ratio": mbps[n] / fair if fair else 0.0,
        "victim_retrans_segs": tcp_sum("TcpRetransSegs", [victim]),
        "lossless_class_drops": pfc.delta("drops", pfc.switch_ports),
        "lossless_drops": pfc_summary.pop("lossless_drops"),
        "lossless_drops_by_port": pfc.drops_by_port(),
        "host_nic_drops": pfc.delta("drops", pfc.host_ports),
        "ecn_marks": pfc.delta("marks", pfc.switch_ports),
        "receiver_ce_packets": tcp_sum("IpExtInCEPkts", [rx_incast, rx_victim]),
        "wall_s": end[0] - start[0],
    }
    s.update(pfc_summary)
    if cap:
        s.update(wire_summary(cap, cap_stats, lab.progress, "pfc-hol"))
    return s


SCENARIO = Scenario(
    name="pfc-hol",
    summary="PFC head-of-line blocking: incast in a lossless class + a victim flow to an idle receiver",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo", "qdisc:red+ecn", "qdisc:plug", "tcp:dctcp"),
    topology=lambda p, seed: SpecTopo(build_spec(p, seed)[0]),
    run=experiment,
    validate=lambda p: parse_spec(p["capture"], build_spec(p)[0].addresses),  # one-line UsageError on bad input
    table=(("mode", "mode"), ("incast_goodput_mbps", "incast goodput (Mbit/s)"),
           ("incast_drops", "incast drops (leaf1:h1)"), ("incast_loss_rate", "incast loss rate"),
           ("incast_retrans_segs", "incast retransmits"), ("victim_goodput_mbps", "victim goodput (Mbit/s)"),
           ("victim_fair_share_mbps", "victim fair share (Mbit/s)"), ("lossless_drops", "lossless drops"),
           ("pfc_pause_events", "PFC pause events"), ("pfc_paused_ms_total", "paused time total (ms)"),
           ("pfc_paused_fraction_max", "paused fraction (worst port)"),
           ("pfc_reaction_ms_p95", "reaction p95 (ms)"), ("pfc_watchdog_events", "watchdog events"),
           ("ecn_marks", "ECN marks")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
