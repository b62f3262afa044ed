#!/usr/bin/env python3
"""Benchmark: fabric set-up + tear-down time, testbed's netlink builder vs Mininet's stock TCLink, same topology,
same run, same kernel.

    sudo .venv/bin/python benchmarks/fabric_setup_vs_mininet.py [--spines 2 --leaves 4 --hosts-per-leaf 4]
    sudo testbed vm -- .venv/bin/python benchmarks/fabric_setup_vs_mininet.py     # in the lab VM

Topology: an L3 leaf-spine. For Mininet every leaf and spine is a Mininet Host acting as a router (no OVS and no
controller, so both sides build the same thing: namespaces, veth pairs, HTB-shaped ports, addresses, routes).
Mininet's TCLink shapes each link with `tc` processes (htb + its default queue); testbed configures the same
through netlink in-process. Prints each side's seconds and the ratio Mininet / testbed.

Stock Mininet raises host sysctls in ``Mininet.init()`` (``fixLimits``: socket buffer maxima, TCP buffer ranges,
neighbour thresholds, pty max) and never restores them; the benchmark records them first (so ``testbed clean``
restores them after a kill) and puts them back afterwards (testbed.hostguard).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def testbed_build(spines: int, leaves: int, hpl: int, rate: float) -> tuple[float, float, int]:
    from testbed.fabric import Fabric
    from testbed.state import RunState
    from topologies import LeafSpineSpec, LinkSpec

    spec = LeafSpineSpec(spines=spines, leaves=leaves, hosts_per_leaf=hpl, host_link=LinkSpec(rate_mbps=rate),
                         fabric_link=LinkSpec(rate_mbps=rate))
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


def mininet_build(spines: int, leaves: int, hpl: int, rate: float) -> tuple[float, float, int]:
    """Stock Mininet; the host sysctls its init changes are restored afterwards (and recorded for testbed clean)."""
    from testbed.hostguard import preserved_sysctls
    from testbed.state import RunState

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spines", type=int, default=2)
    ap.add_argument("--leaves", type=int, default=4)
    ap.add_argument("--hosts-per-leaf", type=int, default=4)
    ap.add_argument("--rate-mbps", type=float, default=100)
    a = ap.parse_args()
    shape = (a.spines, a.leaves, a.hosts_per_leaf, a.rate_mbps)
    tb_up, tb_down, tb_ports = testbed_build(*shape)
    mn_up, mn_down, mn_ports = mininet_build(*shape)
    print(f"topology: {a.spines} spines x {a.leaves} leaves x {a.hosts_per_leaf} hosts, {a.rate_mbps:g} Mbit/s links")
    print(f"{'':10} {'set-up s':>9} {'tear-down s':>12} {'total s':>8} {'shaped ports':>13}")
    print(f"{'testbed':10} {tb_up:9.2f} {tb_down:12.2f} {tb_up + tb_down:8.2f} {tb_ports:13d}")
    print(f"{'mininet':10} {mn_up:9.2f} {mn_down:12.2f} {mn_up + mn_down:8.2f} {mn_ports:13d}")
    print(f"ratio mininet/testbed: set-up {mn_up / tb_up:.2f}x, tear-down {mn_down / tb_down:.2f}x, "
          f"total {(mn_up + mn_down) / (tb_up + tb_down):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
