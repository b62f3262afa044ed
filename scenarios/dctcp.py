#!/usr/bin/env python3
"""DCTCP vs TCP: how full does the bottleneck queue run?

    h1..hN -> s1 ==[fabric rate]==> s2 ==[HTB host rate, the queue under study]==> r1

    sudo testbed run dctcp                                  (or: sudo .venv/bin/python scenarios/dctcp.py)
    sudo testbed run dctcp --set cc=cubic --set discipline=droptail --set ecn=false
    sudo testbed run dctcp --set cc=reno --set delay_ms=20          (ECN-Reno: halves its window per marked RTT)

A few long-lived flows share one bottleneck for `duration_s`. With CUBIC over drop-tail the queue fills the buffer
(loss is the only signal); with DCTCP senders and step marking at K (mark every ECN-capable packet while the
instantaneous queue exceeds K, as DCTCP switches do) the queue hovers near K with the same throughput: the classic
result of Alizadeh et al., SIGCOMM 2010, and the reason AI fabrics run ECN.

`delay_ms` puts propagation delay on the s1 - s2 link (base RTT 2 x delay_ms). Without it the bandwidth-delay
product is a few packets, far below K, and any sender that backs off on ECN marks (DCTCP or plain ECN, e.g. reno or
cubic with ecn=true, which halve their window once per marked RTT) holds the queue near K. With the BDP large
against K, halving empties the queue and idles the link after every mark, while DCTCP's cut in proportion to the
fraction of marked packets keeps the queue near K and the link busy: the difference the paper's proportional cut
makes. The summary gives the base RTT and the BDP in packets.

The summary's queue statistics come from the samples of the bottleneck port taken after a warm-up (`warmup_s`),
so slow start does not count.
"""

import sys

from testbed.workloads.bottleneck import build_spec
from testbed.errors import UsageError
from testbed.params import Param
from testbed.scenario import Scenario
from topologies.mininet_topo import SpecTopo

PARAMS = [
    Param("senders", int, 2, "", "long-lived flows (one per sender host)", min=1, max=16),
    Param("duration_s", float, 6.0, "s", "how long the flows send", min=1, max=600),
    Param("warmup_s", float, 1.5, "s", "queue samples before this are ignored (slow start)", min=0, max=60),
    Param("host_rate_mbps", float, 20.0, "Mbit/s", "host links; the s2 -> r1 port is the bottleneck", min=0.1,
          max=10_000),
    Param("fabric_rate_mbps", float, 40.0, "Mbit/s", "the s1 -> s2 link", min=0.1, max=10_000),
    Param("buffer_bytes", int, 150_000, "bytes", "bottleneck buffer", min=3000, max=1 << 30),
    Param("discipline", str, "step", "", "bottleneck queue discipline", choices=("droptail", "red", "step")),
    Param("k_bytes", int, 30_000, "bytes", "marking threshold K (RED: min threshold, max = min(3K, buffer))",
          min=1500, max=1 << 30),
    Param("cc", str, "dctcp", "", "sender congestion control", choices=("cubic", "reno", "dctcp", "bbr")),
    Param("ecn", bool, True, "", "hosts negotiate ECN (DCTCP needs it)"),
    Param("delay_ms", float, 0.0, "ms", "one-way delay of the s1 - s2 link, each direction (netem): base RTT = 2 x "
          "delay_ms", min=0, max=500),
    Param("sample_interval_ms", float, 1.0, "ms", "queue sampling interval", min=0.1, max=1000),
]


def fabric(p: dict, seed: int = 0):
    """The dumbbell the incast scenario builds for topology=dumbbell: (spec, receiver, senders, bottleneck port)."""
    return build_spec({**{k: p[k] for k in ("senders", "discipline", "k_bytes", "buffer_bytes", "cc", "ecn",
                                            "host_rate_mbps", "fabric_rate_mbps", "delay_ms")},
                       "rto_min_ms": 200, "seed": 0, "topology": "dumbbell", "hosts_per_leaf": 1, "spines": 1}, seed)


def validate(p: dict) -> None:
    if p["warmup_s"] >= p["duration_s"]:
        raise UsageError(f"warmup_s ({p['warmup_s']}) must be < duration_s ({p['duration_s']})")
    if p["cc"] == "dctcp" and not p["ecn"]:
        raise UsageError("cc=dctcp needs ecn=true")
    fabric(p)


def experiment(p: dict, lab) -> dict:
    _, receiver, senders, (bn_node, bn_port) = fabric(p, lab.seed)
    lab.progress(f"dumbbell: {len(senders)} senders, bottleneck {bn_node}:{bn_port} {p['discipline']} "
                 f"K={p['k_bytes']} B, buffer {p['buffer_bytes']} B at {p['host_rate_mbps']} Mbit/s")
    tcp = lab.tcp_counters([receiver, *senders])
    queue = lab.sample_queues(every_ms=p["sample_interval_ms"], ports=[(bn_node, bn_port)])
    lab.progress(f"{len(senders)} x {p['cc']} for {p['duration_s']} s")
    flows = lab.flows([(s, receiver) for s in senders], duration_s=p["duration_s"], cc=p["cc"]).wait()
    tcp.stop(lab.rundir)
    queue.stop(lab.rundir)

    # goodput of the flows together, the bottleneck's queue after the warm-up and the hosts' counters: analysis,
    # from what the flows delivered, queues.csv and tcp.csv
    from analysis import fidelity, metrics
    from analysis import summary as asum

    start_s = min(f["start_s"] for f in flows)
    goodput = metrics.goodput(sum(f["bytes"] for f in flows), max(f["end_s"] for f in flows) - start_s) * 8 / 1e6
    run = asum.load_quietly(lab.rundir.path)
    bq = asum.port_backlog(run.queues, bn_node, bn_port, start_s + p["warmup_s"])
    tm = asum.tcp_metrics(run.tcp)
    sampled = queue.stats()  # achieved interval, samples, CPU busy
    # Low goodput means the queue under study never ran full: unfaithful, unless the senders halve on ECN marks
    # (reno/cubic with ecn behind a marking queue): with the BDP large against K they leave the link idle after each
    # halving, which is the lesson, not a fault. A CPU too busy to send is still the cpu_busy reason, and a port that
    # carried less than its rate while backlogged the port_rate_shortfall one.
    halving_ecn = p["ecn"] and p["cc"] in ("reno", "cubic") and p["discipline"] != "droptail"
    low = None if halving_ecn else fidelity.goodput_below(goodput, p["host_rate_mbps"])
    reasons = fidelity.reasons(fidelity.cpu_busy(sampled["cpu_busy_fraction"]), low)
    return {
        "senders": len(senders), "cc": p["cc"], "discipline": p["discipline"], "k_bytes": p["k_bytes"],
        "k_packets": round(p["k_bytes"] / 1514, 1), "buffer_bytes": p["buffer_bytes"],
        "base_rtt_ms": 2 * p["delay_ms"],
        # the bottleneck's bandwidth-delay product at the base RTT, in full-size packets
        "bdp_packets": round(p["host_rate_mbps"] * 1e6 / 8 * 2 * p["delay_ms"] / 1e3 / 1514, 1),
        "goodput_mbps": goodput,
        "queue_median_packets": bq["packets_median"],
        "queue_p90_packets": bq["packets_p90"],  # nearest rank
        "queue_max_packets": bq["packets_max"],
        "queue_mean_packets": bq["packets_mean"],
        "queue_mean_bytes": bq["bytes_mean"],
        # counter increases over the bottleneck's samples (whole run)
        "bottleneck_drops": bq["drops"], "ecn_marks": bq["marks"], "bottleneck_packets": bq["sent_packets"],
        "tcp_retrans_segs": tm.get("tcp_retrans_segs", 0), "tcp_timeouts": tm.get("tcp_timeouts", 0),
        **sampled,
        "fidelity_ok": not reasons, "fidelity_reasons": reasons,
    }


SCENARIO = Scenario(
    name="dctcp",
    summary="long-lived flows through one bottleneck: queue occupancy under DCTCP step marking vs TCP drop-tail",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo", "qdisc:red+ecn", "tcp:dctcp", "sysctl:ecn"),
    topology=lambda p, seed: SpecTopo(fabric(p, seed)[0]),
    run=experiment,
    validate=validate,
    table=(("cc", "congestion control"), ("discipline", "bottleneck discipline"), ("k_packets", "K (packets)"),
           ("bdp_packets", "BDP (packets)"),
           ("goodput_mbps", "goodput (Mbit/s)"), ("queue_median_packets", "queue median (packets)"),
           ("queue_p90_packets", "queue p90 (packets)"), ("queue_max_packets", "queue max (packets)"),
           ("ecn_marks", "ECN marks"), ("bottleneck_drops", "drops"), ("tcp_retrans_segs", "TCP retransmits"),
           ("queue_sample_interval_s", "achieved sample interval (s)"), ("fidelity_ok", "fidelity ok")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
