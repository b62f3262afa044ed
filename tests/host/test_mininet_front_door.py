"""Mininet is the front door, on the host kernel (HTB + bfifo are all these fabrics need): a Mininet-style script on
testbed nodes and links, a user-written Topo with testbed queues, the Lab API's run directory and teardown, and
`testbed cli` driven through a pseudo-terminal. Everything asserted is what the kernel or Mininet reported."""

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mininet.topo import Topo
from mininet.util import dumpNodeConnections

from testbed.kernel.hostguard import MININET_FIXLIMITS_SYSCTLS, snapshot
from testbed.network.net import TestbedNet
from topologies import QueueSpec
from topologies.mininet_topo import LeafSpineTopo

ROOT = Path(__file__).resolve().parent.parent.parent


def namespaces(run_id: str) -> list[str]:
    return [n for n in os.listdir("/run/netns") if n.startswith(f"tb-{run_id}-")] if os.path.isdir("/run/netns") else []


def test_mininet_style_script():
    sysctls = snapshot(MININET_FIXLIMITS_SYSCTLS)
    net = TestbedNet(LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=40))
    run_id = net.run_id
    try:
        net.start()
        assert sorted(namespaces(run_id)) == sorted(f"tb-{run_id}-{n}" for n in
                                                    ("h1", "h2", "h3", "h4", "leaf1", "leaf2", "spine1", "spine2"))
        h1, h4, leaf1 = net["h1"], net["h4"], net["leaf1"]
        # every link end knows its peer's MAC before any traffic (no ARP in the shaped queues under study)
        neigh = leaf1.cmd("ip neigh show dev spine1")
        assert re.search(r"198\.19\.\d+\.\d+ lladdr (\S+) PERMANENT", neigh), neigh
        assert "PERMANENT" in h1.cmd("ip neigh show dev eth0")
        assert net.pingAll() == 0.0
        assert "htb" in h1.cmd("tc qdisc show dev eth0")  # the host NIC is shaped too
        port = leaf1.cmd("tc -s qdisc show dev h1")
        assert re.search(r"qdisc htb 1: root", port) and re.search(r"qdisc bfifo \w+: parent 1:10 limit", port), port
        assert re.search(r"Sent \d+ bytes [1-9]\d* pkt", port), port  # pingAll's replies went through it
        assert "rate 20Mbit" in leaf1.cmd("tc class show dev h1")
        assert h4.IP() in h1.cmd("ping -c1 -W2", h4.IP())
        out = h4.popen(["ip", "-br", "addr"], text=True).communicate()[0]
        assert h4.IP() in out  # popen runs in h4's namespace
        dumpNodeConnections(net.hosts)  # Mininet's own walk over intfs and links works on testbed nodes
        ends = {(l.intf1.node.name, l.intf1.name, l.intf2.node.name, l.intf2.name) for l in net.links}
        assert ("h1", "eth0", "leaf1", "h1") in ends and ("leaf1", "spine1", "spine1", "leaf1") in ends
        server, client = net.iperf((h1, h4), seconds=2)
        rate = float(server.split()[0]) * (1000 if "Gbits" in server else 1)
        assert 0.7 * 20 <= rate <= 1.02 * 20, (server, client)  # shaped at the 20 Mbit/s host links
    finally:
        net.stop()
    assert namespaces(run_id) == []
    assert snapshot(MININET_FIXLIMITS_SYSCTLS) == sysctls  # Mininet's fixLimits did not run


class Triangle(Topo):
    """Three routers in a ring, a host on each; a 30 kB drop-tail queue on s1's port towards s2."""

    def build(self):
        hosts = [self.addHost(f"h{i}") for i in (1, 2, 3)]
        sws = [self.addSwitch(f"s{i}") for i in (1, 2, 3)]
        for h, s in zip(hosts, sws):
            self.addLink(h, s, bw=10)
        self.addLink(sws[0], sws[1], bw=5, queue1=QueueSpec(buffer_bytes=30000))
        self.addLink(sws[1], sws[2], bw=5)
        self.addLink(sws[0], sws[2], bw=5)


def test_user_written_topo_gets_testbed_queues():
    with TestbedNet(Triangle()) as net:
        net.start()
        assert net.pingAll() == 0.0
        s1 = net["s1"]
        port = s1.cmd("tc qdisc show dev s1-eth2")
        assert "bfifo" in port and "limit 30000b" in port, port
        assert "rate 5Mbit" in s1.cmd("tc class show dev s1-eth2")
        assert "limit 30000b" not in net["s2"].cmd("tc qdisc show dev s2-eth2")  # only the end that asked
        run_id = net.run_id
    assert namespaces(run_id) == []


def test_lab_writes_its_run_directory_and_tears_down(tmp_path):
    import json

    from testbed.lab import Lab

    with Lab(LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=1), out=tmp_path / "ok", seed=3, quiet=True) as lab:
        run_id = lab.net.run_id
        lab.sample_queues(every_ms=5)
        assert "1 received" in lab.net["h1"].cmd("ping -c1 -W2", lab.net["h2"].IP())
        time.sleep(0.3)
        before = lab.port_counters()
    man = json.loads((tmp_path / "ok" / "manifest.json").read_text())
    assert man["complete"] is True and man["seed"] == 3 and man["topology"]["kind"] == "leafspine"
    assert len((tmp_path / "ok" / "queues.csv").read_text().splitlines()) > 10
    assert before[("leaf2", "h2")]["sent_packets"] >= 1
    assert namespaces(run_id) == []

    with pytest.raises(RuntimeError):
        with Lab(LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=1), out=tmp_path / "bad", quiet=True) as lab:
            run_id = lab.net.run_id
            raise RuntimeError("the experiment failed")
    assert json.loads((tmp_path / "bad" / "manifest.json").read_text())["complete"] is False
    assert namespaces(run_id) == []


def _read_until(fd: int, pattern: str, timeout_s: float, seen: list[str]) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if re.search(pattern, "".join(seen)):
            return "".join(seen)
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                seen.append(os.read(fd, 65536).decode(errors="replace"))
            except OSError:
                break
    raise AssertionError(f"no {pattern!r} in: {''.join(seen)[-3000:]}")


def test_testbed_cli_through_a_pty(tmp_path):
    pid, fd = pty.fork()
    if pid == 0:  # the child: testbed cli on a terminal
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-m", "testbed.cli", "cli", "--vm", "never",
                                  "--out", str(tmp_path / "cli")])
    seen: list[str] = []
    try:
        _read_until(fd, r"testbed> ", 120, seen)
        ns_before = [n for n in os.listdir("/run/netns") if n.startswith("tb-")]
        assert len(ns_before) >= 8
        for cmd, want in (("pingall", r"Results: 0% dropped \(12/12 received\)"),
                          ("h1 ping -c1 -W2 h4", r"1 packets transmitted, 1 received"),
                          ("leaf1 tc -s qdisc show dev h1", r"qdisc bfifo \w+: parent 1:10[\s\S]*Sent \d+ bytes")):
            seen.clear()
            os.write(fd, (cmd + "\n").encode())
            _read_until(fd, want + r"[\s\S]*testbed> ", 60, seen)
        os.write(fd, b"exit\n")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert not set(ns_before) & set(os.listdir("/run/netns"))  # exit tore the fabric down
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)


def test_testbed_cli_bad_input_is_one_line():
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "cli", "--set", "leaves=0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "leaves" in r.stderr, r.stderr
