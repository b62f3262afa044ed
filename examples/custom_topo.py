#!/usr/bin/env python3
"""A user-written Mininet Topo (a two-level tree of switches, not a leaf-spine) with a testbed queue on one link.

    sudo .venv/bin/python examples/custom_topo.py [--out DIR] [--buffer 20000]

        h1 h2          h3 h4
          \\ /            \\ /
          s2 --- s1 ===> s3        s1's port towards s3: 10 Mbit/s, a small drop-tail buffer

One TCP flow h1 -> h3 crosses s1 -> s3, the only 10 Mbit/s hop; the kernel's counters of that port show the packets
it sent, the ones it dropped and the peak backlog.
"""

import argparse
import json

from mininet.topo import Topo

from testbed.lab import Lab
from topologies import QueueSpec


class Tree(Topo):
    def build(self, buffer_bytes: int = 20000):
        s1, s2, s3 = (self.addSwitch(f"s{i}") for i in (1, 2, 3))
        for i, sw in ((1, s2), (2, s2), (3, s3), (4, s3)):
            self.addLink(self.addHost(f"h{i}"), sw, bw=20)
        self.addLink(s2, s1, bw=20)
        self.addLink(s1, s3, bw=10, queue1=QueueSpec(buffer_bytes=buffer_bytes))  # on s1's end only


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="run directory (default results/custom_topo-<time>)")
    ap.add_argument("--buffer", type=int, default=20000, help="the queued port's buffer (bytes)")
    ap.add_argument("--seconds", type=float, default=3.0, help="how long the flow runs")
    args = ap.parse_args()

    with Lab(Tree(buffer_bytes=args.buffer), out=args.out, name="custom_topo") as lab:
        loss = lab.net.pingAll()
        s1, s3 = lab.net["s1"], lab.net["s3"]
        port = lab.net.linksBetween(s1, s3)[0].intf1.name  # s1's end of the s1-s3 link
        sampler = lab.sample_queues(every_ms=2, ports=[("s1", port)])
        before = lab.port_counters()[("s1", port)]
        flows = lab.flows([("h1", "h3")], duration_s=args.seconds)
        stats = flows.wait()[0]
        after = lab.port_counters()[("s1", port)]
        qdisc = s1.cmd(f"tc -s qdisc show dev {port}")
    print(qdisc)
    result = {"ping_loss_percent": loss, "port": f"s1:{port}", "goodput_mbps": stats["goodput_mbps"],
              "sent_packets": after["sent_packets"] - before["sent_packets"],
              "drops": after["drops"] - before["drops"], "backlog_peak_bytes": sampler.peak_backlog("s1", port),
              "buffer_bytes": args.buffer}
    print(f"pingAll {loss:.0f}% loss; h1 -> h3 {stats['goodput_mbps']:.1f} Mbit/s through s1:{port} (10 Mbit/s): "
          f"{result['sent_packets']} packets sent, {result['drops']} dropped, backlog peak "
          f"{result['backlog_peak_bytes']} of {args.buffer} bytes")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
