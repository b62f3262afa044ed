#!/usr/bin/env python3
"""How close do the collective agents get to iperf3? (a benchmark, not a test; needs root)

    sudo .venv/bin/python benchmarks/agent_vs_iperf3.py [--rate-mbps 50] [--seconds 3] [--iterations 3]

Two paths, built in this run and torn down afterwards:

* shaped:   h1 -> leaf1 -> h2 of a 1-leaf testbed.network.fabric (HTB at --rate-mbps on every egress, droptail queues,
            offloads off);
* unshaped: a bare veth pair between two namespaces (no qdisc beyond the default, offloads as the kernel sets).

On each path, iperf3 (one TCP stream, same congestion control) and then two agents (traffic.agent, rank 0 ->
rank 1 point-to-point: the `pipeline` schedule with 2 ranks, data verified) move data; the agent's goodput is
payload bytes of the measured iterations / (last op end - first op start). iperf3 and agents alternate --repeats
times per path (the machine may be shared); prints each side's median with its 95% interval and n (analysis.stats:
with 3 repeats the interval is the range, 75% coverage), and agent / iperf3 as the ratio of medians with its
bootstrap interval.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.stats import compare, estimate  # noqa: E402
from testbed.errors import require_root  # noqa: E402
from testbed.kernel import links, netns  # noqa: E402


_PORT = [5290]


def iperf3(ns_srv: str, ns_cli: str, ip: str, seconds: float, cc: str) -> float:
    """Goodput (Mbit/s) iperf3 measured at the receiver."""
    _PORT[0] += 1
    port = str(_PORT[0])
    srv = netns.popen(ns_srv, ["iperf3", "-s", "-1", "-B", ip, "-p", port], stdout=open(os.devnull, "w"),
                      stderr=open(os.devnull, "w"))
    try:
        time.sleep(0.5)
        out = netns.run(ns_cli, ["iperf3", "-c", ip, "-p", port, "-t", str(seconds), "-C", cc, "-J"],
                        timeout=seconds + 30)
        if out.returncode != 0:
            raise RuntimeError(f"iperf3 failed: {out.stdout[-300:]} {out.stderr[-300:]}")
        d = json.loads(out.stdout)
        if "sum_received" not in d.get("end", {}):
            raise RuntimeError(f"iperf3: {d.get('error', 'no result')}")
        return d["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        try:
            srv.wait(timeout=5)
        except Exception:  # noqa: BLE001
            srv.kill()
            srv.wait()


def agents(ns_a: str, ip_a: str, ns_b: str, ip_b: str, size: int, iterations: int, cc: str, workdir: Path) -> dict:
    from traffic import job as jobm
    from traffic.collectives import make_schedule
    from traffic.controller import Controller, Member

    s = make_schedule("pipeline", 2, size, chunks=1)
    spec = jobm.JobSpec(ranks=2, segments=(jobm.Segment((("p2p", "p2p"),), iterations),), warmup=1)
    job = {"ranks": 2, "seed": 1, "verify": True, "timeout_s": 300, "transport": {"kind": "tcp", "cc": cc},
           "plan": jobm.iteration_plan(spec)}
    ctl = Controller(workdir, job, {"p2p": s}, [Member(0, "a", ns_a, ip_a), Member(1, "b", ns_b, ip_b)],
                     netns.popen)
    try:
        ctl.start()
        res = ctl.run(setup_timeout_s=60, run_timeout_s=300)
    finally:
        ctl.stop()
    if not res.verified:
        raise RuntimeError("agent data did not verify")
    # a send is done once its data is in the socket buffer, so the sender starts op i+1 while op i still drains:
    # goodput over the whole measured span (first start to last end), not size / mean op time
    t0 = min(r[5] for r in res.ops)
    t1 = max(r[6] for r in res.ops)
    return {"goodput_mbps": size * iterations * 8 / (t1 - t0) / 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-mbps", type=float, default=50.0, help="shaped path rate")
    ap.add_argument("--seconds", type=float, default=3.0, help="iperf3 duration and target agent op time")
    ap.add_argument("--iterations", type=int, default=3, help="measured agent iterations (after 1 warm-up)")
    ap.add_argument("--unshaped-bytes", default="64M", help="agent message on the unshaped path")
    ap.add_argument("--cc", default="cubic")
    ap.add_argument("--repeats", type=int, default=3, help="alternate iperf3 and agents this many times per path")
    a = ap.parse_args()
    require_root("benchmarks/agent_vs_iperf3.py")
    from testbed.network.fabric import Fabric
    from topologies import HostTcpSpec, uniform_leaf_spine
    from traffic.job import parse_size

    rid = f"b{os.getpid() % 100000}"
    fab = Fabric(uniform_leaf_spine(1, 1, 2, a.rate_mbps, a.rate_mbps, tcp=HostTcpSpec(congestion_control=a.cc)),
                 rid)
    na, nb = f"tb-{rid}-ua", f"tb-{rid}-ub"
    made = []
    rows = []
    try:
        fab.build(None, None)
        for ns in (na, nb):
            netns.create(ns)
            made.append(ns)
        links.add_veth(na, "eth0", nb, "eth0")
        links.add_address(na, "eth0", "198.18.200.1", 24)
        links.add_address(nb, "eth0", "198.18.200.2", 24)
        with tempfile.TemporaryDirectory(prefix="tb-bench-") as tmp:
            shaped_bytes = int(a.rate_mbps * 1e6 / 8 * a.seconds) // 4 * 4
            for label, (nsa, ipa, nsb, ipb), size in (
                    ("shaped", (fab.ns("h1"), fab.host_ip("h1"), fab.ns("h2"), fab.host_ip("h2")), shaped_bytes),
                    ("unshaped", (na, "198.18.200.1", nb, "198.18.200.2"), parse_size(a.unshaped_bytes) // 4 * 4)):
                ips, ags = [], []
                for k in range(a.repeats):
                    ips.append(iperf3(nsb, nsa, ipb, a.seconds, a.cc))
                    ags.append(agents(nsa, ipa, nsb, ipb, size, a.iterations, a.cc,
                                      Path(tmp) / f"{label}{k}")["goodput_mbps"])
                rows.append((label, size, ips, ags))
    finally:
        fab.teardown()
        for ns in made:
            netns.remove(ns)
    print(f"(each side: the median of {a.repeats} rounds [its interval] (n, the interval's coverage); per round "
          "iperf3 / agent)")
    for label, size, ips, ags in rows:
        per = ", ".join(f"{x:.0f}/{y:.0f}" for x, y in zip(ips, ags))
        d = compare(ags, ips)
        print(f"{label:<9} iperf3 {estimate(ips).text('{:.1f}')} Mbit/s; agent {estimate(ags).text('{:.1f}')} Mbit/s "
              f"({size} B messages)")
        print(f"{'':<9} agent/iperf3 {d.ratio:.3f} [{d.ratio_low:.3f}, {d.ratio_high:.3f}] ({d.verdict}); {per}")
    if a.rate_mbps:
        print(f"(shaped path: HTB at {a.rate_mbps:g} Mbit/s on every egress; cc {a.cc}; one TCP connection each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
