"""A collective's pieces across servers that are pure logic (docs/servers.md): the agents' control connection
forms (traffic.channel.connect), the files a far rank is sent (traffic.controller.job_files), the ranks' times put
on the reference clock (testbed.workloads.serverjobs), the refusals of a server agent's spawn before it starts
anything, and the go instant sent on each rank's own clock. The whole path over two servers' agents is
tests/host/test_server_fabric_host.py, and across two kernels tests/host/test_two_kernels_host.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import pytest

from analysis.clockoffset import ClockModel, Offset
from testbed.workloads import serverjobs
from testbed.commands.serverprocs import Processes
from testbed.kernel.state import RunState
from traffic.channel import Channel, connect
from traffic.collectives import make_schedule
from traffic.controller import Controller, Member, Results, job_files


def test_connect_takes_an_inherited_descriptor_a_tcp_address_or_a_path(tmp_path):
    a, b = socket.socketpair()
    s = connect(f"fd:{b.fileno()}")
    b.detach()
    Channel(s).send({"type": "hello"})
    assert json.loads(a.recv(100)) == {"type": "hello"}
    s.close()
    a.close()
    ls = socket.create_server(("127.0.0.1", 0))
    c = connect(f"tcp:127.0.0.1:{ls.getsockname()[1]}")
    ls.accept()[0].close()
    c.close()
    ls.close()
    for bad in ("tcp:nohost", "tcp::80", "fd:x"):
        with pytest.raises(ValueError):
            connect(bad)
    with pytest.raises(OSError):
        connect(str(tmp_path / "no.sock"), timeout_s=1)
    r = subprocess.run([sys.executable, "-m", "traffic.agent", "--job", str(tmp_path / "none.json"), "--rank", "0",
                        "--ip", "127.0.0.1", "--control", "tcp:x"], capture_output=True, text=True)
    assert r.returncode == 3 and "cannot load the job" in r.stderr   # the job is read first: one line, status 3


def _started(tmp_path, ranks=2):
    s = make_schedule("allreduce", ranks, 4_000, seed=1)
    job = {"ranks": ranks, "seed": 1, "verify": True, "transport": {"kind": "tcp"}, "plan": []}
    spawned = []

    def spawn(ns, argv, **kw):
        spawned.append((ns, argv, kw))
        return subprocess.Popen(["true"])
    ctl = Controller(tmp_path, job, {"op": s}, [Member(r, f"h{r}", f"ns{r}", "127.0.0.1") for r in range(ranks)],
                     spawn, listen=("127.0.0.1", 0), clock_offsets_s={1: -100.0})
    ctl.start()
    return ctl, spawned


def test_a_tcp_controller_gives_agents_its_address_and_far_ranks_their_files(tmp_path):
    ctl, spawned = _started(tmp_path)
    try:
        spec = spawned[0][1][spawned[0][1].index("--control") + 1]
        assert spec == f"tcp:127.0.0.1:{ctl.listener.getsockname()[1]}" and not (tmp_path / "ctl.sock").exists()
        files = job_files(tmp_path, "job.json", 1)
        assert set(files) == {"job.json", "ranks/schedule-op.rank1.json"}   # rank 1's share, not the whole schedule
        assert json.loads(files["job.json"])["rank_schedules"] == {"op": "ranks/schedule-op.rank{rank}.json"}
        # the go: one instant, on each rank's own clock (two stand-in agents speak the protocol)
        got = {}

        def rank(r: int) -> None:
            c = Channel(socket.create_connection(("127.0.0.1", ctl.listener.getsockname()[1])))
            c.send({"type": "hello", "rank": r, "addr": ["127.0.0.1", 1]})
            c.recv(10)
            c.send({"type": "ready", "rank": r})
            got[r] = c.recv(10)["t_start"]
            c.send({"type": "result", "rank": r, "ops": [], "tcp_info": [], "verified": True})
            c.recv(10)
            c.sock.close()
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        res = ctl.run(setup_timeout_s=10, run_timeout_s=10)
        for t in threads:
            t.join()
        assert got[0] == res.t_start and got[1] == res.t_start - 100.0
    finally:
        ctl.stop()
    assert ctl.listener is None


def _offset(offset_s, unc_s, at_s):
    return Offset(offset_s, unc_s, at_s, 2 * unc_s, 0.0, 100, 10, 0)


def test_far_ranks_times_are_put_on_the_reference_clock_with_their_bound():
    row = lambda rank, t0, t1: [0, "allreduce", 0, "allreduce", rank, t0, t1, 10, 10, 0.0]  # noqa: E731
    res = Results(1000.0, 999.0, 1010.0, {
        0: {"ops": [row(0, 1000.5, 1001.0)], "verified": True, "t_measure": 1000.0},
        1: {"ops": [row(1, 400.5, 401.2)], "verified": True, "t_measure": 400.0}})
    model = ClockModel(_offset(-600.0, 3e-4, 1000.0), _offset(-600.0 + 1e-3, 2e-4, 1100.0))   # 10 ppm drift
    out = serverjobs.on_reference(res, {0: None, 1: model})
    assert out.per_rank[0]["ops"] == res.per_rank[0]["ops"] and out.per_rank[0]["clock"]["reference"]
    t0, t1 = out.per_rank[1]["ops"][0][5:7]
    assert t0 == pytest.approx(1000.5 - 5e-6, abs=2e-6) and t1 == pytest.approx(1001.2 - 12e-6, abs=2e-6)
    assert out.per_rank[1]["t_measure"] == pytest.approx(1000.0, abs=1e-6)
    assert out.clock_uncertainty_s == 3e-4 and out.per_rank[1]["clock"]["drift_ppm"] == pytest.approx(10)
    assert res.per_rank[1]["ops"][0][5] == 400.5 and res.clock_uncertainty_s == 0.0   # the input is not changed
    passes = [{"s1": {"offset_s": 0.0, "uncertainty_s": 0.0, "reference": True},
               "s2": {**_offset(-600.0, 3e-4, t).as_dict(), "sent": 100, "delay_median_s": 1e-3}} for t in (1, 2)]
    models = serverjobs.clock_models(*passes)
    assert models["s1"] is None and models["s2"].uncertainty_s == 3e-4


def test_a_spawn_is_refused_before_anything_is_made(tmp_path, monkeypatch):
    monkeypatch.setattr("testbed.kernel.state.STATE_DIR", tmp_path)
    procs = Processes(RunState())
    with pytest.raises(ValueError, match="not one of the project's"):
        procs.spawn("netns0", ["true"])
    with pytest.raises(ValueError, match="not one of the project's"):
        procs.spawn("tb-zz99-none", ["true"])
    with pytest.raises(LookupError, match="no process 12345"):
        procs.poll(12345)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", ""])
def test_a_job_file_name_must_stay_in_its_folder(name):
    from testbed.commands.serverprocs import _safe_relative

    with pytest.raises(ValueError, match="must be relative"):
        _safe_relative(name)


class _Link:
    """An agent link's call, answering as a server agent's proc_poll would (the process ends at the third ask)."""

    class server:
        name = "s2"

    def __init__(self):
        self.asked = []

    def call(self, op, timeout_s=60, **kw):
        self.asked.append(op)
        return {"rc": 0 if len(self.asked) >= 3 else None, "log": "rank 1 done\n"} if op == "proc_poll" else {}


def test_a_remote_process_stands_in_for_popen(tmp_path, monkeypatch):
    monkeypatch.setattr(serverjobs, "POLL_EVERY_S", 0.0)
    link = _Link()
    with open(tmp_path / "agent-1.log", "wb") as log:
        p = serverjobs.RemoteProcess(link, 4242, log)
    assert p.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=0)
    assert p.wait(timeout=5) == 0 and p.returncode == 0
    assert (tmp_path / "agent-1.log").read_text() == "rank 1 done\n"
    p.kill()                                   # ended: nothing is asked
    assert link.asked == ["proc_poll"] * 3
