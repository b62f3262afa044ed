"""One collective agent: one process per participating host, started inside the host's network namespace.

    python -m traffic.agent --job RUNDIR/job.json --rank R --ip 198.18.1.1 --control RUNDIR/ctl.sock

Control plane (JSON lines over a path-based AF_UNIX socket in the run directory: it works across network
namespaces and puts no packet on the emulated network; across servers, ``--control fd:N``, a TCP connection over
the servers' own network that the server's agent opened and handed down: traffic.channel.connect), agent <->
controller:

    A: hello {rank, addr[, token]} C: peers {addrs: {rank: addr}}     (data connections opened here, untimed;
                                                                        token: the job file's control_token)
    A: ready {rank, cc}            C: go {t_start}                     (every agent starts at one monotonic instant,
                                                                        t_start on this machine's clock)
    A: result {rank, ops, tcp_info, verified, mismatches, ...}         C: bye

Data plane: a traffic.transport.Transport (kernel TCP: traffic.tcp; RDMA: traffic.rdma; UET over UDP:
traffic.uet). For each iteration of the job plan
(traffic.job): sleep the compute time, then walk this rank's DAG of every op: a step starts when its deps are
complete; its local copy/reduce ops run on real numpy buffers, then its sends and receives are posted at once
(receives with ``reduce`` land in a staging buffer and are summed in on arrival). After each op the output is
compared with ``expected_output`` of inputs generated from (seed, op) by ``random_inputs`` -- after every warm-up
op and, once the job is over, the last execution of every op (never between measured ops: comparing megabytes
there would delay this rank's next op and show up as network time) -- a mismatch makes ``verified`` false and the
exit status 1. Exit status 3: any other failure (the message is on stderr and in the
result).

Measured per (iteration, op): start/end (time.monotonic(), one clock for every process of the machine), payload
bytes sent/received, wait_s (time blocked in the transport while a receive of this op was outstanding) and, per
connection, TCP_INFO at the op's start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from traffic import schedule_json
from traffic.channel import AgentError, Channel, connect
from traffic.rdma import RdmaTransport
from traffic.schedule import Schedule, expected_output, random_input
from traffic.tcp import TcpTransport
from traffic.transport import Transport, TransportError
from traffic.uet import UetTransport

EXIT_MISMATCH = 1
EXIT_ERROR = 3
CONTROL_CHECK_S = 0.2


class OpState:
    """Buffers, inputs and the expected result of one schedule on this rank (allocated once, reused)."""

    def __init__(self, key: str, schedule: Schedule, rank: int, seed: int, verify: bool):
        self.key = key
        self.s = schedule
        self.rank = rank
        prog = schedule.programs[rank]
        dt = np.dtype(schedule.dtype)
        self.isz = dt.itemsize
        self.bufs = {name: (random_input(schedule, seed, rank) if name == "input" else np.zeros(size, dtype=dt))
                     for name, size in prog.buffers}
        self.u8 = {name: a.view(np.uint8) for name, a in self.bufs.items()}
        self.expected = expected_output(schedule, seed, rank) if verify else None
        self.steps = prog.steps
        self.children: list[list[int]] = [[] for _ in self.steps]
        for i, st in enumerate(self.steps):
            for d in st.deps:
                self.children[d].append(i)
        self.staging: dict[tuple[int, int], np.ndarray] = {}
        for i, st in enumerate(self.steps):
            for j, rv in enumerate(st.recvs):
                if rv.op == "reduce":
                    self.staging[(i, j)] = np.empty(rv.dst.count, dtype=dt)
        self.bytes_sent = schedule.bytes_sent(rank)
        self.bytes_recv = schedule.bytes_received(rank)
        self.peers = sorted({op.peer for st in self.steps for op in (*st.sends, *st.recvs)})

    def view(self, region) -> np.ndarray:
        return self.bufs[region.buffer][region.offset:region.offset + region.count]

    def bytes_view(self, region) -> memoryview:
        a = region.offset * self.isz
        return memoryview(self.u8[region.buffer][a:a + region.count * self.isz])

    def reset(self) -> None:
        for name, a in self.bufs.items():
            if name != "input":
                a.fill(0)

    def check(self) -> tuple[bool, str]:
        if self.expected is None:
            return True, ""
        out = self.bufs["output"]
        if out.shape == self.expected.shape and np.array_equal(out, self.expected):
            return True, ""
        if out.shape != self.expected.shape:
            return False, f"rank {self.rank}: output has {out.size} elements, expected {self.expected.size}"
        bad = int(np.count_nonzero(out != self.expected))
        first = int(np.flatnonzero(out != self.expected)[0])
        return False, (f"rank {self.rank}: {bad} of {out.size} elements differ (first at {first}: got "
                       f"{out[first].item()!r}, expected {self.expected[first].item()!r})")


def _begin(t: Transport, op: OpState, i: int, hi: int, outstanding: list[int], finished: list[int]) -> None:
    """Start step ``i``: its local copy/reduce ops, then post its receives (a ``reduce`` receive lands in its staging
    buffer) and sends at once, on wire tags ``hi | tag``."""
    st = op.steps[i]
    for lo in st.local:
        dst = op.view(lo.dst)
        if lo.op == "copy":
            dst[...] = op.view(lo.src)
        else:
            np.add(dst, op.view(lo.src), out=dst)
    outstanding[i] = len(st.sends) + len(st.recvs)
    for j, rv in enumerate(st.recvs):
        if rv.op == "reduce":
            buf = memoryview(op.staging[(i, j)].view(np.uint8))
        else:
            buf = op.bytes_view(rv.dst)
        t.post_recv(rv.peer, hi | rv.tag, buf, context=(i, j))
    for sd in st.sends:
        t.post_send(sd.peer, hi | sd.tag, op.bytes_view(sd.src), context=(i, -1))
    if outstanding[i] == 0:
        finished.append(i)


def _transferred(op: OpState, context: tuple[int, int], outstanding: list[int], finished: list[int]) -> None:
    """One send or receive of step ``i`` completed (``j`` >= 0: its j-th receive, summed in from staging if it
    reduces); the step is finished when none is outstanding."""
    i, j = context
    if j >= 0:
        rv = op.steps[i].recvs[j]
        if rv.op == "reduce":
            dst = op.view(rv.dst)
            np.add(dst, op.staging[(i, j)], out=dst)
    outstanding[i] -= 1
    if outstanding[i] == 0:
        finished.append(i)


def run_op(t: Transport, op: OpState, deadline: float, chan: Channel | None,
           seq: int = 0) -> tuple[float, float, float]:
    """Walk the rank's DAG of one op to completion; return (start, end, wait_s). ``seq`` numbers the op
    executions of the job (the same on every rank): schedule tags repeat in every op, so the wire tag is
    seq << 32 | tag."""
    op.reset()
    hi = seq << 32
    n = len(op.steps)
    waiting = [len(st.deps) for st in op.steps]
    outstanding = [0] * n
    done = 0
    finished: list[int] = []
    wait0 = t.blocked_recv_s
    start = time.monotonic()
    for i in range(n):
        if waiting[i] == 0:
            _begin(t, op, i, hi, outstanding, finished)
    next_check = start + CONTROL_CHECK_S
    while done < n:
        while finished:
            i = finished.pop()
            done += 1
            for c in op.children[i]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    _begin(t, op, c, hi, outstanding, finished)
        if done == n:
            break
        for req in t.progress(0.05):
            _transferred(op, req.context, outstanding, finished)
        now = time.monotonic()
        if now > deadline:
            raise AgentError(f"op {op.key} not complete by the deadline ({done} of {n} steps done)")
        if chan is not None and now > next_check:
            chan.check()
            next_check = now + CONTROL_CHECK_S
    return start, time.monotonic(), t.blocked_recv_s - wait0


def sleep_until(t_end: float, chan: Channel | None) -> None:
    while True:
        left = t_end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, CONTROL_CHECK_S))
        if chan is not None and left > CONTROL_CHECK_S:
            chan.check()


def load_job(path: Path, rank: int | None = None) -> tuple[dict, dict[str, Schedule]]:
    """The job and its schedules (``rank``: only what that rank runs, see traffic.schedule_json.from_dict)."""
    job = json.loads(path.read_text())
    if job.get("format") != "testbed-collective-job":
        raise AgentError(f"{path}: not a testbed-collective-job file")
    own = job.get("rank_schedules", {}) if rank is not None else {}
    scheds = {}
    for k, f in job["schedules"].items():
        mine = path.parent / own[k].format(rank=rank) if k in own else None
        # the per-rank files go when the controller stops; an agent started later reads the whole schedule
        scheds[k] = schedule_json.load(mine if mine is not None and mine.exists() else path.parent / f, for_rank=rank)
    return job, scheds


def make_transport(kind: str, rank: int, **opts) -> Transport:
    """'tcp' -> traffic.tcp.TcpTransport(rank, **opts); 'rdma' -> traffic.rdma.RdmaTransport(rank, **opts);
    'uet' -> traffic.uet.UetTransport(rank, **opts)."""
    if kind == "tcp":
        return TcpTransport(rank, **opts)
    if kind == "rdma":
        return RdmaTransport(rank, **opts)
    if kind == "uet":
        return UetTransport(rank, **opts)
    raise ValueError(f"unknown transport {kind!r} (known: tcp, rdma, uet)")


def _transport(tr: dict, rank: int, ip: str) -> Transport:
    """The job's transport for this rank, with its congestion control (a host that behaves differently has its own)
    and the RDMA-only or UET-only options (traffic.rdma.RdmaTransport, traffic.uet.UetTransport)."""
    cc = tr.get("cc_by_rank", {}).get(str(rank), tr.get("cc"))
    return make_transport(tr.get("kind", "tcp"), rank, ip=ip, cc=cc, dscp=int(tr.get("dscp", 0)),
                          sndbuf=int(tr.get("sndbuf", 0)), rcvbuf=int(tr.get("rcvbuf", 0)), **tr.get("rdma", {}),
                          **tr.get("uet", {}))


def _join(t: Transport, chan: Channel, job: dict, scheds: dict[str, Schedule], rank: int,
          timeout: float) -> tuple[dict[str, OpState], float]:
    """The untimed start: hello with our listen address, the peers' addresses, the data connections, ready; then
    the go. Returns this rank's op states and the instant every agent starts at."""
    addr = t.listen()
    hello = {"type": "hello", "rank": rank, "addr": addr, "pid": os.getpid()}
    if job.get("control_token"):   # the run's secret (a TCP controller admits no hello without it)
        hello["token"] = job["control_token"]
    chan.send(hello)
    msg = chan.recv(timeout)
    seed = int(job["seed"])
    states = {k: OpState(k, s, rank, seed + 7919 * i, bool(job.get("verify", True)))
              for i, (k, s) in enumerate(sorted(scheds.items()))}
    peers = sorted({p for st in states.values() for p in st.peers})
    addrs = {int(k): v for k, v in msg["addrs"].items()}
    t.connect({p: addrs[p] for p in peers}, timeout_s=timeout)
    chan.send({"type": "ready", "rank": rank, **t.describe()})
    go = chan.recv(timeout)
    return states, float(go["t_start"])


def _verify(result: dict, st: OpState, where: str) -> None:
    ok, why = st.check()
    if not ok:
        result["verified"] = False
        if len(result["mismatches"]) < 20:
            result["mismatches"].append(f"{where}: {why}")


def _announce(t: Transport, states: dict[str, OpState], order: list[str], announced: int, upto: int) -> int:
    """RDMA receive look-ahead (traffic.rdma_staging): hand the transport the receives of ops ``announced`` ..
    ``upto`` - 1 of the plan (wire tags seq << 32 | tag) so it grants them before the op runs; the new mark."""
    upto = min(upto, len(order))
    for s in range(announced, upto):
        op = states[order[s]]
        for st in op.steps:
            for rv in st.recvs:
                t.post_ahead(rv.peer, (s << 32) | rv.tag, rv.dst.count * op.isz)
    return max(announced, upto)


def _run_plan(t: Transport, chan: Channel, job: dict, states: dict[str, OpState], rank: int, deadline: float,
              result: dict) -> None:
    """Every iteration of the job's plan: its compute time, then each op walked to completion. Measured iterations
    fill ``result``'s ops and tcp_info rows; warm-up ones are verified at once (and move ``t_measure``), the last
    execution of every op once the plan is over."""
    rows = result["ops"]
    info_rows = result["tcp_info"]
    seq = 0
    last: dict[str, str] = {}
    report = bool(job.get("report_iterations")) and rank == 0
    ahead = int(getattr(t, "lookahead", 0))  # RDMA grant protocol: ops whose receives are granted ahead
    order = [key for it in job["plan"] for _name, key, *_gap in it["ops"]]
    announced = 1  # the first op posts its own receives
    for it in job["plan"]:
        iteration, record = it["iteration"], it["record"]
        if report:  # the lab's fault timeline may start faults at an iteration
            chan.send({"type": "iteration", "rank": rank, "iteration": iteration})
        c_s = float(it["compute_s"][rank])
        if c_s > 0:
            sleep_until(time.monotonic() + c_s, chan)
        for k, (name, key, *gap) in enumerate(it["ops"]):
            if gap and gap[0] > 0:  # an imported trace's compute between the previous op and this one
                sleep_until(time.monotonic() + gap[0] / 1000.0, chan)
            st = states[key]
            if ahead and seq + ahead + 1 - announced >= max(1, ahead // 2):  # half a window at a time: their
                announced = _announce(t, states, order, announced, seq + ahead + 1)  # grants share one message
            before = t.conn_info() if record else {}
            t0, t1, wait = run_op(t, st, deadline, chan, seq)
            seq += 1
            if record:
                after = t.conn_info()
                for phase, d in (("start", before), ("end", after)):
                    for peer, info in sorted(d.items()):
                        info_rows.append([iteration, k, rank, peer, phase, info])
                rows.append([iteration, name, k, st.s.collective, rank, round(t0, 6), round(t1, 6),
                             st.bytes_sent, st.bytes_recv, round(wait, 6)])
            if not record:
                result["t_measure"] = t1
                _verify(result, st, f"warm-up iteration {iteration} op {name}")
            else:
                last[key] = f"iteration {iteration} op {name}"
    for key, where in last.items():  # outside the timed region: the last execution of every schedule
        _verify(result, states[key], where)


def run_agent(job: dict, scheds: dict[str, Schedule], rank: int, ip: str, chan: Channel) -> int:
    timeout = float(job.get("timeout_s", 300))
    deadline = time.monotonic() + timeout
    t = _transport(job["transport"], rank, ip)
    result: dict = {"type": "result", "rank": rank, "ops": [], "tcp_info": [], "verified": True, "mismatches": [],
                    "error": None}
    try:
        states, t_start = _join(t, chan, job, scheds, rank, timeout)
        sleep_until(t_start, chan)
        result["t_measure"] = t_start  # end of the last warm-up iteration on this rank: step-time origin
        _run_plan(t, chan, job, states, rank, deadline, result)
        drain = getattr(t, "drain", None)  # RDMA: sends done from a copy may still have pieces to write
        if drain is not None:
            drain(max(1.0, deadline - time.monotonic()))
        result["transport"] = t.describe()
        tm = os.times()
        result["cpu_s"] = tm.user + tm.system
        result["bytes_out"] = getattr(t, "bytes_out", None)
        result["bytes_in"] = getattr(t, "bytes_in", None)
        chan.send(result)
        try:
            chan.recv(30)  # bye: peers may still be reading what we sent; close only when everyone is done
        except AgentError:
            pass
        return 0 if result["verified"] else EXIT_MISMATCH
    except (AgentError, TransportError, OSError, ValueError, KeyError) as e:
        msg = str(e) if str(e).startswith("rank ") else f"rank {rank}: {e}"
        print(f"traffic.agent: {msg}", file=sys.stderr)
        result["error"] = msg
        try:
            chan.send(result)
        except OSError:
            pass
        return EXIT_ERROR
    finally:
        t.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traffic.agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", required=True, help="job.json written by the controller")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--ip", required=True, help="this host's data-plane address")
    ap.add_argument("--control", required=True,
                    help="the controller: its AF_UNIX socket's path, tcp:HOST:PORT, or fd:N (an inherited socket)")
    a = ap.parse_args(argv)
    try:
        job, scheds = load_job(Path(a.job), a.rank)
    except Exception as e:  # noqa: BLE001 - one line, then the controller sees the exit status
        print(f"traffic.agent: rank {a.rank}: cannot load the job: {e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        cs = connect(a.control)
    except (OSError, ValueError) as e:
        print(f"traffic.agent: rank {a.rank}: control socket {a.control}: {e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        return run_agent(job, scheds, a.rank, a.ip, Channel(cs))
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return EXIT_ERROR
    finally:
        cs.close()


if __name__ == "__main__":
    sys.exit(main())
