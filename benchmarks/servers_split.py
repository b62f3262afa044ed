#!/usr/bin/env python3
"""The same ring all-reduce on one server and split over two kernels (the host's and the lab VM's): what does going
past one machine cost? (docs/servers.md, issue 29; a benchmark, not a test)

    sudo .venv/bin/python benchmarks/servers_split.py [--leaves 4 --hosts-per-leaf 2 --rate-mbps 10] [--repeats 3]

The lab VM is booted as a second server (testbed.commands.servervm: its sshd on a wire from a project namespace).
Per round, in alternating order, two layouts of the same leaf-spine (MTU 1450, so VXLAN fits the 1500-byte wire):

* ``one``: every node on server-1 (this machine's kernel), built by its agent;
* ``split``: SwitchBinPlacer over server-1 and server-2 (the VM's kernel), the crossing links VXLAN over the wire.

Both go through the same machinery (testbed.network.serverfabric.ServerFabric, serverjobs.run_collective: every
rank started by its server's agent, the controller on TCP, ops on the reference clock), so the layouts differ only
in where the nodes run. Per layout: each iteration's all-reduce time (the latest rank's op end minus the earliest
rank's op start) over its alpha-beta bound at the link rate; the build time per server (its share's set-up);
the busy fraction of each server's CPUs during the job (/proc/stat, read through the agent); the far clock's bound.
Prints, per layout, medians with their 95% interval over rounds, and split / one per round (paired: the machine's
load moves both). Every rank verifies its data; nothing is left on either kernel.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CPU_LINE = ["sh", "-c", "head -1 /proc/stat"]


def _cpu(link) -> tuple[int, int]:
    """(busy, total) jiffies of the server's machine, read by its agent."""
    f = [int(x) for x in link.call("run", argv=CPU_LINE)["stdout"].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return sum(f) - idle, sum(f)


def _busy(a: tuple[int, int], b: tuple[int, int]) -> float:
    return (b[0] - a[0]) / max(1, b[1] - a[1])


def one_layout(layout: str, links: dict, topo, a, workdir: Path, listen_in) -> dict:
    """Build ``topo`` over the layout's servers, run the job once, tear down: the numbers of one measurement."""
    from testbed.network.serverfabric import ServerFabric
    from testbed.workloads.serverjobs import ring_job, run_collective
    from testbed.commands.servervm import WIRE_HOST
    from traffic.controller import Member
    from traffic.schedule import alpha_beta_bound_s

    use = [links["server-1"]] + ([links["server-2"]] if layout == "split" else [])
    hosts = [h.name for h in topo.hosts]
    job, schedules = ring_job(len(hosts), a.size, a.iterations, timeout_s=300)
    t0 = time.monotonic()
    with ServerFabric(topo, secrets.token_hex(3), use) as fab:
        built_s = time.monotonic() - t0
        rec = fab.describe()
        members = [Member(r, h, fab.ns(h), topo.host_ip(h)) for r, h in enumerate(hosts)]
        cpu0 = {lk.server.name: _cpu(lk) for lk in use}
        res = run_collective(fab, workdir, job, schedules, members, listen=(WIRE_HOST, 0), listen_in=listen_in,
                             timeout_s=300)
        cpu = {lk.server.name: _busy(cpu0[lk.server.name], _cpu(lk)) for lk in use}
    if not res.verified:
        raise RuntimeError(f"{layout}: a rank's data did not verify")
    bound_s = alpha_beta_bound_s("allreduce", len(hosts), a.size, a.rate_mbps * 1e6 / 8, 0.0)
    per_it: dict[int, list] = {}
    for row in res.ops:
        per_it.setdefault(row[0], []).append(row)
    times = [max(r[6] for r in rows) - min(r[5] for r in rows) for _, rows in sorted(per_it.items())]
    return {"op_over_bound": [t / bound_s for t in times], "built_s": built_s, "cpu_busy": cpu,
            "setup_s": {s: x["request_s"] for s, x in rec["servers"].items()},
            "nodes": {s: len(ns) for s, ns in rec["placement"].items()},
            "clock_bound_us": res.clock_uncertainty_s * 1e6, "ready_s": res.t_ready - res.t_spawned}


def _args() -> argparse.Namespace:
    from traffic.job import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spines", type=int, default=2)
    ap.add_argument("--leaves", type=int, default=4)
    ap.add_argument("--hosts-per-leaf", type=int, default=2)
    ap.add_argument("--rate-mbps", type=float, default=10.0, help="every link's rate")
    ap.add_argument("--size", default="256K", help="each rank's all-reduce input")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="rounds (each: both layouts, alternating order)")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()
    try:
        a.size = parse_size(a.size)
    except ValueError as e:
        ap.error(str(e))
    if min(a.spines, a.leaves, a.hosts_per_leaf, a.iterations, a.repeats) < 1 or a.leaves < 2 or a.rate_mbps <= 0:
        ap.error("spines, hosts-per-leaf, iterations, repeats >= 1, leaves >= 2 (one per server), rate > 0")
    return a


def measure(a, folder: Path) -> dict:
    from testbed.network.serverlink import AgentLink
    from testbed.commands.servervm import sshd_vm
    from testbed.kernel import netns
    from testbed.network.serversfile import load
    from topologies.leafspine import uniform_leaf_spine

    topo = uniform_leaf_spine(a.spines, a.leaves, a.hosts_per_leaf, a.rate_mbps, a.rate_mbps, mtu=1450)
    rows: dict[str, list[dict]] = {"one": [], "split": []}
    with sshd_vm(folder / "vm") as vm:
        with netns.entered(vm.wire):
            local = AgentLink.start(load(vm.servers)[0])
        links = {"server-1": local, "server-2": vm.guest()}
        try:
            for k in range(a.repeats):
                for layout in (("one", "split") if k % 2 == 0 else ("split", "one")):
                    with tempfile.TemporaryDirectory(prefix="tb-split-", dir=folder) as work:
                        rows[layout].append(one_layout(layout, links, topo, a, Path(work),
                                                       lambda: netns.entered(vm.wire)))
                    print(f"round {k} {layout}: {json.dumps(rows[layout][-1])}", file=sys.stderr, flush=True)
        finally:
            for lk in links.values():
                with contextlib.suppress(Exception):
                    lk.close()
        sshd_after_s = vm.sshd_after_s
    return {"hosts": len(topo.hosts), "rate_mbps": a.rate_mbps, "size_bytes": a.size, "sshd_after_s": sshd_after_s,
            "rounds": rows}


def report(m: dict) -> None:
    from analysis.stats import estimate

    med = {lay: [statistics.median(r["op_over_bound"]) for r in rs] for lay, rs in m["rounds"].items()}
    print(f"{m['hosts']} hosts, {m['rate_mbps']:g} Mbit/s, {m['size_bytes']} B per rank; VM's sshd up after "
          f"{m['sshd_after_s']:.1f} s")
    for lay, rs in m["rounds"].items():
        print(f"{lay}: all-reduce / bound {estimate(med[lay]).text('{:.2f}')}; build "
              f"{estimate([r['built_s'] for r in rs]).text('{:.1f}')} s; ranks ready "
              f"{estimate([r['ready_s'] for r in rs]).text('{:.1f}')} s")
        for s in rs[0]["cpu_busy"]:
            busy = estimate([r["cpu_busy"][s] for r in rs]).text("{:.2f}")
            setup = estimate([r["setup_s"][s] or 0 for r in rs]).text("{:.1f}")
            print(f"  {s} ({rs[0]['nodes'][s]} nodes): CPU busy {busy}, share set-up {setup} s")
    paired = [s / o for s, o in zip(med["split"], med["one"])]
    print(f"split / one per round: {estimate(paired).text('{:.2f}')} (rounds {', '.join(f'{x:.2f}' for x in paired)})")
    print(f"far clock's bound: {estimate([r['clock_bound_us'] for r in m['rounds']['split']]).text('{:.0f}')} us")


def main() -> int:
    a = _args()
    from testbed.errors import require_root

    require_root("benchmarks/servers_split.py")

    def on_sigterm(signum, frame):       # as Ctrl-C: the VM, the wire and the run's keys go on the way out
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_sigterm)
    with tempfile.TemporaryDirectory(prefix="tb-split-") as tmp:
        m = measure(a, Path(tmp))
    report(m)
    print(json.dumps(m))
    if a.out:
        Path(a.out).write_text(json.dumps(m, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
