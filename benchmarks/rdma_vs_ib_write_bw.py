#!/usr/bin/env python3
"""How close does the RDMA agent transport get to ib_write_bw on the same rxe path? (a benchmark, not a test)

    sudo .venv/bin/testbed vm -- .venv/bin/python benchmarks/rdma_vs_ib_write_bw.py [--sizes 64K,1M] [--repeats 5]

Needs root and a kernel whose rxe works across namespaces (the lab VM). One path, built in this run and torn down
afterwards: h1 -> leaf1 -> h2 of a 1-leaf testbed.network.fabric with an rxe device on each host's NIC (HTB at
--rate-mbps on every egress; the default 1000 Mbit/s is above what rxe moves under software emulation, so the
shaper is not the limit). For each message size, --repeats rounds, each round alternating:

* ib_write_bw (perftest, RC RDMA WRITE, --iters messages of the size, its default of up to 128 in flight) between
  the two rxe devices, RoCEv2 GID of the hosts' IPv4 addresses: its "BW average" in MiB/s (4 digits; --report_gbits
  prints 2 decimals, 5-10% steps at 0.1-0.2 Gbit/s), and the CPU seconds both perftest processes used;
* for each of --protocols, two agents (traffic.agent, transport rdma, data verified), rank 0 -> rank 1
  point-to-point (the `pipeline` schedule, 2 ranks), --iters measured messages after one warm-up; goodput =
  payload bytes / (last op end - first op start). ``eager``: the transport's default (pieces written into the
  receiver's ring with credits, traffic.rdma_eager); ``rendezvous``: credits=0, a clear-to-send per message;
  ``grant``: the receiver grants its posted receives' destinations ahead, the sender writes straight into them
  (traffic.rdma_grant); ``grant-laK``: grant with receive look-ahead, the receives of the next K ops granted
  ahead into staging buffers and sends done from copies (traffic.rdma_staging): several messages in flight.

Prints, per size: each side's median with its interval and n (analysis.stats.estimate); agent / ib_write_bw per
round (the agent's goodput over the same round's ib_write_bw: the machine's load moves both, so this paired ratio
is the statistic to quote), its median and interval over rounds; the ratio of medians with its bootstrap interval
(analysis.stats.compare); the agents' CPU per payload byte (both
ranks, from the first post to the last completion) beside perftest's (whole processes, busy-polling); and where
the agents' time per message went (the transports' profile: blocked waiting, waiting for a clear-to-send or for
credits, copying out of the ring, CPU). --json: the same as one JSON line.

Measured: docs/collective.md, "The agent against ib_write_bw".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.stats import compare, estimate  # noqa: E402
from testbed.errors import require_root  # noqa: E402
from testbed.kernel import netns  # noqa: E402

#: the agent's transport options per name (--protocols); "-spin": poll 0.5 ms (grant-la4-spin: 5 ms) before sleeping
#: on the CQ's channel; "-laK": receive look-ahead of K ops; "-1w": a message in one write (no pieces); "eager-N": an
#: eager ring of N slots of 128 KiB (unset, the default: 32 slots with one peer, traffic.rdma_credits.auto_slots)
PROTOCOLS = {"eager": {}, "rendezvous": {"credits": 0}, "grant": {"protocol": "grant"},
             "grant-spin": {"protocol": "grant", "spin_us": 500}, "eager-spin": {"spin_us": 500},
             "eager-2MB": {"credits": 16}, "grant-la2": {"protocol": "grant", "lookahead": 2},
             "grant-la4": {"protocol": "grant", "lookahead": 4},
             "grant-la16": {"protocol": "grant", "lookahead": 16},
             "grant-la4-spin": {"protocol": "grant", "lookahead": 4, "spin_us": 5000},
             "grant-la4-1w": {"protocol": "grant", "lookahead": 4, "piece_bytes": 0},
             "eager-8": {"credits": 8}, "eager-32": {"credits": 32}}


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def ib_write_bw(ns_srv: str, dev_srv: str, gid_srv: int, ns_cli: str, dev_cli: str, gid_cli: int, ip_srv: str,
                size: int, iters: int, port: int, tx_depth: int = 0) -> tuple[float, float]:
    """(Gbit/s: perftest's BW average, CPU seconds of server and client); ``tx_depth`` > 0: perftest's -t, the
    writes it keeps in flight (0: its default, 128)."""
    common = ["-s", str(size), "-n", str(iters), "-F", "-p", str(port)]
    common += ["-t", str(tx_depth)] if tx_depth > 0 else []
    cpu0 = _children_cpu_s()
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
                # #bytes #iterations BW-peak BW-average[MiB/s] MsgRate[Mpps], 2 decimals: in MiB/s that is 4
                # significant digits here (--report_gbits' Gbit/s with 2 decimals was 0.10-0.22: 5-10% steps)
                gbps = float(f[3]) * (1 << 20) * 8 / 1e9
                print(f"ib_write_bw: {line.strip()}", file=sys.stderr)
                break
        else:
            raise RuntimeError(f"ib_write_bw: no result line in {out.stdout[-400:]!r}")
    finally:
        try:
            srv.wait(timeout=10)
        except Exception:  # noqa: BLE001
            srv.kill()
            srv.wait()
    return gbps, _children_cpu_s() - cpu0


def agents(ns_a: str, ip_a: str, ns_b: str, ip_b: str, size: int, iterations: int, workdir: Path,
           devices: tuple[str, str], options: dict) -> dict:
    """Goodput of one agent run, and the transport's profile per rank (describe()["profile"])."""
    from traffic import job as jobm
    from traffic.collectives import make_schedule
    from traffic.controller import Controller, Member

    s = make_schedule("pipeline", 2, size, chunks=1)
    spec = jobm.JobSpec(ranks=2, segments=(jobm.Segment((("p2p", "p2p"),), iterations),), warmup=1)
    rdma = {"devices": {"0": devices[0], "1": devices[1]}, "timeout": 16, "retry_cnt": 7, "rnr_retry": 7,
            "min_rnr_timer": 12, **options}
    job = {"ranks": 2, "seed": 1, "verify": True, "timeout_s": 300, "transport": {"kind": "rdma", "rdma": rdma},
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
    prof = {r: res.per_rank[r].get("transport", {}).get("profile", {}) for r in (0, 1)}
    in_flight = max([row[5].get("max_msgs_in_flight", 0) for row in res.tcp_info if row[2] == 0] or [0])
    return {"goodput_gbps": size * iterations * 8 / (t1 - t0) / 1e9, "seconds": t1 - t0, "profile": prof,
            "max_in_flight": in_flight}


def _breakdown(runs: list[dict], size: int, iters: int) -> dict:
    """Per message (medians over runs): time, and the profile's parts; CPU ns per payload byte of both ranks."""
    msgs = iters + 1  # the profile spans the warm-up message too
    med = lambda xs: estimate(xs).median  # noqa: E731
    out = {"ms_per_message": med([r["seconds"] / iters * 1e3 for r in runs]),
           "max_in_flight": max(r["max_in_flight"] for r in runs)}
    for rank, who in ((0, "sender"), (1, "receiver")):
        for k in ("wait_s", "cts_wait_s", "credit_wait_s", "copy_s", "cpu_s", "cpu_user_s", "cpu_sys_s"):
            out[f"{who}_{k[:-2]}_ms_per_message"] = med([r["profile"][rank].get(k, 0) / msgs * 1e3 for r in runs])
        out[f"{who}_completions_per_message"] = med([r["profile"][rank].get("completions", 0) / msgs for r in runs])
    out["cpu_ns_per_byte"] = estimate([(r["profile"][0].get("cpu_s", 0) + r["profile"][1].get("cpu_s", 0))
                                       / (size * msgs) * 1e9 for r in runs]).as_dict()
    return out


def measure(fab, a, size: int) -> dict:
    """Every round of one message size: ib_write_bw, then the agents with each protocol."""
    from traffic.rdma import find_device

    (na, ia), (nb, ib) = (fab.ns("h1"), fab.host_ip("h1")), (fab.ns("h2"), fab.host_ip("h2"))
    da, ga = find_device(ia)
    db, gb = find_device(ib)
    ibs, ib_cpu = [], []
    runs: dict[str, list[dict]] = {p: [] for p in a.protocols}
    with tempfile.TemporaryDirectory(prefix="tb-bench-") as tmp:
        for k in range(a.repeats):
            gbps, cpu = ib_write_bw(nb, db, gb, na, da, ga, ib, size, a.iters, 18515 + k, a.tx_depth)
            ibs.append(gbps)
            ib_cpu.append(cpu / (size * a.iters) * 1e9)
            for p in a.protocols:
                runs[p].append(agents(na, ia, nb, ib, size, a.iters, Path(tmp) / f"{size}-{p}-{k}", (da, db),
                                      PROTOCOLS[p]))
    out = {"message_bytes": size, "iters": a.iters, "tx_depth": a.tx_depth, "ib_write_bw_gbps": estimate(ibs).as_dict(),
           "rounds_ib_write_bw": ibs, "ib_write_bw_cpu_ns_per_byte": estimate(ib_cpu).as_dict(), "agents": {}}
    for p, rs in runs.items():
        g = [r["goodput_gbps"] for r in rs]
        d = compare(g, ibs)
        paired = [x / y for x, y in zip(g, ibs)]  # the same round's load moves both: the honest statistic
        out["agents"][p] = {"gbps": estimate(g).as_dict(), "rounds": g, "ratio": d.ratio, "ratio_low": d.ratio_low,
                            "ratio_high": d.ratio_high, "verdict": d.verdict, "paired_ratios": paired,
                            "paired_ratio": estimate(paired).as_dict(), **_breakdown(rs, size, a.iters)}
    return out


def report(m: dict) -> None:
    from analysis.stats import Estimate

    e = lambda d: Estimate(**d).text("{:.3f}")  # noqa: E731
    print(f"\n{m['message_bytes']} B messages x {m['iters']} (median [interval] (n, the interval's coverage)):")
    if m.get("tx_depth"):
        print(f"  ib_write_bw with -t {m['tx_depth']} (writes in flight)")
    print(f"  ib_write_bw {e(m['ib_write_bw_gbps'])} Gbit/s; CPU {e(m['ib_write_bw_cpu_ns_per_byte'])} ns/byte "
          "(server + client, busy-polling)")
    for p, r in m["agents"].items():
        per = ", ".join(f"{x:.3f}" for x in r["rounds"])
        pair = ", ".join(f"{x:.2f}" for x in r["paired_ratios"])
        print(f"  agent {p}: {e(r['gbps'])} Gbit/s (rounds {per})")
        print(f"    agent/ib_write_bw per round: {e(r['paired_ratio'])} (rounds {pair}); ratio of medians "
              f"{r['ratio']:.3f} [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}] (bootstrap 95%; {r['verdict']})")
        parts = []
        for who in ("sender", "receiver"):
            g = lambda k: r[f"{who}_{k}_ms_per_message"]  # noqa: E731
            parts.append(f"{who} blocked {g('wait'):.2f}, clear-to-send {g('cts_wait'):.2f}, credits "
                         f"{g('credit_wait'):.2f}, copy {g('copy'):.2f}, CPU {g('cpu'):.2f} ms (user "
                         f"{g('cpu_user'):.2f}, system {g('cpu_sys'):.2f}), "
                         f"{r[f'{who}_completions_per_message']:.1f} completions")
        print(f"    CPU {e(r['cpu_ns_per_byte'])} ns/byte (both ranks); at most {r['max_in_flight']} messages in "
              f"flight (grant); per message {r['ms_per_message']:.2f} ms: "
              + "; ".join(parts))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-mbps", type=float, default=1000.0, help="HTB rate of the path")
    ap.add_argument("--sizes", default="64K,1M", help="message sizes (both tools), comma-separated")
    ap.add_argument("--iters", type=int, default=32, help="messages per measurement (both tools)")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per size (each: ib_write_bw, then the agents)")
    ap.add_argument("--tx-depth", type=int, default=0, help="ib_write_bw's writes in flight (-t; 0: its default "
                    "128; 1: one message at a time, as the agent's point-to-point op has it)")
    ap.add_argument("--protocols", default="eager,rendezvous,grant", help=f"agent protocols ({', '.join(PROTOCOLS)})")
    ap.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    a = ap.parse_args()
    from traffic.job import parse_size

    try:
        sizes = [parse_size(x) // 4 * 4 for x in a.sizes.split(",")]
        a.protocols = [p for p in a.protocols.split(",") if p]
        bad = ([p for p in a.protocols if p not in PROTOCOLS]
               or [x for x in (a.iters, a.repeats, a.tx_depth + 1) if x < 1])
    except ValueError as exc:
        bad = [str(exc)]
    if bad or not sizes or not a.protocols or min(sizes) < 4:
        ap.error(f"bad --sizes/--protocols/--iters/--repeats/--tx-depth: {bad or a.sizes}")
    require_root("benchmarks/rdma_vs_ib_write_bw.py")
    from testbed.errors import CapabilityMissing
    from testbed.kernel import doctor
    from testbed.network.fabric import Fabric
    from topologies import LeafSpineSpec, LinkSpec

    if doctor.missing(["rxe:netns"]):
        raise SystemExit(f"benchmarks/rdma_vs_ib_write_bw.py: {CapabilityMissing('rxe:netns', 'run it in the lab VM')}")
    rid = f"b{os.getpid() % 100000}"
    fab = Fabric(LeafSpineSpec(spines=1, leaves=1, hosts_per_leaf=2, host_link=LinkSpec(a.rate_mbps),
                               fabric_link=LinkSpec(a.rate_mbps)), rid, rxe=True)
    results = []
    try:
        fab.build(None, None)
        for size in sizes:
            results.append(measure(fab, a, size))
            report(results[-1])
    finally:
        fab.teardown()
    print(f"(path h1 -> leaf1 -> h2, rxe on each host NIC, HTB at {a.rate_mbps:g} Mbit/s)")
    if a.json:
        print(json.dumps({"rate_mbps": a.rate_mbps, "sizes": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
