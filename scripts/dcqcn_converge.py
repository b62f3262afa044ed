#!/usr/bin/env python3
"""DCQCN's convergence from unequal rates, repeated (docs/dcqcn.md, "Convergence"). Runs in the lab VM (rxe, fq):

    testbed vm -- .venv/bin/python scripts/dcqcn_converge.py --runs 4 --out results/dcqcn-converge
    testbed vm -- .venv/bin/python scripts/dcqcn_converge.py --senders h3,h4,h2 --start 0,1,2 --messages 100,70,48

A fabric per run (testbed.workloads.dcqcn_incast, PFC + DCQCN with the run option's defaults): the first sender
writes alone, the others start later (``--start``, seconds after the first), each writing ``--messages`` 64 KiB
messages to h1 through its downlink at ``--bottleneck-mbps``; the defaults are the VM test's CONVERGE (h3 and h4,
1 s apart, 100 and 48 messages, 12 Mbit/s). Bad arguments: one line and exit status 2 before anything is built.
Per run: when the last flow started after the first (dcqcn_stagger_s), the first flow's rate then, how long until
Jain's index of the flows' rates stayed >= 0.9 (dcqcn_convergence_s in whole 0.5 s bins from the join,
analysis.dcqcn.convergence), Jain over the last third of those joint bins (dcqcn_jain_joint_last) and over the last
third of all bins with two flows sending (jain_last).
Each run's numbers go to OUT/runs.jsonl; the spread over every run there with the same arguments is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.dcqcn import jain_sending, lead_rates  # noqa: E402
from analysis.stats import estimate  # noqa: E402

KEYS = ("dcqcn_stagger_s", "dcqcn_convergence_s", "dcqcn_jain_join", "dcqcn_jain_joint_last", "jain_last",
        "first_rc_at_join_kbps",
        "dcqcn_joint_bins", "dcqcn_rate_cuts", "lossless_drops", "switch_pause_events", "cct_s")


def first_rc_at_join(rates) -> float:
    """The first flow's lowest Rc in the 0.5 s before the last flow's QP appeared (analysis.dcqcn.lead_rates)."""
    lead = lead_rates(rates, window_s=0.5)
    return float(lead.min()) if len(lead) else float("nan")


def summarize(log: Path, args: dict) -> None:
    rows = [r for r in map(json.loads, log.read_text().splitlines()) if r.get("args") == args]
    print(f"{len(rows)} runs with {args}")
    for k in KEYS:
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float)) and r[k] == r[k]]
        if vals:
            print(f"{k:24s} {estimate(vals).text()}  min {min(vals):.4g} max {max(vals):.4g}  (n={len(vals)})")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--out", default="results/dcqcn-converge")
    ap.add_argument("--senders", default="h3,h4")
    ap.add_argument("--start", default="0,1", help="seconds after the first writer's start, one per sender")
    ap.add_argument("--messages", default="100,48", help="64 KiB messages per sender")
    ap.add_argument("--bottleneck-mbps", type=float, default=12.0, help="h1's downlink (the hosts' line: 10)")
    a = ap.parse_args(argv)
    from testbed.errors import UsageError
    from testbed.workloads import dcqcn_incast as inc
    from testbed.workloads.dcqcn import DcqcnSettings

    try:
        if a.runs < 1:
            raise UsageError("--runs must be >= 1")
        try:
            start_s, messages = tuple(map(float, a.start.split(","))), tuple(map(int, a.messages.split(",")))
        except ValueError:
            raise UsageError("--start takes seconds and --messages counts, comma-separated") from None
        incast = inc.Incast(senders=tuple(a.senders.split(",")) if a.senders else (), start_s=start_s,
                            messages=messages, bottleneck_mbps=a.bottleneck_mbps)
    except UsageError as e:
        print(f"dcqcn_converge: {e}", file=sys.stderr)
        return 2
    args = {k: v for k, v in vars(a).items() if k not in ("runs", "out")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.jsonl", "a") as log:
        for i in range(a.runs):
            n = inc.run_incast(out / f"run-{i}", DcqcnSettings(), incast=incast)
            row = {k: v for k, v in n.items() if k not in ("rates", "counters", "started")}
            row.update(args=args, run=i, first_rc_at_join_kbps=first_rc_at_join(n["rates"]),
                       jain_bins=jain_sending(n["rates"]).round(3).values.tolist())
            log.write(json.dumps(row, default=str) + "\n")
            log.flush()
            print(json.dumps(row, default=str), flush=True)
    summarize(out / "runs.jsonl", args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
