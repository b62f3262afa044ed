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
            c.send({"type": "hello", "rank": r, "addr": ["127.0.0.1", 1], "token": ctl.token})
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


def test_a_hello_takes_a_place_only_with_the_token_for_a_free_rank_of_the_job():
    from traffic.ctlgate import verdict

    hello = {"type": "hello", "rank": 1, "addr": ["127.0.0.1", 1], "token": "s3cret"}
    assert verdict(hello, "s3cret", {0, 1}, set()) is None
    assert verdict(dict(hello, token="guess"), "s3cret", {0, 1}, set()) == "wrong or missing token"
    assert verdict({k: v for k, v in hello.items() if k != "token"}, "s3cret", {0, 1}, set()) == \
        "wrong or missing token"
    assert verdict(dict(hello, token=7), "s3cret", {0, 1}, set()) == "wrong or missing token"
    assert verdict(dict(hello, rank=5), "s3cret", {0, 1}, set()) == "unknown rank 5"
    assert verdict(dict(hello, rank=True), "s3cret", {0, 1}, set()) == "unknown rank True"
    assert verdict(hello, "s3cret", {0, 1}, {1}) == "rank 1 is connected already"
    assert verdict(dict(hello, type="ready"), "s3cret", {0, 1}, set()) == "its first message is not a hello"
    assert verdict([1], "s3cret", {0, 1}, set()) == "its first message is not a hello"
    assert verdict({k: v for k, v in hello.items() if k != "token"}, None, {0, 1}, set()) is None   # AF_UNIX


def _closed(sock: socket.socket, within_s: float = 10.0) -> bool:
    """True once the far end closed ``sock`` (end of input), False if it stays open ``within_s``."""
    sock.settimeout(within_s)
    try:
        return sock.recv(100) == b""
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def test_strays_wrong_tokens_and_a_duplicate_rank_are_closed_and_the_real_ranks_run(tmp_path):
    """A TCP controller's port is reachable by anything on the servers' network: connections that are not a rank of
    this run with its token are closed one by one, and the job runs with the real ranks that come after them."""
    ctl, spawned = _started(tmp_path)
    port = ctl.listener.getsockname()[1]
    token = json.loads((tmp_path / "job.json").read_text())["control_token"]
    assert token == ctl.token and len(token) == 32 and (tmp_path / "job.json").stat().st_mode & 0o077 == 0
    assert all(token not in " ".join(argv) for _, argv, _ in spawned)          # not in argv: ps shows argv
    hello = {"type": "hello", "addr": ["127.0.0.1", 1], "token": token}
    ranks, silent, out = {}, socket.create_connection(("127.0.0.1", port)), {}
    idle: list[socket.socket] = []

    def drive() -> None:
        try:
            for _ in range(4 * 2 + 16):    # a flood of connections that never speak, as many as the gate keeps
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            for stray in (dict(hello, rank=0, token="0" * 32), {k: v for k, v in hello.items() if k != "token"},
                          b"GET / HTTP/1.0\r\n\r\n", dict(hello, rank=7), dict(hello, rank=0, token="\ud800"),
                          b"[" * 60_000 + b"\n"):
                c = socket.create_connection(("127.0.0.1", port))
                line = stray if isinstance(stray, bytes) else json.dumps(dict({"rank": 1}, **stray)).encode() + b"\n"
                c.sendall(line)
                out.setdefault("strays_closed", []).append(_closed(c))
                c.close()
            for r in (0, 1):
                ranks[r] = Channel(socket.create_connection(("127.0.0.1", port)))
                ranks[r].send(dict(hello, rank=r))
                while r == 0 and 0 not in (ctl.gate.hellos if ctl.gate else {}):
                    threading.Event().wait(0.01)
                if r == 0:     # a second connection for rank 0, with the token (a copy of the rank): refused
                    dup = socket.create_connection(("127.0.0.1", port))
                    dup.sendall(json.dumps(dict(hello, rank=0)).encode() + b"\n")
                    out["duplicate_closed"] = _closed(dup)
            for step in ("peers", "go", "bye"):
                for r in (0, 1):
                    out[f"{step}{r}"] = ranks[r].recv(10)
                    if step != "bye":
                        ranks[r].send({"type": "ready", "rank": r} if step == "peers" else
                                      {"type": "result", "rank": r, "ops": [], "tcp_info": [], "verified": True})
        except Exception as e:  # noqa: BLE001 - the test reads it
            out["error"] = repr(e)
    t = threading.Thread(target=drive)
    t.start()
    try:
        res = ctl.run(setup_timeout_s=30, run_timeout_s=10)
    finally:
        t.join(30)
        ctl.stop()
    assert "error" not in out, out
    assert out["strays_closed"] == [True] * 6 and out["duplicate_closed"], out
    flood = "too many connections waiting for a hello"
    assert [r for r in ctl.rejected if r != flood] == [
        "wrong or missing token", "wrong or missing token", "its first line is not JSON", "unknown rank 7",
        "wrong or missing token", "its first line is not JSON", "rank 0 is connected already"], ctl.rejected
    assert ctl.rejected.count(flood) >= 1, ctl.rejected      # the oldest idle ones made room for the ranks
    assert set(out["peers0"]["addrs"]) == {"0", "1"} and res.verified and set(res.per_rank) == {0, 1}
    assert _closed(silent, 5)      # a connection that never spoke is closed once the ranks are in
    silent.close()
    for c in idle:
        c.close()
    for c in ranks.values():
        c.sock.close()



def test_a_set_up_that_fails_names_the_connections_it_refused(tmp_path):
    """A rank that ends before it joined (e.g. refused for a token it was not given) fails the run, and the error
    says what was refused."""
    from traffic.controller import ControlError

    def spawn(ns, argv, **kw):
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.4); raise SystemExit(3)"])
    ctl = Controller(tmp_path, {"ranks": 2, "seed": 1, "transport": {"kind": "tcp"}, "plan": []},
                     {"op": make_schedule("allreduce", 2, 4_000, seed=1)},
                     [Member(r, f"h{r}", f"ns{r}", "127.0.0.1") for r in range(2)], spawn, listen=("127.0.0.1", 0))
    try:
        ctl.start()
        stray = socket.create_connection(("127.0.0.1", ctl.listener.getsockname()[1]))
        stray.sendall(b'{"type": "hello", "rank": 0}\n')
        with pytest.raises(ControlError, match=r"^rank [01] exited with status 3: .*\(connections refused: wrong "
                           r"or missing token\)$"):
            ctl.run(setup_timeout_s=10)
        stray.close()
    finally:
        ctl.stop()

def test_clean_takes_the_job_folders_of_runs_not_live_and_nothing_else(tmp_path):
    """A server agent's job folders (tb-<run>-job-*) that a SIGKILLed agent left: the ones its saved state records and
    ones no state records; never a live run's, a link, a file, or a path a state names outside that pattern."""
    from testbed.commands.clean import job_folders

    tmp, elsewhere = tmp_path / "tmp", tmp_path / "elsewhere"
    tmp.mkdir()
    elsewhere.mkdir()
    made = {}
    for key, parent, name in (("recorded", elsewhere, "tb-ab12-job-x1y2z3w4"), ("orphan", tmp, "tb-cd34-job-aaaa1111"),
                              ("live", tmp, "tb-ef56-job-bbbb2222"), ("other_run", elsewhere, "tb-zz99-job-cccc3333"),
                              ("plain", tmp, "tb-ab12-notajob"), ("victim", elsewhere, "data")):
        made[key] = parent / name
        made[key].mkdir()
    (tmp / "tb-ab12-job-link0000").symlink_to(made["victim"])
    (tmp / "tb-ab12-job-file0000").write_text("x")
    states = [{"run_id": "ab12", "pid": 1, "folders": [str(made["recorded"]), str(made["other_run"]),
                                                       str(made["victim"]), "relative/tb-ab12-job-zzzz9999"]},
              {"run_id": "ef56", "pid": 2, "folders": [str(made["live"])]},
              {"run_id": "old0", "pid": 3}]                       # a state written before folders were recorded
    got = job_folders(states, live_runs={"ef56"}, tmpdir=str(tmp))
    assert got == sorted([str(made["recorded"]), str(made["orphan"])])
    assert str(made["live"]) in job_folders(states, live_runs=set(), tmpdir=str(tmp))


class _SlowLink(_Link):
    """proc_poll that times out ``slow`` times (the agent busy), then answers; or fails with ``error`` for good."""

    def __init__(self, slow: int = 0, error: Exception | None = None):
        super().__init__()
        self.slow, self.error = slow, error

    def call(self, op, timeout_s=60, **kw):
        from testbed.network.serverlink import AgentTimeout

        self.asked.append(op)
        if self.error is not None:
            raise self.error
        if len(self.asked) <= self.slow:
            raise AgentTimeout(f"s2: no answer to {op} within {timeout_s:.0f} s")
        return {"rc": 0, "log": "rank 1 done\n"}


def test_a_rank_whose_agent_is_slow_is_asked_again_and_one_whose_agent_is_gone_has_ended(tmp_path, monkeypatch):
    from testbed.network.serverlink import AgentError, AgentGone, AgentTimeout

    monkeypatch.setattr(serverjobs, "POLL_EVERY_S", 0.0)
    assert serverjobs.poll_outcome(AgentTimeout("s2: no answer")) is None
    assert serverjobs.poll_outcome(AgentGone("s2: the agent is gone (status 1)")) == serverjobs.AGENT_GONE
    assert serverjobs.poll_outcome(AgentError("s2: proc_poll: LookupError: no process 4")) == serverjobs.AGENT_GONE
    with open(tmp_path / "agent-1.log", "wb") as log:
        slow = serverjobs.RemoteProcess(_SlowLink(slow=2), 4242, log)
    assert slow.poll() is None and slow.poll() is None and "no answer" in slow.last_error
    assert slow.poll() == 0 and (tmp_path / "agent-1.log").read_text() == "rank 1 done\n"
    gone = serverjobs.RemoteProcess(_SlowLink(error=AgentGone("s2: the agent is gone (status -9)")), 4243)
    assert gone.poll() == serverjobs.AGENT_GONE == gone.wait(timeout=1)
