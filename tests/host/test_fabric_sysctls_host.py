"""The sysctls a fabric sets in its namespaces (testbed.kernel.sysctls), read back from the kernel on a real
fabric built on this host (HTB + bfifo only; run under the shared lock): every namespace has IPv6 off, rp_filter 0
and the RPS mask of all CPUs; routers forward and hash multipath by 5-tuple (with the spec's seed where the kernel
has the sysctl); hosts carry the spec's TCP settings (ECN, the namespace default congestion control unless the
kernel refused it, as the fabric records); TCP connects across the spines; nothing is left behind. Kernel facts
only, no timing. Took ~2 s on this 2-CPU machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed.kernel import netns
from testbed.kernel.sysctls import rps_mask
from testbed.network.fabric import tcp_connect_ok
from tests.fabricdrive import built
from topologies import HostTcpSpec, uniform_leaf_spine

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
SEED = 7


def ours() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {ln.split()[0] for ln in out.splitlines() if ln.startswith("tb-")}


def test_every_namespace_gets_its_role_sysctls_from_the_kernel():
    before = ours()
    topo = uniform_leaf_spine(2, 2, 1, 20, 20, seed=SEED, tcp=HostTcpSpec(congestion_control="reno", ecn=True))
    with built(topo) as fab:
        for node in topo.nodes:
            ns = fab.ns(node.name)
            assert netns.sysctl_read(ns, "net.ipv6.conf.all.disable_ipv6") == "1", node.name
            assert netns.sysctl_read(ns, "net.ipv4.conf.all.rp_filter") == "0", node.name
            assert netns.sysctl_read(ns, "net.ipv4.conf.default.rp_filter") == "0", node.name
            if Path("/proc/sys/net/core/rps_default_mask").exists():
                assert netns.sysctl_read(ns, "net.core.rps_default_mask") == rps_mask(), node.name
            if node.is_host:
                assert netns.sysctl_read(ns, "net.ipv4.tcp_ecn") == "1", node.name
                cc = netns.sysctl_read(ns, "net.ipv4.tcp_congestion_control")
                assert cc == "reno" or node.name in fab.cc_default_failed, (node.name, cc)
            else:
                assert netns.sysctl_read(ns, "net.ipv4.ip_forward") == "1", node.name
                assert netns.sysctl_read(ns, "net.ipv4.fib_multipath_hash_policy") == "1", node.name
                if Path("/proc/sys/net/ipv4/fib_multipath_hash_seed").exists():
                    assert netns.sysctl_read(ns, "net.ipv4.fib_multipath_hash_seed").split()[0] == str(SEED)
        assert tcp_connect_ok(fab, "h1", "h2")
    assert ours() == before
