"""Smoke: one kernel TCP flow through one shaped switch port with a RED/ECN queue.

    h1 ---- s1 ==[HTB rate, RED+ECN]==> h2

The smallest real experiment: it proves the kernel can shape, queue, ECN-mark and carry TCP, and reads the
port's own counters (bytes the shaper sent, RED marks and drops) next to the receiver's goodput.
"""

from __future__ import annotations

import socket
import threading
import time

from testbed.kernel import counters, links, netns, qdisc
from testbed.params import Param
from testbed.scenario import RunContext, Scenario

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


def _validate(p: dict) -> None:
    from testbed.errors import UsageError

    if p["red_min_bytes"] >= p["red_max_bytes"]:
        raise UsageError(f"red_min_bytes ({p['red_min_bytes']}) must be < red_max_bytes ({p['red_max_bytes']})")
    if p["red_max_bytes"] > p["buffer_bytes"]:
        raise UsageError(f"red_max_bytes ({p['red_max_bytes']}) must be <= buffer_bytes ({p['buffer_bytes']})")


def _run(p: dict, ctx: RunContext) -> dict:
    rid = ctx.run_id
    h1, s1, h2 = (f"tb-{rid}-{n}" for n in ("h1", "s1", "h2"))
    for ns in (h1, s1, h2):
        netns.create(ns)
        ctx.state.add("namespaces", ns)
        ctx.on_teardown(lambda ns=ns: netns.remove(ns))
    ctx.progress("building h1 - s1 - h2")
    links.add_veth(h1, "eth0", s1, f"tb{rid}p1")
    links.add_veth(s1, f"tb{rid}p2", h2, "eth0")
    for ns, ifn in ((h1, "eth0"), (s1, f"tb{rid}p1"), (s1, f"tb{rid}p2"), (h2, "eth0")):
        links.offloads_off(ns, ifn)
    links.add_address(h1, "eth0", "198.18.1.1", 24)
    links.add_address(s1, f"tb{rid}p1", "198.18.1.254", 24)
    links.add_address(s1, f"tb{rid}p2", "198.18.2.254", 24)
    links.add_address(h2, "eth0", "198.18.2.1", 24)
    for ns, gw in ((h1, "198.18.1.254"), (h2, "198.18.2.254")):
        with netns.ipr(ns) as ipr:
            ipr.route("add", dst="0.0.0.0/0", gateway=gw)
    netns.sysctl_write(s1, "net.ipv4.ip_forward", "1")
    for ns in (h1, h2):
        netns.sysctl_write(ns, "net.ipv4.tcp_ecn", "1" if p["ecn"] else "0")
    port = f"tb{rid}p2"
    q = qdisc.LeafQueue("red", limit=p["buffer_bytes"], min_bytes=p["red_min_bytes"],
                        max_bytes=p["red_max_bytes"], probability=p["red_probability"], ecn=p["ecn"])
    qdisc.install_port_ns(s1, port, p["rate_mbps"], [qdisc.PortClass(0x10, q)], default_minor=0x10)

    before = {ns: counters.tcp_counters(ns) for ns in (h1, h2)}
    with netns.entered(h2):
        lsock = socket.socket()
        lsock.bind(("198.18.2.1", 5001))
        lsock.listen(1)
    with netns.entered(h1):
        csock = socket.socket()
        csock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, p["cc"].encode())
    received = [0]
    t_end = [0.0]

    def receive() -> None:
        conn, _ = lsock.accept()
        with conn:
            while True:
                b = conn.recv(1 << 16)
                if not b:
                    break
                received[0] += len(b)
        t_end[0] = time.monotonic()

    rx = threading.Thread(target=receive, daemon=True)
    rx.start()
    ctx.progress(f"TCP {p['cc']} h1 -> h2 for {p['duration_s']} s at {p['rate_mbps']} Mbit/s, RED ecn={p['ecn']}")
    csock.connect(("198.18.2.1", 5001))
    t0 = time.monotonic()
    buf = b"\0" * (1 << 16)
    while time.monotonic() - t0 < p["duration_s"]:
        csock.send(buf)
    csock.shutdown(socket.SHUT_WR)
    rx.join(timeout=60)
    csock.close()
    lsock.close()
    elapsed = t_end[0] - t0
    after = {ns: counters.tcp_counters(ns) for ns in (h1, h2)}
    stats = qdisc.port_stats(s1, port)[0]
    root = qdisc.root_stats(s1, port)
    ctx.rundir.write_csv("tcp.csv", ["host", "phase", "counter", "value"],
                         [(ns.rsplit("-", 1)[1], ph, k, d[ns].get(k, 0))
                          for ph, d in (("before", before), ("after", after)) for ns in (h1, h2)
                          for k in counters.KEY_COUNTERS])
    d = lambda ns, k: after[ns].get(k, 0) - before[ns].get(k, 0)  # noqa: E731
    from analysis import summary as asum

    tm = asum.tcp_metrics(asum.load_quietly(ctx.rundir.path).tcp)  # one definition: every host of tcp.csv
    return {
        "rate_mbps": p["rate_mbps"],
        "duration_s": round(elapsed, 3),
        "goodput_mbps": received[0] * 8 / elapsed / 1e6,
        "shaper_sent_bytes": root.get("sent_bytes", 0),
        "shaper_rate_ratio": root.get("sent_bytes", 0) * 8 / elapsed / 1e6 / p["rate_mbps"],
        "bottleneck_packets": stats.sent_packets,
        "bottleneck_drops": stats.drops,
        "ecn_marks": stats.marks,
        "tcp_retrans_segs": tm.get("tcp_retrans_segs", 0),
        "receiver_ce_packets": d(h2, "IpExtInCEPkts"),
        "received_bytes": received[0],
    }


SCENARIO = Scenario(
    name="smoke",
    summary="one TCP flow through one shaped RED/ECN switch port (proves the kernel can do the real thing)",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:red+ecn", "sysctl:ecn"),
    run=_run,
    validate=_validate,
    table=(("rate_mbps", "bottleneck rate (Mbit/s)"), ("goodput_mbps", "receiver goodput (Mbit/s)"),
           ("shaper_rate_ratio", "shaper sent / configured rate"), ("bottleneck_packets", "packets sent by port"),
           ("ecn_marks", "RED ECN marks"), ("bottleneck_drops", "drops"),
           ("receiver_ce_packets", "CE packets at receiver"), ("tcp_retrans_segs", "TCP retransmitted segments")),
)
