#!/usr/bin/env python3
"""The least a Python program does to move RDMA WRITEs over rxe, beside ib_write_bw on the same path: is the RDMA
agent's gap to perftest in the agent or in Python verbs? (a benchmark, not a test)

    sudo .venv/bin/testbed vm -- .venv/bin/python benchmarks/verbs_write_bw.py [--depths 1,5,16] [--repeats 3]

Same path as benchmarks/rdma_vs_ib_write_bw.py (h1 -> leaf1 -> h2, rxe on each host NIC). Per round and depth K,
interleaved: ib_write_bw -t K, then this script's own client/server pair (pyverbs, one process in each host's
namespace): one registered buffer of the message size on each side, one RC QP pair set up with traffic.rxe's
make_qp/qp_to_rts (the agent's attributes), the client posting --iters RDMA WRITEs of the whole buffer into the
server's with K in flight, one in K signalled (perftest's --cq-mod capped at its depth), its completions polled
busy (``busy``, as perftest's client) or waited for on the completion channel (``event``, as the agent). Goodput =
iters x size / (first post .. last completion) on the client, as perftest times it. Nothing verified, no control
messages, no copies: what is left is the verbs path from Python.

Measured: docs/collective.md, "The agent against ib_write_bw".
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _child(role: str, ip: str, size: int, iters: int, depth: int, mode: str) -> None:
    """One end: the handshake (benchmarks.verbs_pair.connect_end); the client then writes and prints its time."""
    from benchmarks.verbs_pair import connect_end
    from traffic.rxe import completion_channel, find_device, make_qp, verbs

    v = verbs()
    e = v["e"]
    dev, gidx = find_device(ip)
    ctx = v["Context"](name=dev)
    pd = v["PD"](ctx)
    ch, fd = completion_channel(v, ctx)
    cq = v["CQ"](ctx, 4096, None, ch, 0)
    if fd is None and mode == "event":  # traffic.rxe.completion_channel could not tell its descriptor apart
        raise SystemExit("verbs_write_bw: no completion channel descriptor found: mode event cannot run")
    access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
    mr = v["MR"](pd, size, access)
    qp = make_qp(v, pd, cq, access, max(depth, 1) + 1, 4)
    peer = connect_end(v, ctx, gidx, qp, mr)
    if peer is None:
        return
    if role == "client":
        sge = v["SGE"](mr.buf, size, mr.lkey)
        print(json.dumps(_write(v, qp, cq, ch, fd, sge, peer, iters, depth, mode)), flush=True)
    else:
        print("{}", flush=True)
    sys.stdin.readline()


def _write(v: dict, qp, cq, ch, fd, sge, peer: dict, iters: int, depth: int, mode: str) -> dict:
    """Post ``iters`` writes, ``depth`` in flight, one in ``depth`` signalled; time first post .. last completion."""
    e = v["e"]
    posted = done = wakeups = 0
    sleep_s = 0.0002
    cpu0, t0 = os.times(), time.monotonic()
    while done < iters:
        while posted < iters and posted - done < depth:
            last = posted + 1 == iters or (posted + 1) % depth == 0
            wr = v["SendWR"](wr_id=posted + 1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge],
                             send_flags=e.IBV_SEND_SIGNALED if last else 0)
            wr.set_wr_rdma(peer["rkey"], peer["addr"])
            qp.post_send(wr)
            posted += 1
        n, wcs = cq.poll(num_entries=16)
        for wc in wcs[:max(n, 0)]:
            if wc.status != 0:
                raise RuntimeError(f"write completion status {wc.status}")
            done = max(done, wc.wr_id)
        if n > 0:
            sleep_s = 0.0002
        elif mode == "sleep":  # traffic.rdma_cq without its channel: sleeps of 0.2 ms doubling up to 2 ms
            time.sleep(sleep_s)
            sleep_s = min(2 * sleep_s, 0.002)
        if n <= 0 and mode == "event":
            cq.req_notify()
            n, wcs = cq.poll(num_entries=16)
            for wc in wcs[:max(n, 0)]:
                done = max(done, wc.wr_id)
            if n <= 0 and select.select([fd], [], [], 5.0)[0]:
                ch.get_cq_event(cq)
                cq.ack_events(1)
                wakeups += 1
    t1, cpu1 = time.monotonic(), os.times()
    return {"seconds": t1 - t0, "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system), "wakeups": wakeups}


def pyverbs_run(ns_srv: str, ip_srv: str, ns_cli: str, ip_cli: str, size: int, iters: int, depth: int,
                mode: str) -> dict:
    """One client/server pair (benchmarks.verbs_pair.run_pair): the client's result plus its Gbit/s."""
    from benchmarks.verbs_pair import run_pair

    args = ["--size", str(size), "--iters", str(iters), "--depth", str(depth), "--mode", mode]
    res, _, info = run_pair(str(Path(__file__).resolve()), ns_srv, ip_srv, ns_cli, ip_cli, args)
    res["gbps"] = size * iters * 8 / res["seconds"] / 1e9
    res["mtu_bytes"] = info["mtu_bytes"]
    return res


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=("client", "server"), help=argparse.SUPPRESS)
    ap.add_argument("--ip", help=argparse.SUPPRESS)
    ap.add_argument("--depth", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="busy", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="1M", help="message size (both tools)")
    ap.add_argument("--iters", type=int, default=32, help="messages per measurement (both tools)")
    ap.add_argument("--depths", default="1,5,16", help="writes in flight (ib_write_bw -t; ours), comma-separated")
    ap.add_argument("--modes", default="busy,sleep,event",
                    help="how our client waits for completions: busy polling, sleeps, the completion channel")
    ap.add_argument("--agents", default="", help="also the RDMA agent with these protocols per round "
                    "(benchmarks/rdma_vs_ib_write_bw.py's PROTOCOLS), and ib_write_bw at its default depth")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (each: every depth, both tools)")
    a = ap.parse_args()
    from benchmarks.rdma_vs_ib_write_bw import PROTOCOLS
    from traffic.job import parse_size

    try:
        a.size = parse_size(a.size) // 4 * 4
        a.depths = [int(x) for x in a.depths.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    a.modes = [m for m in a.modes.split(",") if m]
    a.agents = [x for x in a.agents.split(",") if x]
    if (min(a.depths) < 1 or a.iters < 1 or a.repeats < 1 or set(a.modes) - {"busy", "sleep", "event"}
            or set(a.agents) - set(PROTOCOLS)):
        ap.error("bad --depths/--modes/--agents/--iters/--repeats")
    return a


def _round(k: int, a: argparse.Namespace, hosts: tuple, rows: dict[str, list[float]]) -> None:
    """One round: ib_write_bw at its default depth and the agents (--agents), then per depth ib_write_bw -t K and
    the pyverbs pair in each mode."""
    from benchmarks.rdma_vs_ib_write_bw import PROTOCOLS, agents, ib_write_bw

    (na, ia, da, ga), (nb, ib, db, gb) = hosts
    if a.agents:
        g, _ = ib_write_bw(nb, db, gb, na, da, ga, ib, a.size, a.iters, 18600 + k, 0)
        rows.setdefault("ib_write_bw-default", []).append(g)
    for p in a.agents:
        with tempfile.TemporaryDirectory(prefix="tb-vwb-") as tmp:
            r = agents(na, ia, nb, ib, a.size, a.iters, Path(tmp), (da, db), PROTOCOLS[p])
        rows.setdefault(f"agent-{p}", []).append(r["goodput_gbps"])
        print(f"round {k} agent {p}: {r['goodput_gbps']:.4f}", file=sys.stderr, flush=True)
    for d in a.depths:
        g, _ = ib_write_bw(nb, db, gb, na, da, ga, ib, a.size, a.iters, 18515 + k, d)
        rows.setdefault(f"ib_write_bw-t{d}", []).append(g)
        for m in a.modes:
            r = pyverbs_run(nb, ib, na, ia, a.size, a.iters, d, m)
            rows.setdefault(f"pyverbs-{m}-t{d}", []).append(r["gbps"])
            print(f"round {k} depth {d} {m}: {r}", file=sys.stderr, flush=True)


def main() -> int:
    a = _args()
    if a.child:
        _child(a.child, a.ip, a.size, a.iters, a.depth, a.mode)
        return 0
    from benchmarks.verbs_pair import rxe_pair
    from testbed.errors import require_root

    require_root("benchmarks/verbs_write_bw.py")
    rows: dict[str, list[float]] = {}
    with rxe_pair("v") as hosts:
        for k in range(a.repeats):
            _round(k, a, hosts, rows)
    report(rows, a.depths, a.modes)
    print(json.dumps(rows))
    return 0


def report(rows: dict, depths: list[int], modes: list[str]) -> None:
    from analysis.stats import compare, estimate

    for d in depths:
        ib = rows[f"ib_write_bw-t{d}"]
        print(f"depth {d}: ib_write_bw {estimate(ib).text('{:.3f}')} Gbit/s")
        for m in modes:
            g = rows[f"pyverbs-{m}-t{d}"]
            c = compare(g, ib)
            print(f"  pyverbs {m}: {estimate(g).text('{:.3f}')}; / ib_write_bw {c.ratio:.3f} "
                  f"[{c.ratio_low:.3f}, {c.ratio_high:.3f}] {c.verdict}")
    for name in [k for k in rows if k.startswith(("agent-", "pyverbs-"))] if "ib_write_bw-default" in rows else []:
        c = compare(rows[name], rows["ib_write_bw-default"])
        print(f"{name} / ib_write_bw (default depth): {c.ratio:.3f} [{c.ratio_low:.3f}, {c.ratio_high:.3f}] "
              f"{c.verdict}")


if __name__ == "__main__":
    sys.exit(main())
