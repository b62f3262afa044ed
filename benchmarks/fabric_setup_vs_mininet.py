#!/usr/bin/env python3
"""Benchmark: fabric set-up + tear-down time of the testbed (its netlink builder alone, and the Mininet network
built on it, testbed.network.net.TestbedNet) vs Mininet's stock TCLink: same topology, same run, same kernel.

    sudo .venv/bin/python benchmarks/fabric_setup_vs_mininet.py [--spines 2 --leaves 4 --hosts-per-leaf 4]
                                                                [--repeats 3]
    sudo testbed vm -- .venv/bin/python benchmarks/fabric_setup_vs_mininet.py --repeats 1     # in the lab VM

Topology: an L3 leaf-spine. For Mininet every leaf and spine is a Mininet Host acting as a router (no OVS and no
controller, so both sides build the same thing: namespaces, veth pairs, HTB-shaped ports, addresses, routes).
Mininet's TCLink shapes each link with `tc` processes (htb + its default queue); testbed configures the same
through netlink in-process.

Each build runs ``--repeats`` times, each time in a fresh Python process (as a user's script or ``mn`` would: no
warm caches, and stock Mininet's one-time ``Mininet.init()`` paid every time), the three builders interleaved so
that a busy machine slows them alike. Printed: the median set-up, tear-down and total of each with its
distribution-free interval and n (analysis.stats.estimate; 3 runs give the range, 75% coverage; 5 give 94%), and
each testbed build's times over stock Mininet's as the ratio of medians with its bootstrap interval
(analysis.stats.compare).

Stock Mininet raises host sysctls in ``Mininet.init()`` (``fixLimits``: socket buffer maxima, TCP buffer ranges,
neighbour thresholds, pty max) and never restores them; the benchmark records them first (so ``testbed clean``
restores them after a kill) and puts them back afterwards (testbed.kernel.hostguard).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def testbed_build(spines: int, leaves: int, hpl: int, rate: float) -> tuple[float, float, int]:
    from testbed.network.fabric import Fabric
    from testbed.kernel.state import RunState
    from topologies import uniform_leaf_spine

    spec = uniform_leaf_spine(spines, leaves, hpl, rate, rate)
    state = RunState()
    fabric = Fabric(spec, state.run_id)
    t0 = time.monotonic()
    fabric.build(state)
    t1 = time.monotonic()
    ports = len(fabric.ports())
    fabric.teardown()
    t2 = time.monotonic()
    state.drop()
    return t1 - t0, t2 - t1, ports


def testbed_mininet_build(spines: int, leaves: int, hpl: int, rate: float) -> tuple[float, float, int]:
    """The Mininet network built on the testbed (testbed.network.net.TestbedNet): net.start() then net.stop()."""
    from testbed.network.net import TestbedNet
    from topologies.mininet_topo import LeafSpineTopo

    topo = LeafSpineTopo(spines=spines, leaves=leaves, hosts_per_leaf=hpl, host_rate_mbps=rate,
                         fabric_rate_mbps=rate)
    t0 = time.monotonic()
    net = TestbedNet(topo)
    net.start()
    t1 = time.monotonic()
    ports = len(net.fabric.ports())
    net.stop()
    t2 = time.monotonic()
    return t1 - t0, t2 - t1, ports


def mininet_build(spines: int, leaves: int, hpl: int, rate: float) -> tuple[float, float, int]:
    """Stock Mininet; the host sysctls its init changes are restored afterwards (and recorded for testbed clean)."""
    from testbed.kernel.hostguard import preserved_sysctls
    from testbed.kernel.state import RunState

    state = RunState()
    try:
        with preserved_sysctls(state=state):
            return _mininet_build(spines, leaves, hpl, rate)
    finally:
        state.drop()


def _mininet_build(spines: int, leaves: int, hpl: int, rate: float) -> tuple[float, float, int]:
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import Host
    from mininet.topo import Topo

    setLogLevel("critical")  # TCLink's htb prints a quantum warning per class

    class LeafSpine(Topo):
        def build(self):
            sp = [self.addHost(f"sp{i + 1}", ip=None) for i in range(spines)]
            for j in range(leaves):
                leaf = self.addHost(f"lf{j + 1}", ip=None)
                for s in sp:
                    self.addLink(leaf, s, bw=rate)
                for k in range(hpl):
                    h = self.addHost(f"h{j + 1}x{k + 1}", ip=f"198.18.{j + 1}.{k + 1}/24")
                    self.addLink(h, leaf, bw=rate)

    t0 = time.monotonic()
    net = Mininet(topo=LeafSpine(), link=TCLink, host=Host, controller=None, switch=None, build=False,
                  autoSetMacs=True)
    net.build()
    net.start()
    t1 = time.monotonic()
    ports = 2 * len(net.links)  # TCLink shapes both ends of every link
    net.stop()
    t2 = time.monotonic()
    return t1 - t0, t2 - t1, ports


BUILDERS = {"testbed": testbed_build, "testbed-mininet": testbed_mininet_build, "mininet": mininet_build}
LABELS = {"testbed": "testbed builder", "testbed-mininet": "testbed mininet", "mininet": "stock mininet"}


def measure_once(builder: str, shape: tuple) -> dict:
    """One build + tear-down of `builder` in a fresh Python process (its --one mode)."""
    spines, leaves, hpl, rate = shape
    r = subprocess.run([sys.executable, __file__, "--one", builder, "--spines", str(spines), "--leaves", str(leaves),
                        "--hosts-per-leaf", str(hpl), "--rate-mbps", str(rate)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{builder} build failed (exit {r.returncode}):\n{(r.stderr or r.stdout)[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spines", type=int, default=2)
    ap.add_argument("--leaves", type=int, default=4)
    ap.add_argument("--hosts-per-leaf", type=int, default=4)
    ap.add_argument("--rate-mbps", type=float, default=100)
    ap.add_argument("--repeats", type=int, default=3,
                    help="builds per builder; medians with their intervals are printed (default 3)")
    ap.add_argument("--only", action="append", choices=sorted(BUILDERS), help="measure only this builder "
                    "(repeatable; default: all three)")
    ap.add_argument("--one", choices=sorted(BUILDERS), help=argparse.SUPPRESS)  # internal: one build, JSON out
    a = ap.parse_args()
    shape = (a.spines, a.leaves, a.hosts_per_leaf, a.rate_mbps)
    if a.one:
        up, down, ports = BUILDERS[a.one](*shape)
        print(json.dumps({"up": up, "down": down, "ports": ports}))
        return 0
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    names = [n for n in BUILDERS if not a.only or n in a.only]
    if "testbed-mininet" in names:
        try:
            import testbed.network.net  # noqa: F401
        except ImportError as e:  # the Mininet front door is not in this checkout
            print(f"(testbed Mininet build skipped: {e})")
            names.remove("testbed-mininet")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(a.repeats):
        for n in names[i % len(names):] + names[:i % len(names)]:  # rotate: no builder always goes first
            runs[n].append(measure_once(n, shape))
    from analysis.stats import compare, estimate

    print(f"topology: {a.spines} spines x {a.leaves} leaves x {a.hosts_per_leaf} hosts, {a.rate_mbps:g} Mbit/s links; "
          f"{a.repeats} run{'s' if a.repeats > 1 else ''} each: median [interval] (n, the interval's coverage)")
    totals = {n: [r["up"] + r["down"] for r in runs[n]] for n in names}
    for n in names:
        print(f"{LABELS[n]:16} set-up {estimate([r['up'] for r in runs[n]]).text('{:.3g}')} s; "
              f"tear-down {estimate([r['down'] for r in runs[n]]).text('{:.3g}')} s; "
              f"total {estimate(totals[n]).text('{:.3g}')} s; {runs[n][0]['ports']} shaped ports")
    if "mininet" in runs:
        for n in names:
            if n != "mininet":
                parts = []
                for what, key in (("set-up", "up"), ("tear-down", "down"), ("total", None)):
                    side = totals if key is None else {m: [r[key] for r in runs[m]] for m in (n, "mininet")}
                    d = compare(side[n], side["mininet"])
                    parts.append(f"{what} {d.ratio:.3g}x [{d.ratio_low:.3g}, {d.ratio_high:.3g}]")
                print(f"ratio {LABELS[n]} / stock mininet (ratio of medians [bootstrap 95% interval]): "
                      f"{', '.join(parts)}; total {d.verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
