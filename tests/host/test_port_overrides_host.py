"""A per-port override reaches the kernel: a 1-spine leaf-spine loaded from a TOML file whose spine1 -> leaf2 port
is shaped to 5 Mbit/s (the links are 20) with a 30 kB drop-tail buffer. The host kernel's tc dump shows that rate
and buffer on that port only, and a TCP flow h1 -> h2 (its only path crosses spine1 -> leaf2) is held to 5 Mbit/s
by that port's shaper and loses packets in its shallow buffer. HTB and bfifo only: runs on the host kernel."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from testbed.kernel import doctor
from testbed.kernel import netns, qdisc
from tests.fabricdrive import built, bulk
from topologies import load_topology

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")

TOPOLOGY = """
spines = 1
leaves = 2
hosts_per_leaf = 1

[host_link]
rate_mbps = 20

[fabric_link]
rate_mbps = 20

[[ports]]
port = "spine1:leaf2"
rate_mbps = 5
queue = { discipline = "droptail", buffer_bytes = 30000 }
"""


def tc(fab, node: str, what: str, dev: str) -> str:
    r = netns.run(fab.ns(node), ["tc", what, "show", "dev", dev], timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout


def wire_rate(fab, node: str, dev: str) -> str:
    m = re.search(r"class htb 1:1 root rate (\S+)", tc(fab, node, "class", dev))
    assert m, tc(fab, node, "class", dev)
    return m.group(1)


def test_an_overridden_spine_port_has_its_own_rate_and_buffer_in_the_kernel(tmp_path):
    missing = doctor.missing(["qdisc:htb", "qdisc:bfifo"])
    assert not missing, f"this kernel lacks {', '.join(missing)}"
    f = tmp_path / "slow-port.toml"
    f.write_text(TOPOLOGY)
    with built(load_topology(f)) as fab:
        assert wire_rate(fab, "spine1", "leaf2") == "5Mbit"
        assert re.search(r"qdisc bfifo 10: parent 1:10 limit 30000b", tc(fab, "spine1", "qdisc", "leaf2"))
        for node, dev in (("spine1", "leaf1"), ("leaf2", "spine1"), ("leaf1", "spine1"), ("leaf2", "h2")):
            assert wire_rate(fab, node, dev) == "20Mbit", (node, dev)
            assert "limit 256Kb" in tc(fab, node, "qdisc", dev), (node, dev)  # the 262144-byte default

        measured = {}

        def measure():
            time.sleep(0.8)  # past slow start
            t0, a = time.monotonic(), qdisc.root_stats(fab.ns("spine1"), "leaf2")["sent_bytes"]
            time.sleep(1.5)
            t1, b = time.monotonic(), qdisc.root_stats(fab.ns("spine1"), "leaf2")["sent_bytes"]
            measured["mbps"] = (b - a) * 8 / (t1 - t0) / 1e6

        m = threading.Thread(target=measure)
        m.start()
        got = bulk(fab, [("h1", "h2")], 2.8)
        m.join()
        drops = sum(s.drops for s in qdisc.port_stats(fab.ns("spine1"), "leaf2"))
    print(f"spine1 -> leaf2 sent {measured['mbps']:.2f} Mbit/s (shaped to 5), {drops} drops, received {got[0]} B")
    assert got[0] > 0
    assert 4.0 <= measured["mbps"] <= 5.25, measured  # the port's 5, not the link's 20
    assert drops > 0  # one bulk flow overflows the 30 kB buffer (20 packets)
