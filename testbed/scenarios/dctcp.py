"""DCTCP vs TCP: how full does the bottleneck queue run?

    h1..hN -> s1 ==[fabric rate]==> s2 ==[HTB host rate, the queue under study]==> r1

A few long-lived flows share one bottleneck for `duration_s`. With CUBIC over drop-tail the queue fills the buffer
(loss is the only signal); with DCTCP senders and step marking at K (mark every ECN-capable packet while the
instantaneous queue exceeds K, as DCTCP switches do) the queue hovers near K with the same throughput: the classic
result of Alizadeh et al., SIGCOMM 2010, and the reason AI fabrics run ECN.

The summary's queue statistics come from the telemetry samples of the bottleneck port taken after a warm-up
(`warmup_s`), so slow start does not count.
"""

from __future__ import annotations

import socket
import threading
import time

from testbed.errors import UsageError
from testbed.params import Param
from testbed.scenario import RunContext, Scenario

PORT = 5401

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
    Param("sample_interval_ms", float, 1.0, "ms", "queue sampling interval", min=0.1, max=1000),
]


def _incast_params(p: dict) -> dict:
    """The same fabric the incast scenario builds for topology=dumbbell."""
    return {"senders": p["senders"], "discipline": p["discipline"], "k_bytes": p["k_bytes"],
            "buffer_bytes": p["buffer_bytes"], "cc": p["cc"], "ecn": p["ecn"], "rto_min_ms": 200, "seed": 0,
            "host_rate_mbps": p["host_rate_mbps"], "fabric_rate_mbps": p["fabric_rate_mbps"],
            "topology": "dumbbell", "hosts_per_leaf": 1, "spines": 1}


def _validate(p: dict) -> None:
    from testbed.bottleneck import build_spec

    if p["warmup_s"] >= p["duration_s"]:
        raise UsageError(f"warmup_s ({p['warmup_s']}) must be < duration_s ({p['duration_s']})")
    if p["cc"] == "dctcp" and not p["ecn"]:
        raise UsageError("cc=dctcp needs ecn=true")
    build_spec(_incast_params(p))


def _run(p: dict, ctx: RunContext) -> dict:
    from testbed.fabric import Fabric
    from testbed.kernel import counters, netns
    from testbed.bottleneck import build_spec
    from testbed.telemetry import QueueSampler

    topo, receiver, senders, (bn_node, bn_port) = build_spec(_incast_params(p), ctx.seed)
    fabric = Fabric(topo, ctx.run_id)
    ctx.progress(f"building dumbbell: {len(senders)} senders, bottleneck {bn_node}:{bn_port} {p['discipline']} "
                 f"K={p['k_bytes']} B, buffer {p['buffer_bytes']} B at {p['host_rate_mbps']} Mbit/s")
    fabric.build(ctx.state, ctx.on_teardown)
    ctx.rundir.manifest["topology"] = fabric.describe()
    ctx.rundir.write_manifest()

    rip = fabric.host_ip(receiver)
    cc = p["cc"].encode()
    with netns.entered(fabric.ns(receiver)):
        lsock = socket.socket()
    ctx.on_teardown(lsock.close)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc)
    lsock.bind((rip, PORT))
    lsock.listen(len(senders) + 4)
    socks = []
    for h in senders:
        with netns.entered(fabric.ns(h)):
            s = socket.socket()
        ctx.on_teardown(s.close)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc)
        s.settimeout(30)
        s.connect((rip, PORT))
        socks.append(s)
    lsock.settimeout(30)
    conns = []
    for _ in senders:
        c, _addr = lsock.accept()
        ctx.on_teardown(c.close)
        conns.append(c)

    received = [0] * len(conns)

    def drain(i: int, c: socket.socket) -> None:
        c.settimeout(p["duration_s"] + 30)
        while True:
            b = c.recv(1 << 16)
            if not b:
                return
            received[i] += len(b)

    stop_at = [0.0]

    def blast(s: socket.socket) -> None:
        buf = bytes(1 << 16)
        s.settimeout(5)
        while time.monotonic() < stop_at[0]:
            try:
                s.send(buf)
            except socket.timeout:
                continue
        s.shutdown(socket.SHUT_WR)

    hosts = [receiver, *senders]
    before = {h: counters.tcp_counters(fabric.ns(h)) for h in hosts}
    sampler = QueueSampler(fabric, interval_s=p["sample_interval_ms"] / 1000, ports=[(bn_node, bn_port)])
    sampler.start()
    ctx.progress(f"{len(senders)} x {p['cc']} for {p['duration_s']} s")
    t0 = time.monotonic()
    stop_at[0] = t0 + p["duration_s"]
    drains = [threading.Thread(target=drain, args=(i, c), daemon=True) for i, c in enumerate(conns)]
    blasts = [threading.Thread(target=blast, args=(s,), daemon=True) for s in socks]
    for t in drains + blasts:
        t.start()
    for t in blasts + drains:
        t.join(timeout=p["duration_s"] + 60)
    t1 = time.monotonic()
    sampler.stop()
    after = {h: counters.tcp_counters(fabric.ns(h)) for h in hosts}
    sampler.write(ctx.rundir)
    ctx.rundir.write_csv("tcp.csv", ["host", "phase", "counter", "value"],
                         [(h, ph, k, d[h].get(k, 0)) for ph, d in (("before", before), ("after", after))
                          for h in hosts for k in counters.KEY_COUNTERS])

    # the bottleneck's queue after the warm-up, its counters and the hosts': analysis, from queues.csv and tcp.csv
    from analysis import summary as asum

    run = asum.load_quietly(ctx.rundir.path)
    bq = asum.port_backlog(run.queues, bn_node, bn_port, t0 + p["warmup_s"])
    tm = asum.tcp_metrics(run.tcp)
    busy = sampler.cpu.mean_busy
    reasons = []
    if busy > 0.9:
        reasons.append(f"CPU {busy:.0%} busy: the emulation may not have kept up")
    goodput = sum(received) * 8 / (t1 - t0) / 1e6
    if goodput < 0.8 * p["host_rate_mbps"]:
        reasons.append(f"goodput {goodput:.1f} Mbit/s below 80% of the {p['host_rate_mbps']} Mbit/s bottleneck")
    return {
        "senders": len(senders), "cc": p["cc"], "discipline": p["discipline"], "k_bytes": p["k_bytes"],
        "k_packets": round(p["k_bytes"] / 1514, 1), "buffer_bytes": p["buffer_bytes"],
        "goodput_mbps": goodput,
        "queue_median_packets": bq["packets_median"],
        "queue_p90_packets": bq["packets_p90"],  # nearest rank
        "queue_max_packets": bq["packets_max"],
        "queue_mean_packets": bq["packets_mean"],
        "queue_mean_bytes": bq["bytes_mean"],
        # counter increases over the bottleneck's samples (whole run)
        "bottleneck_drops": bq["drops"], "ecn_marks": bq["marks"], "bottleneck_packets": bq["sent_packets"],
        "tcp_retrans_segs": tm.get("tcp_retrans_segs", 0), "tcp_timeouts": tm.get("tcp_timeouts", 0),
        **sampler.stats(),
        "fidelity_ok": not reasons, "fidelity_reasons": reasons,
    }


SCENARIO = Scenario(
    name="dctcp",
    summary="long-lived flows through one bottleneck: queue occupancy under DCTCP step marking vs TCP drop-tail",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo", "qdisc:red+ecn", "tcp:dctcp", "sysctl:ecn"),
    run=_run,
    validate=_validate,
    table=(("cc", "congestion control"), ("discipline", "bottleneck discipline"), ("k_packets", "K (packets)"),
           ("goodput_mbps", "goodput (Mbit/s)"), ("queue_median_packets", "queue median (packets)"),
           ("queue_p90_packets", "queue p90 (packets)"), ("queue_max_packets", "queue max (packets)"),
           ("ecn_marks", "ECN marks"), ("bottleneck_drops", "drops"), ("tcp_retrans_segs", "TCP retransmits"),
           ("queue_sample_interval_s", "achieved sample interval (s)"), ("fidelity_ok", "fidelity ok")),
)
