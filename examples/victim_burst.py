#!/usr/bin/env python3
"""A victim flow: two long TCP flows, then a synchronized 15 -> 1 burst of small messages to the second flow's
receiver, behind a small drop-tail buffer on its leaf port.

    sudo .venv/bin/python examples/victim_burst.py [--out DIR] [--rounds 15] [--size 32000]

The victim (h7 -> h2) is alone on h2's 20 Mbit/s port, so its fair share is that port's rate; during the burst it
gets less, because every round overflows the 32 kB buffer and the victim loses packets with the burst's. Prints the
victim's goodput before and during the burst, and the rounds' completion-time p50/p99.
"""

import argparse
import json
import time

from testbed.lab import Lab
from topologies import QueueSpec
from topologies.mininet_topo import LeafSpineTopo

HOST_RATE_MBPS = 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="run directory (default results/victim_burst-<time>)")
    ap.add_argument("--rounds", type=int, default=15, help="burst rounds")
    ap.add_argument("--size", type=int, default=32000, help="bytes each sender sends per round")
    ap.add_argument("--buffer", type=int, default=32000, help="leaf downlink drop-tail buffer (bytes)")
    args = ap.parse_args()

    topo = LeafSpineTopo(spines=2, leaves=4, hosts_per_leaf=5, host_rate_mbps=HOST_RATE_MBPS, fabric_rate_mbps=40,
                         leaf_down_queue=QueueSpec(buffer_bytes=args.buffer))
    with Lab(topo, out=args.out, seed=1, name="victim_burst") as lab:
        lab.sample_queues(every_ms=5, ports=[("leaf1", "h2")])
        flows = lab.flows([("h6", "h1"), ("h7", "h2")])                  # two long flows, leaf2 -> leaf1
        senders = [h for h in lab.hosts if h.name not in ("h1", "h2", "h6", "h7")][:15]
        time.sleep(1.0)                                                  # slow start is over
        t0 = flows.snapshot()
        time.sleep(2.0)
        t1 = flows.snapshot()                                            # before: the victim alone on h2's port
        burst = lab.burst(senders, "h2", args.size, rounds=args.rounds)  # 15 -> 1, synchronized rounds
        t2 = flows.snapshot()
        flows.stop()

    before = flows.goodput_mbps(t0, t1)[1]
    during = flows.goodput_mbps(t1, t2)[1]
    burst_mbps = sum(r[4] for r in burst.rows) * 8 / (burst.end_s - burst.start_s) / 1e6
    p = burst.percentiles_ms()
    result = {"victim_before_mbps": before, "victim_during_mbps": during, "fair_share_mbps": HOST_RATE_MBPS,
              "victim_ratio": during / HOST_RATE_MBPS, "burst_goodput_mbps": burst_mbps,
              "round_ms_p50": p.p50, "round_ms_p99": p.p99, "rounds": p.n,
              "ideal_round_ms": 15 * args.size * 8 / (HOST_RATE_MBPS * 1e6) * 1e3}
    print(f"victim h7>h2: {before:.1f} Mbit/s alone, {during:.1f} Mbit/s during the burst "
          f"({during / HOST_RATE_MBPS:.0%} of its fair share {HOST_RATE_MBPS} Mbit/s); burst {burst_mbps:.1f} Mbit/s")
    print(f"burst: {p.n} rounds of 15 x {args.size} B, completion p50 {p.p50:.0f} ms, p99 {p.p99:.0f} ms "
          f"(ideal {result['ideal_round_ms']:.0f} ms)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
