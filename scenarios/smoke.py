#!/usr/bin/env python3
"""Smoke: one kernel TCP flow through one shaped switch port with a RED/ECN queue.

    h1 ---- s1 ==[HTB rate, RED+ECN]==> h2

    sudo testbed run smoke [--set rate_mbps=50 --set ecn=false]      (or: sudo .venv/bin/python scenarios/smoke.py)

The smallest real experiment: it proves the kernel can shape, queue, ECN-mark and carry TCP, and reads the
port's own counters (bytes the shaper sent, RED marks and drops) next to the receiver's goodput.
"""

import sys

from mininet.topo import Topo

from testbed.errors import UsageError
from testbed.kernel import qdisc
from testbed.params import Param
from testbed.scenario import Scenario
from topologies import HostTcpSpec, QueueSpec

PARAMS = [
    Param("rate_mbps", float, 20.0, "Mbit/s", "bottleneck rate (s1 -> h2)", min=1, max=10_000),
    Param("duration_s", float, 3.0, "s", "how long the flow sends", min=0.5, max=120),
    Param("buffer_bytes", int, 200_000, "bytes", "bottleneck buffer (RED limit)", min=10_000, max=100_000_000),
    Param("red_min_bytes", int, 15_000, "bytes", "RED minimum threshold", min=1500),
    Param("red_max_bytes", int, 45_000, "bytes", "RED maximum threshold", min=3000),
    Param("red_probability", float, 0.1, "", "RED maximum marking probability", min=0.0001, max=1.0),
    Param("ecn", bool, True, "", "ECN: RED marks instead of dropping, hosts negotiate ECN"),
    Param("cc", str, "cubic", "", "sender congestion control", choices=("cubic", "reno", "dctcp", "bbr")),
]


def validate(p: dict) -> None:
    if p["red_min_bytes"] >= p["red_max_bytes"]:
        raise UsageError(f"red_min_bytes ({p['red_min_bytes']}) must be < red_max_bytes ({p['red_max_bytes']})")
    if p["red_max_bytes"] > p["buffer_bytes"]:
        raise UsageError(f"red_max_bytes ({p['red_max_bytes']}) must be <= buffer_bytes ({p['buffer_bytes']})")


class Bottleneck(Topo):
    """h1 - s1 - h2: the h1 link runs at ten times the rate (never the bottleneck); s1's port to h2 is shaped at
    ``rate_mbps`` with the RED queue."""

    def build(self, p: dict) -> None:
        self.tcp = HostTcpSpec(p["cc"], ecn=p["ecn"])
        h1, s1, h2 = self.addHost("h1"), self.addSwitch("s1"), self.addHost("h2")
        red = QueueSpec(discipline="red", buffer_bytes=p["buffer_bytes"], min_bytes=p["red_min_bytes"],
                        max_bytes=p["red_max_bytes"], probability=p["red_probability"], ecn=p["ecn"])
        self.addLink(h1, s1, bw=10 * p["rate_mbps"])
        self.addLink(s1, h2, bw=p["rate_mbps"], queue1=red)


def experiment(p: dict, lab) -> dict:
    s1 = lab.net["s1"]
    port = s1.connectionsTo(lab.net["h2"])[0][0].name  # s1's egress towards h2: the bottleneck
    tcp = lab.tcp_counters()
    lab.progress(f"TCP {p['cc']} h1 -> h2 for {p['duration_s']} s at {p['rate_mbps']} Mbit/s, RED ecn={p['ecn']}")
    flow = lab.flows([("h1", "h2")], duration_s=p["duration_s"], cc=p["cc"]).wait()[0]
    elapsed = flow["seconds"]  # first byte sent to last byte received
    delta = tcp.stop(lab.rundir)
    stats = qdisc.port_stats(lab.net.ns("s1"), port)[0]
    root = qdisc.root_stats(lab.net.ns("s1"), port)
    from analysis import summary as asum

    tm = asum.tcp_metrics(asum.load_quietly(lab.rundir.path).tcp)  # one definition: every host of tcp.csv
    return {
        "rate_mbps": p["rate_mbps"],
        "duration_s": round(elapsed, 3),
        "goodput_mbps": flow["goodput_mbps"],
        "shaper_sent_bytes": root.get("sent_bytes", 0),
        "shaper_rate_ratio": root.get("sent_bytes", 0) * 8 / elapsed / 1e6 / p["rate_mbps"],
        "bottleneck_packets": stats.sent_packets,
        "bottleneck_drops": stats.drops,
        "ecn_marks": stats.marks,
        "tcp_retrans_segs": tm.get("tcp_retrans_segs", 0),
        "receiver_ce_packets": delta["h2"]["IpExtInCEPkts"],
        "received_bytes": flow["bytes"],
    }


SCENARIO = Scenario(
    name="smoke",
    summary="one TCP flow through one shaped RED/ECN switch port (proves the kernel can do the real thing)",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo", "qdisc:red+ecn", "sysctl:ecn"),
    topology=lambda p, seed: Bottleneck(p),
    run=experiment,
    validate=validate,
    table=(("rate_mbps", "bottleneck rate (Mbit/s)"), ("goodput_mbps", "receiver goodput (Mbit/s)"),
           ("shaper_rate_ratio", "shaper sent / configured rate"), ("bottleneck_packets", "packets sent by port"),
           ("ecn_marks", "RED ECN marks"), ("bottleneck_drops", "drops"),
           ("receiver_ce_packets", "CE packets at receiver"), ("tcp_retrans_segs", "TCP retransmitted segments")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
