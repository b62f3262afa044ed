"""Collective agents over loopback TCP in this namespace (no fabric, no root): every generated schedule family
completes with every rank's data verified; a corrupted schedule is caught; a dead agent fails the run quickly."""

from __future__ import annotations

import subprocess
import time

import pytest

from traffic import job as jobm
from traffic.collectives import make_schedule
from traffic.controller import ControlError, Controller, Member


def spawn(ns, argv, **kw):  # no namespaces here: every agent on 127.0.0.1
    return subprocess.Popen(argv, **kw)


def run_job(tmp_path, schedules: dict, ranks: int, iterations: int = 2, warmup: int = 0, compute_ms: float = 0.0,
            stragglers=(), factor=1.0, timeout_s=60.0, spawn=spawn, ip="127.0.0.1"):
    ops = tuple((k, k) for k in schedules)
    spec = jobm.JobSpec(ranks=ranks, segments=(jobm.Segment(ops, iterations),), compute_ms=compute_ms,
                        stragglers=tuple(stragglers), straggler_factor=factor, warmup=warmup, seed=5)
    job = {"ranks": ranks, "seed": 5, "verify": True, "timeout_s": timeout_s,
           "transport": {"kind": "tcp", "cc": "reno", "dscp": 0}, "plan": jobm.iteration_plan(spec)}
    members = [Member(r, f"h{r + 1}", "", ip) for r in range(ranks)]
    ctl = Controller(tmp_path, job, schedules, members, spawn, start_delay_s=0.1)
    try:
        ctl.start()
        return ctl.run(setup_timeout_s=60, run_timeout_s=timeout_s)
    finally:
        ctl.stop()


CASES = [
    ("allreduce", 4, 40_000, 1, {}),
    ("allreduce", 4, 40_000, 3, {}),
    ("allreduce", 5, 40_000, 2, {"algorithm": "tree"}),
    ("allreduce", 4, 40_000, 2, {"algorithm": "double_tree"}),
    ("allreduce", 6, 48_000, 2, {"algorithm": "halving_doubling"}),
    ("allgather", 4, 20_000, 2, {}),
    ("reducescatter", 3, 36_000, 2, {}),
    ("alltoall", 4, 40_000, 1, {}),
    ("alltoall", 4, 40_000, 1, {"skew": 1.0}),
    ("broadcast", 4, 40_000, 2, {}),
    ("broadcast", 4, 40_000, 2, {"algorithm": "ring"}),
    ("reduce", 4, 40_000, 1, {"root": 2}),
    ("gather", 4, 8_000, 2, {}),
    ("pipeline", 3, 8_000, 4, {}),
]


@pytest.mark.parametrize("coll,n,size,chunks,opts", CASES, ids=[f"{c[0]}-{c[4].get('algorithm', '')}{c[3]}"
                                                                 for c in CASES])
def test_collective_verifies(tmp_path, coll, n, size, chunks, opts):
    s = make_schedule(coll, n, size, chunks=chunks, seed=3, **opts)
    res = run_job(tmp_path, {"op": s}, n)
    assert res.verified, [r["mismatches"] for r in res.per_rank.values()]
    rows = res.ops
    assert len(rows) == 2 * n
    for it, name, k, c, rank, t0, t1, sent, recv, wait in rows:
        assert t1 >= t0 >= res.t_start - 1e-6
        assert sent == s.bytes_sent(rank) and recv == s.bytes_received(rank)
        assert 0 <= wait <= t1 - t0 + 0.06
    assert all(len(r["tcp_info"]) > 0 for r in res.per_rank.values())


def test_two_ops_per_iteration_and_warmup(tmp_path):
    a = make_schedule("allreduce", 3, 12_000, seed=1)
    b = make_schedule("allgather", 3, 4_000, seed=1)
    res = run_job(tmp_path, {"a": a, "b": b}, 3, iterations=3, warmup=1)
    assert res.verified
    rows = res.ops
    assert sorted({(r[0], r[2]) for r in rows}) == [(i, k) for i in range(3) for k in range(2)]
    assert res.t_measure > res.t_start


def test_straggler_delays_everyone(tmp_path):
    s = make_schedule("allreduce", 3, 3_000, seed=1)
    res = run_job(tmp_path, {"op": s}, 3, iterations=3, compute_ms=50, stragglers=[1], factor=4)
    rows = [dict(zip(["iteration", "op", "op_index", "collective", "rank", "start_s", "end_s", "bytes_sent",
                      "bytes_recv", "wait_s"], r)) for r in res.ops]
    import pandas as pd

    from analysis import metrics as am

    starts = jobm.iteration_starts(rows, res.t_measure_by_rank)
    ops = pd.DataFrame([{**r, "iter_start_s": starts[(r["rank"], r["iteration"])]} for r in rows])
    steps = am.step_times(ops)["step_s"].tolist()
    assert all(0.19 <= x <= 0.35 for x in steps), steps  # 4 x 50 ms compute + a tiny all-reduce
    # the fast ranks wait for the straggler inside the collective
    fast_wait = [r["wait_s"] for r in rows if r["rank"] != 1]
    assert sum(fast_wait) / len(fast_wait) > 0.1 and min(fast_wait) > 0.03, fast_wait  # ~0.15 s each


def test_wrong_result_is_reported(tmp_path):
    """A schedule that validates but computes the wrong thing (one reduce turned into a copy) is caught."""
    from traffic import schedule_json

    d = schedule_json.to_dict(make_schedule("allreduce", 3, 1_200, seed=1))
    for st in d["programs"][1]["steps"]:
        for rv in st["recvs"]:
            if rv.get("op") == "reduce":
                rv["op"] = "copy"
                break
        else:
            continue
        break
    s = schedule_json.from_dict(d)
    res = run_job(tmp_path, {"op": s}, 3, iterations=1)
    assert not res.verified
    assert any(r["mismatches"] for r in res.per_rank.values())
    assert any("elements differ" in m for r in res.per_rank.values() for m in r["mismatches"])


def test_dead_agent_fails_fast(tmp_path):
    s = make_schedule("allreduce", 3, 1_200, seed=1)
    spec = jobm.JobSpec(ranks=3, segments=(jobm.Segment((("op", "op"),), 1),))
    job = {"ranks": 3, "seed": 5, "verify": True, "timeout_s": 30,
           "transport": {"kind": "tcp", "cc": "reno"}, "plan": jobm.iteration_plan(spec)}
    members = [Member(r, f"h{r}", "", "127.0.0.1") for r in range(3)]

    def bad_spawn(ns, argv, **kw):
        if argv[argv.index("--rank") + 1] == "2":
            argv = [argv[0], "-c", "import sys; sys.exit(7)"]
        return subprocess.Popen(argv, **kw)

    ctl = Controller(tmp_path, job, {"op": s}, members, bad_spawn, start_delay_s=0.1)
    t = time.monotonic()
    try:
        ctl.start()
        with pytest.raises(ControlError, match="rank 2 exited with status 7"):
            ctl.run(setup_timeout_s=30, run_timeout_s=30)
    finally:
        ctl.stop()
    assert time.monotonic() - t < 15


@pytest.fixture
def lo_namespace():
    """A scratch namespace whose loopback also holds 10.77.0.1 (an address the initial namespace does not have)."""
    name = f"tb-forktest-{time.monotonic_ns() % 100000}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "-n", name, "addr", "add", "10.77.0.1/32", "dev", "lo"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name])


def test_forked_agents_run_in_their_namespace_and_verify(tmp_path, lo_namespace):
    """traffic.forkserver: agents forked from one interpreter, each inside the namespace it was given (they bind
    10.77.0.1, which exists only there), verify their data; a killed one reports -9; close() ends the server."""
    from testbed.kernel import netns
    from traffic.forkserver import ForkedProcess, ForkServer

    fs = ForkServer(netns.NETNS_DIR, netns.popen).start()
    procs = []

    def forked(ns, argv, **kw):
        procs.append(fs.popen(lo_namespace, argv, **kw))
        return procs[-1]

    try:
        res = run_job(tmp_path, {"op": make_schedule("allreduce", 3, 12_000, seed=1)}, 3, spawn=forked,
                      ip="10.77.0.1")
        assert res.verified
        assert len(procs) == 3 and all(isinstance(p, ForkedProcess) for p in procs)
        assert [p.wait(timeout=10) for p in procs] == [0, 0, 0]
        # anything but an agent goes to the fallback (a real Popen)
        other = fs.popen(lo_namespace, ["sleep", "30"], stdout=subprocess.DEVNULL)
        assert isinstance(other, subprocess.Popen)
        other.kill()
        other.wait()
        # a forked agent that is killed reports it like Popen does (this one waits on a controller that is silent)
        import socket

        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.bind(str(tmp_path / "silent.sock"))
        silent.listen(1)
        log = open(tmp_path / "stuck.log", "wb")
        stuck = fs.popen(lo_namespace, [fs.python, "-m", "traffic.agent", "--job", "job.json", "--rank", "0",
                                        "--ip", "10.77.0.1", "--control", str(tmp_path / "silent.sock")],
                         cwd=str(tmp_path), stdout=log, stderr=log)
        log.close()
        time.sleep(0.5)
        assert stuck.poll() is None
        stuck.kill()
        assert stuck.wait(timeout=10) == -9
        silent.close()
    finally:
        fs.close()
    assert fs.proc is None
