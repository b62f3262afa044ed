"""Incast: N senders each send a block of B bytes to one receiver at the same instant, R rounds.

    leafspine (default): receiver h1 on leaf1; senders on leaf2.. (hosts_per_leaf per leaf)

        h(senders) -> leaf2.. ==> spines ==> leaf1 ==[HTB host rate, the incast queue]==> h1

    dumbbell: h1..hN -> s1 ==[fabric rate]==> s2 ==[HTB host rate, the incast queue]==> r1

The bottleneck is the receiver's downlink port (leaf1 -> h1, or s2 -> r1): the queue under study gets
`buffer_bytes` and the chosen discipline (droptail, RED with min = k_bytes, max = min(3 K, buffer), probability 0.1,
or DCTCP-style step marking at K = k_bytes); every other port keeps the topology's default queue (256 KiB
droptail), and the host NICs are shaped at the host rate like every port.

Traffic is kernel TCP, one persistent connection per sender, sockets opened in-process inside each host's namespace.
A round starts when every sender passes a barrier (each records its own start just before it writes its block) and
ends when the receiver holds all N blocks; the next round starts only then. rounds.csv has one row per (round,
sender): the sender's start and the time the receiver read the block's last byte.
"""

from __future__ import annotations


from testbed.params import Param
from testbed.scenario import RunContext, Scenario
from testbed.bottleneck import build_spec, bottleneck_needs
from traffic.incast import PORT, ROUND_TIMEOUT_S, ROUNDS_COLUMNS, IncastRounds

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
    Param("load_balancing", str, "ecmp", "", "leaf-spine: ecmp (5-tuple hash per flow) or spray (per packet)",
          choices=("ecmp", "spray")),
    Param("hosts_per_leaf", int, 4, "", "leaf-spine: hosts per leaf (senders fill leaf2, leaf3, ...)", min=1,
          max=64),
    Param("sample_interval_ms", float, 1.0, "ms", "queue sampling interval", min=0.1, max=1000),
]


def _validate(p: dict) -> None:
    build_spec(p)


def _run(p: dict, ctx: RunContext) -> dict:
    from testbed.fabric import Fabric
    from testbed.kernel import counters, netns, qdisc
    from testbed.telemetry import QueueSampler
    from topologies import path_links, ports_on_paths

    topo, receiver, senders, (bn_node, bn_port) = build_spec(p, ctx.seed)
    n, block, rounds = p["senders"], p["block_bytes"], p["rounds"]
    fabric = Fabric(topo, ctx.run_id)
    ctx.rundir.manifest["topology"] = fabric.describe()
    ctx.rundir.write_manifest()
    ctx.progress(f"building {topo.kind}: {len(topo.nodes)} namespaces, bottleneck {bn_node}:{bn_port} "
                 f"{p['discipline']} {p['buffer_bytes']} B at {p['host_rate_mbps']} Mbit/s")
    fabric.build(ctx.state, ctx.on_teardown)
    ctx.rundir.manifest["topology"] = fabric.describe()
    ctx.rundir.write_manifest()

    hosts = [receiver, *senders]
    inc = IncastRounds(senders, receiver, {h: (fabric.ns(h), fabric.host_ip(h)) for h in hosts}, netns.entered,
                       block, port=PORT, cc=p["cc"])
    ctx.on_teardown(inc.close)
    inc.connect()
    ctx.progress(f"{n} connections up ({p['cc']}, ecn={p['ecn']}, rto_min {p['rto_min_ms']} ms)")

    watch = set()
    for h in senders:
        watch |= ports_on_paths(path_links(topo, h, receiver))
    watch = {(nd, pt) for nd, pt in watch if topo.node(nd).role != "host"}  # switch ports only
    watch.add((bn_node, bn_port))
    sampler = QueueSampler(fabric, interval_s=p["sample_interval_ms"] / 1000.0, ports=watch)
    bn_ns = fabric.ns(bn_node)
    before_q = qdisc.port_stats(bn_ns, bn_port)
    before = {h: counters.tcp_counters(fabric.ns(h)) for h in hosts}
    sampler.start()
    ctx.progress(f"{rounds} rounds of {n} x {block} B")
    try:
        rows = inc.run(rounds, round_timeout_s=ROUND_TIMEOUT_S)
    finally:
        sampler.stop()
    after = {h: counters.tcp_counters(fabric.ns(h)) for h in hosts}
    after_q = qdisc.port_stats(bn_ns, bn_port)

    ctx.rundir.write_csv("rounds.csv", ROUNDS_COLUMNS,
                         ((r, h, f"{s:.6f}", f"{e:.6f}", b) for r, h, s, e, b in rows))
    ctx.rundir.write_csv("tcp.csv", ["host", "phase", "counter", "value"],
                         [(h, ph, k, d[h].get(k, 0)) for ph, d in (("before", before), ("after", after))
                          for h in hosts for k in counters.KEY_COUNTERS])
    sampler.write(ctx.rundir)

    def delta(key: str, hs=senders) -> int:
        return sum(after[h].get(key, 0) - before[h].get(key, 0) for h in hs)

    def qdelta(attr: str) -> int:
        return sum(getattr(a, attr) for a in after_q) - sum(getattr(b, attr) for b in before_q)

    # round times, goodput, the bottleneck's backlog and the TCP counters: analysis, from the files just written
    from analysis import summary as asum
    from analysis.metrics import round_times

    run = asum.load_quietly(ctx.rundir.path)
    rm = asum.round_metrics(run.rounds)
    busy = float(round_times(run.rounds)["round_s"].sum())
    bq = asum.port_backlog(run.queues, bn_node, bn_port, float(run.rounds["start_s"].min()),
                           float(run.rounds["end_s"].max()))
    tm = asum.tcp_metrics(run.tcp)
    drops, sent_pk, marks = qdelta("drops"), qdelta("sent_packets"), qdelta("marks")
    q_stats = sampler.stats()
    reasons = []
    if q_stats["cpu_busy_fraction"] > 0.9:
        reasons.append(f"CPU {q_stats['cpu_busy_fraction']:.0%} busy: software switching may lag the shapers")
    want = p["sample_interval_ms"] / 1000.0
    got = q_stats["queue_sample_interval_s"]
    if not got == got or got > 5 * want:  # NaN or too slow
        reasons.append(f"queue sampling achieved {got * 1e3:.2f} ms, asked {want * 1e3:.2f} ms")
    bn_bytes = qdelta("sent_bytes")
    util = bn_bytes * 8 / busy / 1e6 / p["host_rate_mbps"] if busy > 0 else 0.0
    if util > 1.05:
        reasons.append(f"bottleneck sent {util:.2f} x its configured rate: shaper not in control")
    return {
        "senders": n,
        "rounds": rounds,
        "block_bytes": block,
        "topology": topo.kind,
        "discipline": p["discipline"],
        "buffer_bytes": p["buffer_bytes"],
        "goodput_mbps": rm["round_goodput_mbps"],  # = round_goodput_mbps: all bytes / summed round time
        "bottleneck_utilisation": util,
        **rm,  # rounds_n, round_ms_p50/p95/p99/max (nearest rank), round_goodput_mbps
        "round_ms_ideal": n * block * 8 / (p["host_rate_mbps"] * 1e6) * 1e3,
        "bottleneck": f"{bn_node}:{bn_port}",
        "bottleneck_drops": drops,
        "bottleneck_packets": sent_pk,
        "incast_loss_rate": drops / (drops + sent_pk) if drops + sent_pk else 0.0,
        "ecn_marks": marks,
        "tcp_retrans_segs": tm.get("tcp_retrans_segs", 0),  # every host of tcp.csv (the receiver sends only ACKs)
        "tcp_timeouts": tm.get("tcp_timeouts", 0),
        "receiver_ce_packets": delta("IpExtInCEPkts", [receiver]),
        # the bottleneck's backlog (summed over classes) in the samples between the first start and the last end
        "queue_peak_bytes": bq["bytes_max"],
        "queue_mean_bytes": bq["bytes_mean"],
        "queue_sample_interval_ms": got * 1e3 if got == got else None,
        "queue_samples": q_stats["queue_samples"],
        "cpu_busy_fraction": q_stats["cpu_busy_fraction"],
        "fidelity_ok": not reasons,
        "fidelity_reasons": "; ".join(reasons),
    }


SCENARIO = Scenario(
    name="incast",
    summary="N senders x B bytes to one receiver at once, R rounds, over a leaf-spine or dumbbell (kernel TCP)",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo"),
    needs_for=bottleneck_needs,
    run=_run,
    validate=_validate,
    table=(("senders", "senders"), ("block_bytes", "block (bytes)"), ("rounds", "rounds"),
           ("goodput_mbps", "goodput (Mbit/s)"), ("round_ms_ideal", "ideal round (ms)"),
           ("round_ms_p50", "round p50 (ms)"), ("round_ms_p99", "round p99 (ms)"), ("round_ms_max", "round max (ms)"),
           ("bottleneck_drops", "bottleneck drops"), ("incast_loss_rate", "incast loss rate"),
           ("ecn_marks", "ECN marks"), ("tcp_retrans_segs", "TCP retransmitted segments"),
           ("tcp_timeouts", "TCP timeouts"), ("queue_peak_bytes", "queue peak (bytes)"),
           ("cpu_busy_fraction", "CPU busy"), ("fidelity_ok", "fidelity ok")),
)
