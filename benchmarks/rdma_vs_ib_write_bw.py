#!/usr/bin/env python3
"""How close does the RDMA agent transport get to ib_write_bw on the same rxe path? (a benchmark, not a test)

    sudo .venv/bin/testbed vm -- .venv/bin/python benchmarks/rdma_vs_ib_write_bw.py [--rate-mbps 1000] [--size 1M]

Needs root and a kernel whose rxe works across namespaces (the lab VM). One path, built in this run and torn down
afterwards: h1 -> leaf1 -> h2 of a 1-leaf testbed.network.fabric with an rxe device on each host's NIC (HTB at
--rate-mbps
on every egress; the default 1000 Mbit/s is above what rxe moves under software emulation, so the shaper is not
the limit). On it, alternately --repeats times:

* ib_write_bw (perftest, RC RDMA WRITE, --size bytes, --iters messages) between the two rxe devices, RoCEv2 GID
  of the hosts' IPv4 addresses; its "BW average" in Gbit/s (--report_gbits);
* two agents (traffic.agent, transport rdma: rendezvous + RDMA WRITE WITH IMMEDIATE into registered numpy
  buffers, data verified), rank 0 -> rank 1 point-to-point (the `pipeline` schedule, 2 ranks), --iters measured
  iterations of a --size message after one warm-up; goodput = payload bytes / (last op end - first op start).

Prints each side's median with its interval and n (analysis.stats.estimate) and agent / ib_write_bw as the ratio
of medians with its bootstrap interval (analysis.stats.compare); also as JSON with --json.

Measured (2026-12-02, lab VM, software emulation, heavily shared machine; --repeats 1 --iters 16, 1 MB):
ib_write_bw 0.130 Gbit/s, agent 0.098 Gbit/s, ratio 0.757.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.stats import compare, estimate  # noqa: E402
from testbed.errors import require_root  # noqa: E402
from testbed.kernel import netns  # noqa: E402


def ib_write_bw(ns_srv: str, dev_srv: str, gid_srv: int, ns_cli: str, dev_cli: str, gid_cli: int, ip_srv: str,
                size: int, iters: int, port: int) -> float:
    """Gbit/s (perftest's BW average with --report_gbits)."""
    common = ["-s", str(size), "-n", str(iters), "-F", "--report_gbits", "-p", str(port)]
    srv = netns.popen(ns_srv, ["ib_write_bw", "-d", dev_srv, "-x", str(gid_srv), *common], stdout=open(os.devnull, "w"),
                      stderr=open(os.devnull, "w"))
    try:
        deadline = time.monotonic() + 20
        while True:
            time.sleep(0.5)
            out = netns.run(ns_cli, ["ib_write_bw", "-d", dev_cli, "-x", str(gid_cli), *common, ip_srv], timeout=300)
            if out.returncode == 0 or srv.poll() is not None or time.monotonic() > deadline:
                break
        if out.returncode != 0:
            raise RuntimeError(f"ib_write_bw failed: {out.stdout[-300:]} {out.stderr[-300:]}")
        for line in out.stdout.splitlines():
            f = line.split()
            if len(f) >= 5 and f[0] == str(size) and re.match(r"^\d+$", f[1]):
                return float(f[3])  # #bytes #iterations BW-peak BW-average MsgRate
        raise RuntimeError(f"ib_write_bw: no result line in {out.stdout[-400:]!r}")
    finally:
        try:
            srv.wait(timeout=10)
        except Exception:  # noqa: BLE001
            srv.kill()
            srv.wait()


def agents(ns_a: str, ip_a: str, ns_b: str, ip_b: str, size: int, iterations: int, workdir: Path,
           devices: tuple[str, str]) -> dict:
    from traffic import job as jobm
    from traffic.collectives import make_schedule
    from traffic.controller import Controller, Member

    s = make_schedule("pipeline", 2, size, chunks=1)
    spec = jobm.JobSpec(ranks=2, segments=(jobm.Segment((("p2p", "p2p"),), iterations),), warmup=1)
    job = {"ranks": 2, "seed": 1, "verify": True, "timeout_s": 300,
           "transport": {"kind": "rdma", "rdma": {"devices": {"0": devices[0], "1": devices[1]}, "timeout": 16,
                                                  "retry_cnt": 7, "rnr_retry": 7, "min_rnr_timer": 12}},
           "plan": jobm.iteration_plan(spec)}
    ctl = Controller(workdir, job, {"p2p": s}, [Member(0, "a", ns_a, ip_a), Member(1, "b", ns_b, ip_b)],
                     netns.popen)
    try:
        ctl.start()
        res = ctl.run(setup_timeout_s=60, run_timeout_s=300)
    except Exception:
        for r in (0, 1):
            print(f"--- agent {r} log:\n{ctl.agent_log(r)}", file=sys.stderr)
        raise
    finally:
        ctl.stop()
    if not res.verified:
        raise RuntimeError("agent data did not verify")
    t0 = min(r[5] for r in res.ops)
    t1 = max(r[6] for r in res.ops)
    return {"goodput_gbps": size * iterations * 8 / (t1 - t0) / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-mbps", type=float, default=1000.0, help="HTB rate of the path")
    ap.add_argument("--size", default="1M", help="message size (both tools)")
    ap.add_argument("--iters", type=int, default=32, help="messages per measurement (both tools)")
    ap.add_argument("--repeats", type=int, default=3, help="alternate ib_write_bw and agents this many times")
    ap.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    a = ap.parse_args()
    require_root("benchmarks/rdma_vs_ib_write_bw.py")
    from testbed.kernel import doctor
    from testbed.errors import CapabilityMissing
    from testbed.network.fabric import Fabric
    from topologies import LeafSpineSpec, LinkSpec
    from traffic.job import parse_size
    from traffic.rdma import find_device

    if doctor.missing(["rxe:netns"]):
        raise SystemExit(f"benchmarks/rdma_vs_ib_write_bw.py: {CapabilityMissing('rxe:netns', 'run it in the lab VM')}")
    size = parse_size(a.size) // 4 * 4
    rid = f"b{os.getpid() % 100000}"
    fab = Fabric(LeafSpineSpec(spines=1, leaves=1, hosts_per_leaf=2, host_link=LinkSpec(a.rate_mbps),
                               fabric_link=LinkSpec(a.rate_mbps)), rid, rxe=True)
    ibs, ags = [], []
    try:
        fab.build(None, None)
        (na, ia), (nb, ib) = (fab.ns("h1"), fab.host_ip("h1")), (fab.ns("h2"), fab.host_ip("h2"))
        da, ga = find_device(ia)
        db, gb = find_device(ib)
        with tempfile.TemporaryDirectory(prefix="tb-bench-") as tmp:
            for k in range(a.repeats):
                ibs.append(ib_write_bw(nb, db, gb, na, da, ga, ib, size, a.iters, 18515 + k))
                ags.append(agents(na, ia, nb, ib, size, a.iters, Path(tmp) / f"r{k}", (da, db))["goodput_gbps"])
    finally:
        fab.teardown()
    ib_e, ag_e, d = estimate(ibs), estimate(ags), compare(ags, ibs)
    print(f"ib_write_bw {ib_e.text('{:.3f}')} Gbit/s; agent {ag_e.text('{:.3f}')} Gbit/s "
          f"({size} B messages x {a.iters}; median [interval] (n, the interval's coverage))")
    per = ", ".join(f"{x:.3f}/{y:.3f}" for x, y in zip(ibs, ags))
    print(f"agent/ib_write_bw {d.ratio:.3f} [{d.ratio_low:.3f}, {d.ratio_high:.3f}] (ratio of medians, bootstrap 95% "
          f"interval; {d.verdict}); per round ib_write_bw / agent: {per}")
    print(f"(path h1 -> leaf1 -> h2, rxe on each host NIC, HTB at {a.rate_mbps:g} Mbit/s)")
    if a.json:
        print(json.dumps({"ib_write_bw_gbps": ib_e.as_dict(), "agent_gbps": ag_e.as_dict(), "ratio": d.ratio,
                          "ratio_low": d.ratio_low, "ratio_high": d.ratio_high, "verdict": d.verdict,
                          "message_bytes": size, "iters": a.iters, "rounds_ib_write_bw": ibs, "rounds_agent": ags}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
