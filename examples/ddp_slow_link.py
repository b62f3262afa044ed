#!/usr/bin/env python3
"""A real PyTorch job meets a degraded link: 4 DDP ranks over gloo on a leaf-spine, and halfway through, rank 0's
host link drops to a quarter of its rate (a slow optic, a port renegotiated down).

    sudo .venv/bin/python examples/ddp_slow_link.py [--out DIR] [--steps 16] [--fraction 0.25]

Every rank is a process in its host, started as torchrun starts it; its training loop reports its steps through
the event protocol (docs/programs.md), and the fault starts when rank 0 begins step --fault-at-step. The synchronous
all-reduce makes every rank as slow as the slowest link: prints the step-time p50 before and after the fault.
"""

import argparse
import json
import statistics

from testbed.lab import Lab
from topologies.mininet_topo import LeafSpineTopo

PROGRAM = "/usr/bin/python3 examples/programs/ddp_train.py --steps {steps}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="run directory (default results/ddp_slow_link-<time>)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--fault-at-step", type=int, default=8, help="the program's step at which the link slows")
    ap.add_argument("--fraction", type=float, default=0.25, help="the slow port's share of its rate")
    args = ap.parse_args()

    topo = LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=20)
    with Lab(topo, out=args.out, seed=1, name="ddp_slow_link") as lab:
        lab.sample_queues(every_ms=10)
        lab.tcp_counters()
        # when rank 0 begins step N (its own step_begin event), rank 0's host link slows, both ways
        lab.at_iteration(args.fault_at_step, f"slow-port leaf1:h1 at_s=0 fraction={args.fraction}")
        lab.at_iteration(args.fault_at_step, f"slow-port h1:eth0 at_s=0 fraction={args.fraction}")
        job = lab.launch(PROGRAM.format(steps=args.steps), hosts=["h1", "h2", "h3", "h4"], timeout_s=300,
                         warmup_steps=1)
        res = job.wait()
        steps = {}  # step -> (start of its first rank, end of its last rank)
        for row in res.ops_rows:
            s, e = steps.get(row["iteration"], (row["iter_start_s"], row["end_s"]))
            steps[row["iteration"]] = (min(s, row["iter_start_s"]), max(e, row["end_s"]))
        before = [e - s for k, (s, e) in steps.items() if k < args.fault_at_step]
        after = [e - s for k, (s, e) in steps.items() if k > args.fault_at_step]  # the fault's step: mixed
        out = {"steps_before": len(before), "steps_after": len(after),
               "step_ms_before_p50": statistics.median(before) * 1e3 if before else None,
               "step_ms_after_p50": statistics.median(after) * 1e3 if after else None,
               "exit_status": sorted(set(res.exit_status.values())), "fraction": args.fraction}
        print(f"# DDP step p50 before the slow link: {out['step_ms_before_p50']:.0f} ms ({len(before)} steps); "
              f"after: {out['step_ms_after_p50']:.0f} ms ({len(after)} steps): one slow host link slows every rank")
        print(json.dumps(out))


if __name__ == "__main__":
    main()
