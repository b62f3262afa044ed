#!/usr/bin/env python3
"""Incast: N senders each send a block of B bytes to one receiver at the same instant, R rounds (kernel TCP, or
the UET transport with packet trimming at the switch ports: transport=uet, docs/uet.md).

    leafspine (default): receiver h1 on leaf1; senders on leaf2.. (hosts_per_leaf per leaf)
        h(senders) -> leaf2.. ==> spines ==> leaf1 ==[HTB host rate, the incast queue]==> h1
    dumbbell: h1..hN -> s1 ==[fabric rate]==> s2 ==[HTB host rate, the incast queue]==> r1

    sudo testbed run incast [--set senders=8 --set buffer_bytes=64K]     (or: sudo .venv/bin/python scenarios/incast.py)

The bottleneck is the receiver's downlink port: it gets `buffer_bytes` and the chosen discipline (droptail, RED
with min = k_bytes, or DCTCP-style step marking at K = k_bytes; testbed.workloads.bottleneck); every other port keeps
the
default queue. One persistent connection per sender; a round starts when every sender passes a barrier and ends
when the receiver holds all N blocks (traffic.incast). rounds.csv has one row per (round, sender). With
transport=uet every host runs the UET transport instead (traffic.uet_incast; its timer floor is rto_min_ms too),
every switch port trims (trim=auto; testbed.workloads.trimming), and uet.csv and trim.csv hold the transport's and
the switches' counters (analysis.uet: the uet_* numbers).
"""

import sys

from testbed.workloads.bottleneck import bottleneck_needs, build_spec
from testbed.workloads.trimming import TRIM_PARAMS, check_run as check_trim, trim_needs, trim_wanted
from testbed.errors import UsageError
from testbed.params import Param
from testbed.scenario import Scenario
from topologies.mininet_topo import SpecTopo
from topologies.routing import switch_ports_between
from traffic.uet_options import (ENTROPY_VALUES, RUN_LOSS_RULES, entropy_values_problem, loss_rule_for,
                                 loss_rule_problem)


PARAMS = [
    Param("senders", int, 8, "", "number of incast senders (N)", min=1, max=64),
    Param("block_bytes", int, 64_000, "bytes", "block each sender sends per round (B)", min=1000, max=100_000_000),
    Param("rounds", int, 10, "", "incast rounds (R)", min=1, max=10_000),
    Param("host_rate_mbps", float, 20.0, "Mbit/s", "host link rate (the receiver's downlink is the bottleneck)",
          min=0.1, max=10_000),
    Param("fabric_rate_mbps", float, 40.0, "Mbit/s", "leaf-spine link rate (dumbbell: the s1 -> s2 link)",
          min=0.1, max=10_000),
    Param("buffer_bytes", int, 64_000, "bytes", "bottleneck buffer (the receiver's leaf downlink port)",
          min=1600, max=1 << 30),
    Param("discipline", str, "droptail", "", "bottleneck queue discipline", choices=("droptail", "red", "step")),
    Param("ecn", bool, False, "", "hosts negotiate ECN; RED marks instead of dropping"),
    Param("k_bytes", int, 20_000, "bytes", "step marking threshold K; RED min threshold (max = min(3K, buffer))",
          min=1500, max=1 << 30),
    Param("cc", str, "cubic", "", "sender congestion control", choices=("cubic", "reno", "dctcp", "bbr")),
    Param("rto_min_ms", int, 200, "ms", "per-route TCP rto_min on the hosts (kernel default 200)", min=1,
          max=120_000),
    Param("seed", int, 0, "", "ECMP hash seed where the kernel has fib_multipath_hash_seed (0: the run's --seed)",
          min=0, max=2**32 - 1),
    Param("topology", str, "leafspine", "", "fabric shape", choices=("leafspine", "dumbbell")),
    Param("spines", int, 2, "", "leaf-spine: number of spines", min=1, max=16),
    Param("load_balancing", str, "ecmp", "", "leaf-spine: ecmp (5-tuple hash per flow), spray (per packet), "
          "flowlet (random uplink per flowlet) or adaptive (least congested path per flowlet)",
          choices=("ecmp", "spray", "flowlet", "adaptive")),
    Param("hosts_per_leaf", int, 4, "", "leaf-spine: hosts per leaf (senders fill leaf2, leaf3, ...)", min=1,
          max=64),
    Param("sample_interval_ms", float, 1.0, "ms", "queue sampling interval", min=0.1, max=1000),
    Param("transport", str, "tcp", "", "the blocks' transport: kernel TCP, or uet (Ultra Ethernet-style reliable "
          "unordered delivery over UDP with NACKs of trimmed packets, its retransmission timer floored at "
          "rto_min_ms too: docs/uet.md)", choices=("tcp", "uet")),
    Param("entropy_values", int, ENTROPY_VALUES, "", "transport=uet: UDP source ports each sender sprays its "
          "packets over in turn (UEC's entropy values; the fabric's L4 ECMP hash maps each to a spine)", min=1,
          max=256),
    Param("uet_loss_rule", str, "auto", "", "transport=uet: how a SACK reveals a loss: path (per entropy value: "
          "a later packet on the same EV delivered, else a time rule with that EV's own RTT; needs ECMP), rack "
          "(RACK's time rule over the whole flow, window max(1 ms, srtt/4)) or auto (path under ECMP, else rack): "
          "docs/uet.md", choices=RUN_LOSS_RULES),
    *TRIM_PARAMS,  # trim=auto (on with transport=uet) and its threshold (testbed.workloads.trimming)
]


def validate(p: dict) -> None:
    """UsageError when the parameters cannot make a valid fabric, or trimming cannot work with them."""
    spec = build_spec(p)[0]
    problem = entropy_values_problem(p.get("transport", "tcp"), p.get("entropy_values", ENTROPY_VALUES))
    if problem:
        raise UsageError(problem)
    problem = loss_rule_problem(p.get("transport", "tcp"), p.get("uet_loss_rule", "auto"),
                                p.get("load_balancing", "ecmp"))
    if problem:
        raise UsageError(problem)
    check_trim(p, spec)


def needs_for(p: dict) -> tuple[str, ...]:
    return bottleneck_needs(p) + trim_needs(p)


def _unfaithful(p: dict, q: dict, util: float, drops: int, timeouts: int, bottleneck: str,
                upstream: list[str]) -> list[str]:
    """Why this run is not faithful (analysis.fidelity): a busy CPU, a slow queue sampler, a shaper over its rate,
    a machine-limited bottleneck (``util``: against what its configured rate allowed; ``timeouts``: TCP's and UET's
    timer expiries, and ``upstream``: faults elsewhere during the rounds, either of which may leave it idle
    legitimately)."""
    from analysis import fidelity

    return fidelity.reasons(fidelity.cpu_busy(q["cpu_busy_fraction"]),
                            fidelity.sampling_too_slow(q["queue_sample_interval_s"], p["sample_interval_ms"] / 1e3),
                            fidelity.shaper_over_rate(util),
                            None if upstream else fidelity.machine_limited(util, drops, timeouts, bottleneck))


def _transport_numbers(p: dict, run, tm: dict, delta: dict, receiver: str, trim_numbers: dict) -> dict:
    """The transport's counters: kernel TCP's (tcp.csv, every host: the receiver sends only ACKs) and, over UET,
    each host's UET counters (uet.csv) and the switches' trimming numbers (uet_trim: off unless trimming ran)."""
    from analysis.uet import uet_metrics

    out = {"tcp_retrans_segs": tm.get("tcp_retrans_segs", 0), "tcp_timeouts": tm.get("tcp_timeouts", 0),
           "receiver_ce_packets": delta[receiver]["IpExtInCEPkts"], "transport": p["transport"]}
    if p["transport"] == "uet":
        out |= {**uet_metrics(run.uet), "uet_trim": "off"}
    return out | trim_numbers


def _utilisation(p: dict, lab, run, sent_bytes: int, bottleneck: str) -> tuple[float, list[str]]:
    """How busy the bottleneck was in the rounds: what it sent over their summed time, against what it could send
    then (its planned rate, or a slow-port fault's while one held it); and the other ports and links a fault held
    during the rounds (they can starve the bottleneck upstream)."""
    from analysis.faults import configured_rate_mbps, faulted_elsewhere
    from analysis.metrics import round_times

    rt = round_times(run.rounds)
    busy_s, spans, events = float(rt["round_s"].sum()), list(zip(rt["start_s"], rt["end_s"])), lab.fault_events()
    could_mbps = configured_rate_mbps(events, bottleneck, p["host_rate_mbps"], spans)
    util = sent_bytes * 8 / busy_s / 1e6 / could_mbps if busy_s > 0 else 0.0
    return util, faulted_elsewhere(events, bottleneck, spans)


def experiment(p: dict, lab) -> dict:
    from analysis import summary as asum
    from analysis.uet import uet_metrics

    _, receiver, senders, bottleneck = build_spec(p, lab.seed)
    n, block, rounds = p["senders"], p["block_bytes"], p["rounds"]
    watched = switch_ports_between(lab.net.spec, senders, receiver) | {bottleneck}
    queues = lab.sample_queues(every_ms=p["sample_interval_ms"], ports=watched)
    port = lab.port_deltas([bottleneck])
    tcp = lab.tcp_counters([receiver, *senders])
    lab.progress(f"{p['cc']}, ecn={p['ecn']}, rto_min {p['rto_min_ms']} ms; bottleneck {':'.join(bottleneck)} "
                 f"{p['discipline']} {p['buffer_bytes']} B at {p['host_rate_mbps']} Mbit/s")
    trimming = lab.trim(p["trim_threshold_bytes"]) if trim_wanted(p) else None
    lab.burst(senders, receiver, block, rounds=rounds, cc=p["cc"], transport=p["transport"],
              uet={"rto_min_ms": float(p["rto_min_ms"]), "entropy_values": p["entropy_values"],
                   "loss_rule": loss_rule_for(p["uet_loss_rule"], p["load_balancing"])})
    trim_numbers = trimming.finish() if trimming else {}
    queues.stop(lab.rundir)  # queues.csv and cpu.csv now: analysis reads them below
    delta = tcp.stop(lab.rundir)
    drops, sent_packets, marks = port.total("drops"), port.total("sent_packets"), port.total("marks")

    # round times, the bottleneck's backlog and the TCP counters: analysis, from the files just written
    run = asum.load_quietly(lab.rundir.path)
    rm = asum.round_metrics(run.rounds)
    backlog = asum.port_backlog(run.queues, *bottleneck, float(run.rounds["start_s"].min()),
                                float(run.rounds["end_s"].max()))
    tm = asum.tcp_metrics(run.tcp)
    q = queues.stats()
    util, upstream = _utilisation(p, lab, run, port.total("sent_bytes"), ":".join(bottleneck))
    timeouts = tm.get("tcp_timeouts", 0) + (uet_metrics(run.uet).get("uet_rto_events", 0)
                                            if p["transport"] == "uet" else 0)
    reasons = _unfaithful(p, q, util, drops, timeouts, ":".join(bottleneck), upstream)
    got = q["queue_sample_interval_s"]
    return {
        "senders": n,
        "rounds": rounds,
        "block_bytes": block,
        "topology": lab.net.spec.kind,
        "discipline": p["discipline"],
        "buffer_bytes": p["buffer_bytes"],
        "goodput_mbps": rm["round_goodput_mbps"],  # = round_goodput_mbps: all bytes / summed round time
        "bottleneck_utilisation": util,
        **rm,  # rounds_n, round_ms_p50/p95/p99/max (nearest rank), round_goodput_mbps
        "round_ms_ideal": n * block * 8 / (p["host_rate_mbps"] * 1e6) * 1e3,
        "bottleneck": ":".join(bottleneck),
        "bottleneck_drops": drops,
        "bottleneck_packets": sent_packets,
        "incast_loss_rate": drops / (drops + sent_packets) if drops + sent_packets else 0.0,
        "ecn_marks": marks,
        # the bottleneck's backlog (summed over classes) in the samples between the first start and the last end
        "queue_peak_bytes": backlog["bytes_max"],
        "queue_mean_bytes": backlog["bytes_mean"],
        "queue_sample_interval_ms": got * 1e3 if got == got else None,
        "queue_samples": q["queue_samples"],
        "cpu_busy_fraction": q["cpu_busy_fraction"],
        "fidelity_ok": not reasons,
        "fidelity_reasons": "; ".join(reasons),
        **_transport_numbers(p, run, tm, delta, receiver, trim_numbers),
    }


SCENARIO = Scenario(
    name="incast",
    summary="N senders x B bytes to one receiver at once, R rounds, over a leaf-spine or dumbbell (kernel TCP)",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo"),
    needs_for=needs_for,
    topology=lambda p, seed: SpecTopo(build_spec(p, seed)[0]),
    run=experiment,
    validate=validate,
    table=(("senders", "senders"), ("block_bytes", "block (bytes)"), ("rounds", "rounds"),
           ("goodput_mbps", "goodput (Mbit/s)"), ("round_ms_ideal", "ideal round (ms)"),
           ("round_ms_p50", "round p50 (ms)"), ("round_ms_p99", "round p99 (ms)"), ("round_ms_max", "round max (ms)"),
           ("bottleneck_drops", "bottleneck drops"), ("incast_loss_rate", "incast loss rate"),
           ("ecn_marks", "ECN marks"), ("tcp_retrans_segs", "TCP retransmitted segments"),
           ("tcp_timeouts", "TCP timeouts"), ("uet_rto_events", "UET timer expiries"),
           ("uet_trimmed_packets", "packets trimmed"), ("uet_nack_retransmits", "UET resent on NACK"),
           ("queue_peak_bytes", "queue peak (bytes)"),
           ("cpu_busy_fraction", "CPU busy"), ("fidelity_ok", "fidelity ok")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
