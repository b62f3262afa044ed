#!/usr/bin/env python3
"""An ECMP collision: two elephant flows leaf1 -> leaf2 whose 5-tuples hash onto the same spine, then the same two
flows with adaptive (CONGA-style flowlet) load balancing and with per-packet spraying.

    sudo .venv/bin/python examples/ecmp_collision.py [--out DIR] [--no-spray | --no-adaptive]

Every link runs at the host rate, so two flows that share a leaf1 uplink get half of it each. The source ports are
chosen, the flows started, and leaf1's uplink counters (what the kernel sent on each port) tell which spines they
took; other ports are tried until both flows share one uplink. The adaptive balancer (an eBPF program on the
leaves' uplinks, `testbed doctor` bpf:flowlet) sees the first flow's bytes on its uplink when the second flow starts
and sends that one up the other spine. Spraying needs tc's basic/meta classifier and the
skbedit/mirred actions (`testbed doctor`); --no-spray skips that half on a kernel without them, --no-adaptive
the adaptive half (the ECMP half always runs: it finds the colliding source ports the others reuse; one of the
other two must stay, or there is nothing to set the collision against).
"""

import argparse
import json
import random
import sys
import time

from testbed.lab import Lab
from topologies.mininet_topo import LeafSpineTopo

RATE_MBPS = 20
PAIRS = [("h1", "h3"), ("h2", "h4")]


def topo(lb: str) -> LeafSpineTopo:
    return LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=RATE_MBPS, fabric_rate_mbps=RATE_MBPS,
                         load_balancing=lb)


def uplink_share(lab: Lab, seconds: float) -> list[int]:
    """Packets each leaf1 uplink sent in ``seconds`` (from the kernel's qdisc counters)."""
    ups = [("leaf1", "spine1"), ("leaf1", "spine2")]
    a = lab.port_counters()
    time.sleep(seconds)
    b = lab.port_counters()
    return [b[u]["sent_packets"] - a[u]["sent_packets"] for u in ups]


def pair_mbps(flows, seconds: float) -> float:
    t0 = flows.snapshot()
    time.sleep(seconds)
    return sum(flows.goodput_mbps(t0, flows.snapshot()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The options; a combination that cannot run is one line on stderr and exit status 2, before any lab."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="run directory prefix (default results/ecmp_collision-<time>)")
    ap.add_argument("--no-spray", action="store_true", help="skip the spraying half (ECMP, then adaptive)")
    ap.add_argument("--no-adaptive", action="store_true", help="skip the adaptive half (ECMP, then spraying)")
    ap.add_argument("--tries", type=int, default=20, help="source-port pairs to try for a collision")
    ap.add_argument("--seconds", type=float, default=4.0, help="measurement time")
    args = ap.parse_args(argv)
    error = None
    if args.no_spray and args.no_adaptive:
        error = "--no-spray and --no-adaptive together leave the ECMP collision with nothing to compare it to"
    elif args.tries < 1:
        error = f"--tries {args.tries}: must be at least 1"
    elif args.seconds <= 0:
        error = f"--seconds {args.seconds:g}: must be above 0"
    if error:
        print(f"ecmp_collision.py: error: {error}", file=sys.stderr)
        raise SystemExit(2)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    rng = random.Random(1)
    result = {"link_mbps": RATE_MBPS}

    with Lab(topo("ecmp"), out=args.out and f"{args.out}/ecmp", name="ecmp_collision") as lab:
        for attempt in range(1, args.tries + 1):
            ports = [rng.randrange(20000, 60000) for _ in PAIRS]
            flows = lab.flows(PAIRS, src_ports=ports)
            time.sleep(0.5)
            ups = uplink_share(lab, 1.0)
            if min(ups) < 0.1 * max(ups):  # one uplink carries both
                break
            flows.stop()
        else:
            raise SystemExit(f"no collision in {args.tries} tries")
        result.update(ecmp_mbps=pair_mbps(flows, args.seconds), src_ports=ports, tries=attempt, uplink_packets=ups)
        flows.stop()
    print(f"ECMP: source ports {ports} collide on one spine (leaf1 uplinks sent {ups} packets, try {attempt}); "
          f"the pair gets {result['ecmp_mbps']:.1f} of {2 * RATE_MBPS} Mbit/s")

    if not args.no_adaptive:
        with Lab(topo("adaptive"), out=args.out and f"{args.out}/adaptive", name="ecmp_collision") as lab:
            flows = lab.flows(PAIRS, src_ports=ports)
            time.sleep(0.5)
            result.update(adaptive_mbps=pair_mbps(flows, args.seconds),
                          adaptive_uplink_packets=uplink_share(lab, 1.0))
        print(f"adaptive: the same pair gets {result['adaptive_mbps']:.1f} of {2 * RATE_MBPS} Mbit/s "
              f"(leaf1 uplinks sent {result['adaptive_uplink_packets']} packets)")

    if not args.no_spray:
        with Lab(topo("spray"), out=args.out and f"{args.out}/spray", name="ecmp_collision") as lab:
            for a, b in PAIRS:  # resolve the neighbours first: a connect racing ARP on a sprayed path once got
                lab.net[a].cmd("ping -c3 -W2", lab.net[b].IP())  # EHOSTUNREACH in the lab VM
            flows = lab.flows(PAIRS, src_ports=ports)
            time.sleep(0.5)
            result.update(spray_mbps=pair_mbps(flows, args.seconds), spray_uplink_packets=uplink_share(lab, 1.0))
        print(f"spray: the same pair gets {result['spray_mbps']:.1f} of {2 * RATE_MBPS} Mbit/s "
              f"(leaf1 uplinks sent {result['spray_uplink_packets']} packets)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
