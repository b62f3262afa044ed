#!/usr/bin/env python3
"""From the least Python RDMA WRITE program to the RDMA agent's eager protocol, one difference at a time, each beside
ib_write_bw in the same round: which of the agent's differences costs its gap to perftest? (a benchmark, not a test)

    sudo .venv/bin/testbed vm -- .venv/bin/python benchmarks/verbs_steps.py [--steps whole,pieces,...] [--repeats 4]

Same path as benchmarks/verbs_write_bw.py (h1 -> leaf1 -> h2, rxe on each host NIC, one RC QP pair with
traffic.rxe's attributes, completions waited for on the completion channel as the agent does). Per round:
ib_write_bw at its default depth, then each step (a client/server pair of this script's own, one process per host),
then the agent itself (--agents, benchmarks/rdma_vs_ib_write_bw.py's PROTOCOLS). Steps (cumulative, toward eager):

* ``whole``: each message one RDMA WRITE into one buffer, ``window`` pieces in flight (a message is one piece);
* ``pieces``: each message in writes of ``piece`` bytes (the agent's 128 KiB slots), the same bytes in flight;
* ``imm``: + each piece a WRITE WITH IMMEDIATE: a receive consumed and a completion at the server per piece;
* ``credits``: + the server's ring of ``window`` slots, the client writing only into slots it holds credits for,
  the server giving them back by a SEND per ``credit_every`` pieces (the agent's old ring: 8 slots, a SEND per 2;
  ``credits32``: its default now, 32 slots, a SEND per 8);
* ``copy``: + the client copies each piece into a registered send buffer first and the server copies it out of
  its slot into the message's destination (the agent's eager copies);
* ``verify``: + the server compares each message with what was sent (the agent verifies at the end of a job).

Side steps: ``whole1`` (one message in flight), ``pieces8`` (8 pieces, 1 MiB, in flight without credits),
``credits32`` / ``credits128`` (a ring of 32 slots, a SEND per 8; 128, per 32), ``copy32nv`` / ``copy32``
(``credits32`` with the copies; and verified). Each is also reported over the step it differs from by one thing
(``PARENT``), per round.

Goodput = iters x size / (the client's first post .. the later of its last completion and the server's last
piece). Prints, per step, its Gbit/s and step / ib_write_bw per round (paired ratio, analysis.stats.estimate).
Measured: docs/collective.md, "The agent against ib_write_bw".
"""

from __future__ import annotations

import argparse
import json
import select
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SLOT = 128 * 1024
_BASE = {"piece": 0, "window": 32, "imm": False, "credit_every": 0, "copy": False, "verify": False}
#: each step: the knobs that differ from _BASE (cumulative in the order listed)
STEPS = {"whole": {}, "pieces": {"piece": SLOT, "window": 256}, "imm": {"piece": SLOT, "window": 256, "imm": True}}
STEPS["credits"] = {**STEPS["imm"], "window": 8, "credit_every": 2}
STEPS["credits32"] = {**STEPS["imm"], "window": 32, "credit_every": 8}
STEPS["copy"] = {**STEPS["credits"], "copy": True}
STEPS["verify"] = {**STEPS["copy"], "verify": True}
STEPS["copy32"] = {**STEPS["credits32"], "copy": True, "verify": True}
STEPS["whole1"] = {"window": 1}
STEPS["copy32nv"] = {**STEPS["credits32"], "copy": True}
STEPS["credits128"] = {**STEPS["imm"], "window": 128, "credit_every": 32}
#: the step each one differs from by one thing (reported as a paired ratio when both ran)
PARENT = {"pieces": "whole", "imm": "pieces", "credits": "imm", "copy": "credits", "verify": "copy",
          "whole1": "whole", "pieces8": "pieces", "credits32": "credits", "credits128": "credits",
          "copy32nv": "credits32", "copy32": "copy32nv"}
STEPS["pieces8"] = {"piece": SLOT, "window": 8}


class _End:
    """One end's verbs objects: device context, PD, CQ with its channel, one RC QP in RTS with the peer."""

    def __init__(self, ip: str, sq: int, rq: int):
        from traffic.rxe import completion_channel, find_device, make_qp, verbs

        self.v = v = verbs()
        self.e = v["e"]
        dev, self.gidx = find_device(ip)
        self.ctx = v["Context"](name=dev)
        self.pd = v["PD"](self.ctx)
        self.ch, self.fd = completion_channel(v, self.ctx)
        self.cq = v["CQ"](self.ctx, 4096, None, self.ch, 0)
        self.access = self.e.IBV_ACCESS_LOCAL_WRITE | self.e.IBV_ACCESS_REMOTE_WRITE
        self.qp = make_qp(v, self.pd, self.cq, self.access, sq, rq)
        self.wakeups = 0
        self.armed = False

    def mr(self, arr):
        return self.v["MR"](self.pd, arr.nbytes, self.access, address=arr.ctypes.data)

    def idle(self) -> None:
        """A poll found nothing: arm the CQ (the caller polls once more: a completion may have come in between),
        or, armed, sleep on the completion channel until the CQ has one (traffic.rdma_cq's wait)."""
        if not self.armed:
            self.cq.req_notify()
            self.armed = True
        elif select.select([self.fd], [], [], 5.0)[0]:
            self.ch.get_cq_event(self.cq)
            self.cq.ack_events(1)
            self.armed = False
            self.wakeups += 1

    def post_recv(self, mr, i: int, nbytes: int) -> None:
        v = self.v
        self.qp.post_recv(v["RecvWR"](wr_id=i, num_sge=1, sg=[v["SGE"](mr.buf + i * nbytes, nbytes, mr.lkey)]))

    def send(self, mr, off: int, nbytes: int, wr_id: int, signaled: bool, opcode=None, imm: int = 0,
             remote: tuple | None = None) -> None:
        v, e = self.v, self.e
        flags = e.IBV_SEND_SIGNALED if signaled else 0
        wr = v["SendWR"](wr_id=wr_id, opcode=e.IBV_WR_SEND if opcode is None else opcode, num_sge=1,
                         sg=[v["SGE"](mr.buf + off, nbytes, mr.lkey)], send_flags=flags, imm_data=imm)
        if remote is not None:
            wr.set_wr_rdma(*remote)
        self.qp.post_send(wr)


def _pattern(size: int, m: int):
    import numpy as np

    return ((np.arange(size, dtype=np.uint32) + m * 7919) & 0xFF).astype(np.uint8)


def _client(end: _End, k: dict, size: int, iters: int, peer: dict, src, bounce) -> dict:
    """Post every piece of every message (credits and send-queue room permitting); time to the last completion."""
    e = end.e
    piece = k["piece"] or size
    plan = [(off, min(piece, size - off)) for off in range(0, size, piece)]
    total, w = iters * len(plan), k["window"]
    src_mr, b_mr = end.mr(src), end.mr(bounce) if k["copy"] else None
    ctl = __import__("numpy").zeros(16 * 16, dtype="uint8")
    ctl_mr = end.mr(ctl)
    for i in range(64 if k["credit_every"] else 0):
        end.post_recv(ctl_mr, i % 16, 16)
    credits, posted, done, sig_every = w, 0, 0, max(1, w // 2)
    t0 = time.monotonic()
    while done < total:
        while posted < total and posted - done < min(w if not k["credit_every"] else 256, 256) and (
                not k["credit_every"] or credits):
            m, j = divmod(posted, len(plan))
            off, n = plan[j]
            slot = posted % w if k["credit_every"] else 0
            remote = (peer["rkey"], peer["addr"] + (slot * piece if k["credit_every"] else off))
            mr, loff = src_mr, off
            if k["copy"]:
                bounce[slot * piece:slot * piece + n] = src[off:off + n]
                mr, loff = b_mr, slot * piece
            last = j == len(plan) - 1
            end.send(mr, loff, n, posted + 1, last or (posted + 1) % sig_every == 0 or posted + 1 == total,
                     e.IBV_WR_RDMA_WRITE_WITH_IMM if k["imm"] else e.IBV_WR_RDMA_WRITE, slot, remote)
            posted += 1
            credits -= 1 if k["credit_every"] else 0
        n, wcs = end.cq.poll(num_entries=32)
        for wc in wcs[:max(n, 0)]:
            if wc.status != 0:
                raise RuntimeError(f"client completion status {wc.status}")
            if wc.opcode == e.IBV_WC_RECV:
                credits += int.from_bytes(ctl[(wc.wr_id % 16) * 16:(wc.wr_id % 16) * 16 + 4].tobytes(), "little")
                end.post_recv(ctl_mr, wc.wr_id % 16, 16)
            else:
                done = max(done, wc.wr_id)
        if n <= 0:
            end.idle()
    return {"t0": t0, "t1": time.monotonic(), "wakeups": end.wakeups}


def _server(end: _End, k: dict, size: int, iters: int, ring, dst) -> dict:
    """With immediates: consume a completion per piece (copy, credit, verify as the step says); else nothing."""
    if not k["imm"]:
        return {"t1": 0.0}
    import numpy as np

    e = end.e
    piece = k["piece"] or size
    ppm = -(-size // piece)
    ring_mr = end.mr(ring)
    ctl = np.tile(np.frombuffer(int(k["credit_every"]).to_bytes(16, "little"), dtype=np.uint8), 16)
    ctl_mr, got, freed, bad = end.mr(ctl), 0, 0, 0  # every control slot says "credit_every slots free again"
    want = _pattern(size, 0) if k["verify"] else None  # what the client sends, made once (as the agent's expected)
    while got < iters * ppm:
        n, wcs = end.cq.poll(num_entries=32)
        for wc in wcs[:max(n, 0)]:
            if wc.status != 0:
                raise RuntimeError(f"server completion status {wc.status}")
            if wc.opcode != e.IBV_WC_RECV_RDMA_WITH_IMM:
                continue
            m, j = divmod(got, ppm)
            off = j * piece
            ln = min(piece, size - off)
            if k["copy"]:  # the client writes its slots in turn and RC delivers in order: the slot is got % window
                s0 = (got % k["window"]) * piece if k["credit_every"] else off
                dst[off:off + ln] = ring[s0:s0 + ln]
            got += 1
            end.post_recv(ring_mr, 0, 0)
            freed += 1
            if k["credit_every"] and freed >= k["credit_every"]:
                end.send(ctl_mr, (got % 16) * 16, 16, got, True)
                freed = 0
            if k["verify"] and j == ppm - 1 and not np.array_equal(dst, want):
                bad += 1
        if n <= 0:
            end.idle()
    return {"t1": time.monotonic(), "bad": bad}


def _child(role: str, ip: str, size: int, iters: int, k: dict) -> None:
    """One end: the handshake (benchmarks.verbs_pair.connect_end), run the step, print the result."""
    import numpy as np

    from benchmarks.verbs_pair import connect_end

    piece = k["piece"] or size
    end = _End(ip, 300, 300)
    buf = np.zeros(k["window"] * piece if k["credit_every"] else size, dtype=np.uint8)
    src = _pattern(size, 0) if role == "client" else np.zeros(size, dtype=np.uint8)
    mr = end.mr(buf)
    if role == "server":
        for _ in range(280 if k["imm"] else 0):
            end.post_recv(mr, 0, 0)
    peer = connect_end(end.v, end.ctx, end.gidx, end.qp, mr)
    if peer is None:
        return
    if role == "client":
        res = _client(end, k, size, iters, peer, src, buf)
    else:
        res = _server(end, k, size, iters, buf, src)
    print(json.dumps(res), flush=True)
    sys.stdin.readline()


def step_run(ns_srv: str, ip_srv: str, ns_cli: str, ip_cli: str, size: int, iters: int, step: str) -> dict:
    """One client/server pair running ``step`` (benchmarks.verbs_pair.run_pair): Gbit/s and the server's
    verification failures."""
    from benchmarks.verbs_pair import run_pair

    args = ["--size", str(size), "--iters", str(iters), "--step", step]
    cli, srv, _ = run_pair(str(Path(__file__).resolve()), ns_srv, ip_srv, ns_cli, ip_cli, args)
    secs = max(cli["t1"], srv["t1"]) - cli["t0"]
    return {"gbps": size * iters * 8 / secs / 1e9, "bad": srv.get("bad", 0), "wakeups": cli["wakeups"]}


def _round(k: int, a, hosts: tuple, rows: dict[str, list[float]]) -> None:
    import tempfile

    from benchmarks.rdma_vs_ib_write_bw import PROTOCOLS, agents, ib_write_bw

    (na, ia, da, ga), (nb, ib, db, gb) = hosts
    g, _ = ib_write_bw(nb, db, gb, na, da, ga, ib, a.size, a.iters, 18700 + k, 0)
    rows.setdefault("ib_write_bw", []).append(g)
    for s in a.steps:
        r = step_run(nb, ib, na, ia, a.size, a.iters, s)
        if r["bad"]:
            raise RuntimeError(f"step {s}: {r['bad']} messages did not verify")
        rows.setdefault(s, []).append(r["gbps"])
    for p in a.agents:
        with tempfile.TemporaryDirectory(prefix="tb-vst-") as tmp:
            rows.setdefault(f"agent-{p}", []).append(
                agents(na, ia, nb, ib, a.size, a.iters, Path(tmp), (da, db), PROTOCOLS[p])["goodput_gbps"])
    print(f"round {k}: " + ", ".join(f"{n} {v[-1]:.3f}" for n, v in rows.items()), file=sys.stderr, flush=True)


def report(rows: dict) -> None:
    from analysis.stats import estimate

    paired = lambda a, b: [x / y for x, y in zip(rows[a], rows[b])]  # noqa: E731 - same round: same load
    text = lambda pr: f"{estimate(pr).text('{:.2f}')} (rounds {', '.join(f'{x:.2f}' for x in pr)})"  # noqa: E731
    print(f"ib_write_bw (default depth) {estimate(rows['ib_write_bw']).text('{:.3f}')} Gbit/s")
    names = [n for n in rows if n != "ib_write_bw"]
    for name in names:
        print(f"  {name}: {estimate(rows[name]).text('{:.3f}')} Gbit/s; / ib_write_bw per round "
              f"{text(paired(name, 'ib_write_bw'))}")
        if PARENT.get(name) in rows:
            print(f"    / {PARENT[name]} per round {text(paired(name, PARENT[name]))}")
        if name.startswith("agent-") and name != names[-1] and names[-1].startswith("agent-"):
            print(f"    {names[-1]} / {name} per round {text(paired(names[-1], name))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", choices=("client", "server"), help=argparse.SUPPRESS)
    ap.add_argument("--ip", help=argparse.SUPPRESS)
    ap.add_argument("--step", default="whole", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="1M", help="message size")
    ap.add_argument("--iters", type=int, default=32, help="messages per measurement")
    ap.add_argument("--steps", default="whole,pieces,imm,credits,copy,verify", help=f"steps ({', '.join(STEPS)})")
    ap.add_argument("--agents", default="eager", help="the agent's protocols per round (may be empty)")
    ap.add_argument("--repeats", type=int, default=4, help="rounds")
    a = ap.parse_args()
    from benchmarks.rdma_vs_ib_write_bw import PROTOCOLS
    from traffic.job import parse_size

    a.size = parse_size(a.size) // 4 * 4
    if a.child:
        _child(a.child, a.ip, a.size, a.iters, {**_BASE, **STEPS[a.step]})
        return 0
    a.steps = [s for s in a.steps.split(",") if s]
    a.agents = [s for s in a.agents.split(",") if s]
    if set(a.steps) - set(STEPS) or set(a.agents) - set(PROTOCOLS) or a.iters < 1 or a.repeats < 1:
        ap.error("bad --steps/--agents/--iters/--repeats")
    from benchmarks.verbs_pair import rxe_pair
    from testbed.errors import require_root

    require_root("benchmarks/verbs_steps.py")
    rows: dict[str, list[float]] = {}
    with rxe_pair("s") as hosts:
        for k in range(a.repeats):
            _round(k, a, hosts, rows)
    report(rows)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
