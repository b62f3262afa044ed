"""The Mininet-style script in the lab VM (stock Debian kernel): a 2x2x2 leaf-spine of testbed nodes and links with
RED/ECN on the leaves' host ports (a qdisc the CI host kernel does not have), pingAll clean, the port's HTB and
queue visible from the leaf's own shell, and nothing left after net.stop()."""

import os
import re

from testbed.network.net import TestbedNet
from topologies import QueueSpec
from topologies.mininet_topo import LeafSpineTopo


def test_mininet_style_script_in_the_lab_vm():
    red = QueueSpec(discipline="red", buffer_bytes=200_000, min_bytes=30_000, max_bytes=90_000, probability=0.1,
                    ecn=True)
    net = TestbedNet(LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=10, fabric_rate_mbps=20,
                                   leaf_down_queue=red))
    run_id = net.run_id
    try:
        net.start()
        assert net.pingAll() == 0.0
        port = net["leaf1"].cmd("tc -s qdisc show dev h1")
        assert re.search(r"qdisc htb 1: root", port) and re.search(r"qdisc red \w+: parent 1:10 .*ecn", port), port
        assert "rate 10Mbit" in net["h1"].cmd("tc class show dev eth0")
        assert "1 received" in net["h1"].cmd("ping -c1 -W5", net["h4"].IP())
    finally:
        net.stop()
    assert not [n for n in os.listdir("/run/netns") if n.startswith(f"tb-{run_id}-")]
