#!/usr/bin/env python3
"""An all-reduce behind one bulk flow: a 4-rank ring all-reduce on a small leaf-spine, first alone, then with a
background TCP flow into a host the ring also sends to, behind a small drop-tail buffer.

    sudo .venv/bin/python examples/allreduce_tail.py [--out DIR] [--iterations 10] [--size 256K] [--buffer 32000]

The ring (h1 -> h2 -> h3 -> h4 -> h1) crosses the fabric twice; its hop h2 -> h3 shares leaf2's 20 Mbit/s port
towards h3 with the flow h1 -> h3. Alone, that port carries the ring's hop at the rate h2's own link allows (and
h4's ACKs to h3) and drops next to nothing; with the flow beside it the port's 32 kB buffer overflows, the hop gets
about half the port, and every iteration waits for its slowest hop: the collective's completion time (CCT) grows,
and the port's drop counter in the kernel says why. Each run is its own Lab (run directories DIR/alone and DIR/busy)
and ``lab.collective`` runs the job: one agent per rank, real buffers over kernel TCP, every result checked. Prints
both runs' CCT p50/p99, the port's drops, and the two sets of per-iteration CCTs compared (analysis.stats); the last
line is JSON.
"""

import argparse
import dataclasses
import json
from pathlib import Path

from analysis import stats
from testbed.lab import Lab
from testbed.rundir import default_out
from testbed.workloads.settings import CollectiveSettings
from topologies import QueueSpec
from topologies.mininet_topo import LeafSpineTopo

HOST_RATE_MBPS = 20
PORT = ("leaf2", "h3")  # the shared port: leaf2's egress towards h3


def run(out: Path, job: CollectiveSettings, buffer_bytes: int) -> dict:
    topo = LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=2, host_rate_mbps=HOST_RATE_MBPS, fabric_rate_mbps=40,
                         leaf_down_queue=QueueSpec(buffer_bytes=buffer_bytes))
    job.check(topo)  # ranks, hosts and background checked before anything is built
    with Lab(topo, out=out, seed=1, name="allreduce_tail", params=dataclasses.asdict(job)) as lab:
        c = lab.collective(job)  # blocks until the last iteration; the background flow runs beside it
        lab.summary.update(c.summary())  # into summary.json; writes sweep.csv, prints the nccl-tests table
    p = c.percentiles_ms()
    return {"cct_ms": c.cct_ms, "cct_ms_p50": p.p50, "cct_ms_p99": p.p99, "verified": c.verified,
            "port_drops": c.port_deltas[PORT]["drops"], "port_sent_packets": c.port_deltas[PORT]["sent_packets"],
            "bound_ms": lab.summary["bound_ms"], "bg_goodput_mbps": lab.summary["bg_goodput_mbps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="parent of the two run directories (default results/allreduce_tail-<time>)")
    ap.add_argument("--iterations", type=int, default=10, help="measured all-reduces per run")
    ap.add_argument("--size", default="256K", help="per-rank message size")
    ap.add_argument("--buffer", type=int, default=32000, help="leaf downlink drop-tail buffer (bytes)")
    args = ap.parse_args()

    out = Path(args.out) if args.out else default_out("allreduce_tail")
    job = CollectiveSettings("allreduce", size=args.size, ranks=4, iterations=args.iterations, warmup=1)
    alone = run(out / "alone", job, args.buffer)
    busy = run(out / "busy", dataclasses.replace(job, background="h1>h3"), args.buffer)

    diff = stats.compare(busy["cct_ms"], alone["cct_ms"])  # per-iteration CCTs, busy against alone
    for name, r in (("alone", alone), ("busy", busy)):
        print(f"{name:>5}: CCT p50 {r['cct_ms_p50']:.0f} ms, p99 {r['cct_ms_p99']:.0f} ms (bound "
              f"{r['bound_ms']:.0f} ms); {PORT[0]}:{PORT[1]} dropped {r['port_drops']} of "
              f"{r['port_sent_packets'] + r['port_drops']} packets; data verified: {r['verified']}")
    print(f"busy / alone CCT: {diff.ratio:.2f} [{diff.ratio_low:.2f}, {diff.ratio_high:.2f}], {diff.verdict}")
    print(json.dumps({"alone": {k: v for k, v in alone.items() if k != "cct_ms"},
                      "busy": {k: v for k, v in busy.items() if k != "cct_ms"},
                      "iterations": args.iterations, "ratio": diff.ratio, "ratio_low": diff.ratio_low,
                      "verdict": diff.verdict}))


if __name__ == "__main__":
    main()
