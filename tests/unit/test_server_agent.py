"""The server agent's JSON-lines protocol, its local link, ssh's command line, the run's sshd material and
`testbed servers check`'s bad input (docs/servers.md). The agent over ssh into the lab VM is
tests/host/test_two_kernels_host.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest

from testbed import cli
from testbed.commands import serveragent, servers
from testbed.network.serverlink import AgentError, AgentGone, AgentLink, AgentTimeout, call_each, ssh_argv
from testbed.network.serverlink import agent_command as serveragent_command
from testbed.network.serversfile import parse
from testbed.vm import sshd


def test_handle_answers_errors_as_one_line_replies():
    agent = serveragent.Agent()
    assert serveragent.handle(agent, "{not json")["ok"] is False
    r = serveragent.handle(agent, json.dumps({"id": 7, "op": "format_disk"}))
    assert r["id"] == 7 and not r["ok"] and "unknown op 'format_disk'" in r["error"]
    r = serveragent.handle(agent, json.dumps({"id": 8, "op": "run", "args": {"argv": ["true"], "ns": "netns0"}}))
    assert not r["ok"] and "not the project's" in r["error"]
    r = serveragent.handle(agent, json.dumps({"id": 9, "op": "ping", "args": {"bogus": 1}}))
    assert not r["ok"] and r["error"].startswith("TypeError")
    req = {"id": 10, "op": "run", "args": {"argv": ["sh", "-c", "echo hi; exit 3"]}}
    r = serveragent.handle(agent, json.dumps(req))
    assert r["ok"] and r["result"]["rc"] == 3 and r["result"]["stdout"] == "hi\n"


def test_serve_replies_line_by_line_and_stops_at_quit():
    lines = [{"id": 1, "op": "ping"}, {"id": 2, "op": "version"}, {"id": 3, "op": "quit"}, {"id": 4, "op": "ping"}]
    out = io.StringIO()
    assert serveragent.serve(io.StringIO("".join(json.dumps(x) + "\n" for x in lines)), out) == 0
    replies = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["id"] for r in replies] == [1, 2, 3]            # nothing answered after quit
    assert replies[0]["result"]["pid"] == os.getpid()
    assert replies[1]["result"]["kernel"] == os.uname().release and replies[1]["result"]["package"]
    assert replies[2]["result"] == "bye"


def test_local_link_is_a_subprocess_speaking_the_same_protocol():
    server = parse("s1 localhost")[0]
    with AgentLink.start(server) as link:
        pid = link.call("ping")["pid"]
        assert pid == link.proc.pid != os.getpid()
        assert link.call("run", argv=["echo", "x"])["stdout"] == "x\n"
        lo = link.call("nic", address="127.0.0.1")
        assert lo["ifname"] == "lo" and set(lo["gro"]) >= {"rx-gro"}   # the kernel's GRO features, read
        absent = link.call("nic", address="192.0.2.77")
        assert absent["ifname"] is None and "127.0.0.1/8 on lo" in absent["others"]
        with pytest.raises(AgentError, match="nic: LookupError: no namespace tb-zz99-nothere"):
            link.call("nic", address="127.0.0.1", ns="tb-zz99-nothere")
    assert link.proc.returncode == 0                          # quit answered, the agent ended by itself
    with pytest.raises(AgentGone, match="gone"):
        link.call("ping")


def test_agent_ends_and_tears_down_at_end_of_input():
    server = parse("s1 localhost")[0]
    link = AgentLink.start(server)
    link.call("ping")
    link.proc.stdin.close()                                   # the ssh session closing
    assert link.proc.wait(timeout=20) == 0
    link.close()


def test_a_silent_lab_loses_its_lease_and_the_agent_tears_down():
    """The link goes silent without closing (no EOF, no SIGHUP): no request for lease_s while idle, and the agent
    ends by itself with status 1, saying why; a link that renews its lease keeps the agent past several leases."""
    server = parse("s1 localhost")[0]
    link = AgentLink(server, serveragent_command(lease_s=1.0))  # no heartbeat: the lab gone silent
    try:
        t0 = time.monotonic()
        link.call("ping")
        assert link.proc.wait(timeout=15) == 1
        assert 1.0 <= time.monotonic() - t0 < 10
        link._stderr.seek(0)
        assert "lease ran out" in link._stderr.read().decode()
    finally:
        link.close()
    with AgentLink(server, serveragent_command(lease_s=2.0), heartbeat_s=0.4) as beating:
        time.sleep(5.0)                                       # two and a half leases, renewed
        assert beating.proc.poll() is None and beating.call("ping")["pid"] == beating.proc.pid
        beating.stop_heartbeat()
        assert beating.proc.wait(timeout=15) == 1             # ... until the renewals stop
    with AgentLink.start(server) as started:                 # what a run's links ask for
        assert started.argv[-2:] == ["--lease-s", "30"]


def test_a_call_that_times_out_does_not_end_the_renewals():
    """A slow agent (a call that timed out while the agent still works on it) is not a gone one: the heartbeat goes
    on, and the lease of a live lab does not run out."""
    server = parse("s1 localhost")[0]
    with AgentLink(server, serveragent_command(lease_s=2.0), heartbeat_s=0.4) as link:
        with pytest.raises(AgentError, match="no answer"):
            link.call("run", timeout_s=0.5, argv=["sleep", "7"])
        # the agent sleeps 7 s: the first ping's 5 s wait runs out too (before: the heartbeat ended there), then the
        # agent answers the pings queued behind the sleep and idles more than a lease, renewed
        time.sleep(10.0)
        assert link.proc.poll() is None and link.call("ping")["pid"] == link.proc.pid


def test_agent_refuses_a_bad_lease_in_one_line():
    r = subprocess.run(serveragent_command(lease_s=None) + ["--lease-s", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--lease-s must be > 0" in r.stderr


def test_ssh_argv_is_batch_mode_with_the_servers_key_and_known_hosts_beside_it():
    s = parse("s1 localhost\ns2 root@198.19.0.2:2222 key=/run/x/client_ed25519")[1]
    argv = ssh_argv(s, 7)
    assert argv[:4] == ["ssh", "-F", "/dev/null", "-T"]
    for opt in ("-oBatchMode=yes", "-oConnectTimeout=7", "-oIdentitiesOnly=yes",
                "-oUserKnownHostsFile=/run/x/known_hosts", "-oStrictHostKeyChecking=accept-new"):
        assert opt in argv
    assert argv[-5:] == ["-p", "2222", "-i", "/run/x/client_ed25519", "root@198.19.0.2"]


def test_run_keys_pin_the_host_key_and_the_config_allows_only_them(tmp_path):
    keys = sshd.make_keys(tmp_path / "ssh", "198.19.0.2")
    assert (tmp_path / "ssh").stat().st_mode & 0o777 == 0o700
    host_pub = keys.host.with_suffix(".pub").read_text().split()
    assert keys.known_hosts.read_text().split() == ["198.19.0.2", host_pub[0], host_pub[1]]
    conf = sshd.config(keys, "198.19.0.2")
    assert "ListenAddress 198.19.0.2:22" in conf and f"AuthorizedKeysFile {keys.client}.pub" in conf
    assert "PasswordAuthentication no" in conf and "PermitRootLogin prohibit-password" in conf
    assert "ListenAddress 0.0.0.0" not in conf


@pytest.mark.parametrize("text, message", [
    ("a localhost\nb localhost\n", "same ssh target"),
    ("a localhost mtu=9\n", "mtu="),
    ("", "no servers"),
])
def test_servers_check_bad_file_is_one_line_and_status_2(tmp_path, capsys, text, message):
    f = tmp_path / "servers.txt"
    f.write_text(text)
    assert cli.main(["servers", "check", str(f)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_servers_check_missing_file_is_status_2(tmp_path, capsys):
    assert cli.main(["servers", "check", str(tmp_path / "none.txt")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_a_late_reply_is_skipped_and_the_next_call_gets_its_own():
    with AgentLink.start(parse("s1 localhost")[0]) as link:
        with pytest.raises(AgentTimeout, match="no answer to run within 0 s"):   # slow, not gone
            link.call("run", timeout_s=0.2, argv=["sleep", "0.6"])
        time.sleep(0.8)                                        # the late reply and the next one arrive together
        assert link.call("run", argv=["echo", "next"])["stdout"] == "next\n"


def test_an_agent_writing_much_to_stderr_still_answers_and_its_last_line_is_reported():
    """stderr goes to a file, not a pipe nobody reads: 256 KiB of warnings (four times a pipe's buffer) before the
    first reply would block the agent with a pipe; when it ends, its last stderr line is in the error."""
    chatty = ("import sys, json; sys.stderr.write('warning\\n' * 32768); sys.stderr.flush(); "
              "req = json.loads(sys.stdin.readline()); print(json.dumps({'id': req['id'], 'ok': True, 'result': 1}), "
              "flush=True); sys.stderr.write('last words\\n'); sys.exit(3)")
    link = AgentLink(parse("s1 localhost")[0], [sys.executable, "-c", chatty])
    try:
        assert link.call("ping", timeout_s=10) == 1
        with pytest.raises(AgentError, match="status 3: last words"):
            link.call("ping", timeout_s=10)
    finally:
        link.close(grace_s=2)


class _Canned:
    """A link answering version, doctor and nic from fixed replies (the check's verdict logic, no agent)."""

    def __init__(self, commit: str, have: set[str], nic: dict | None):
        self.replies = {"version": {"commit": commit, "package": "0.1.0", "dirty": False, "kernel": "7.3.4"},
                        "doctor": {"checks": [{"name": p, "ok": p in have} for p in servers.REPORTED_PROBES]},
                        "nic": nic}

    def call(self, op, **_):
        if self.replies[op] is None:
            return {"ifname": None, "others": ["10.0.0.5/24 on eth0"]}
        return self.replies[op]


def test_check_lines_fail_on_another_commit_a_missing_needed_capability_and_an_absent_address(capsys):
    s2 = parse("s1 localhost\ns2 root@198.19.0.2 mtu=9000")[1]
    ref = {"commit": "a" * 40, "package": "0.1.0"}
    rep = servers.Report()
    servers._per_server(rep, s2, _Canned("b" * 40, {"qdisc:bfifo", "tcp:dctcp"}, None), ref)
    got = {r.check: r for r in rep.results}
    assert [c for c in got if not got[c].ok] == ["version", "kernel", "nic"]
    assert "the reference runs aaaaaaaaaaaa" in got["version"].detail
    assert "a fabric needs qdisc:htb" in got["kernel"].detail and "2/8 capabilities" in got["kernel"].detail
    assert "198.19.0.2 (its tunnels' source) is on none" in got["nic"].detail and "10.0.0.5/24" in got["nic"].detail
    rep = servers.Report()
    servers._per_server(rep, s2, _Canned("a" * 40, set(servers.REPORTED_PROBES), {"ifname": "eth0", "mtu": 1500}),
                        ref)
    assert [(r.check, r.ok) for r in rep.results] == [("version", True), ("kernel", True), ("nic", False)]
    assert "on eth0 with MTU 1500, but the file's mtu=9000 needs 9000" in rep.results[-1].detail
    assert len(capsys.readouterr().out.splitlines()) == 6       # one line per check, 3 checks twice


def test_clean_servers_dry_run_lists_through_the_local_agent(tmp_path, capsys):
    f = tmp_path / "servers.txt"
    f.write_text("server-1 localhost\n")
    assert cli.main(["clean", "--servers", str(f), "--dry-run"]) == 0
    line = capsys.readouterr().out.splitlines()[0].split()
    assert line[:3] == ["server-1", "clean", "ok"] and line[3] in ("would", "nothing")


def test_sshd_serve_refuses_outside_the_lab_vm(tmp_path, monkeypatch, capsys):
    """On the host by mistake it would put an address on the first NIC and start an sshd: it refuses, status 2."""
    monkeypatch.delenv("TESTBED_IN_VM", raising=False)
    assert sshd.main(["serve", "--folder", str(tmp_path), "--address", "198.19.0.2/24"]) == 2
    assert "inside the lab VM only" in capsys.readouterr().err


class _Share:
    """A built share standing in for testbed.network.share's (its teardown recorded, or failing)."""

    def __init__(self, fails: bool = False):
        self.fails, self.torn = fails, False

    def teardown(self):
        self.torn = True
        if self.fails:
            raise OSError("netlink: device busy")


def test_each_teardown_step_runs_whatever_the_others_did(tmp_path, monkeypatch, capsys):
    """A step that fails (killing the ranks, removing the share) is one line on stderr and the next steps still run:
    the share is removed, the echoes closed, the run state dropped, or kept for `testbed clean` when it still records
    a process."""
    import socket

    monkeypatch.setattr("testbed.kernel.state.STATE_DIR", tmp_path)

    def boom():
        raise RuntimeError("process 4242 (PermissionError: not permitted) not ended")
    for kill_fails, share_fails in ((True, False), (False, True)):
        agent = serveragent.Agent()
        agent.state.save()
        monkeypatch.setattr(agent.procs, "teardown", boom if kill_fails else (lambda: None))
        share, echo = _Share(fails=share_fails), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        agent.fabric = share
        agent.echoes.append((echo, None))
        if share_fails:
            agent.state.add("pids", 4243)         # a rank that outlived its kill: clean needs its pid
        failed = agent.teardown()
        err = capsys.readouterr().err
        assert share.torn and agent.fabric is None and echo.fileno() == -1 and agent.echoes == []
        assert len(failed) == 1 and failed[0] in err
        if kill_fails:
            assert "teardown: killing the processes it started failed: RuntimeError: process 4242" in err
            assert not agent.state.path.exists()
        else:
            assert "teardown: removing its share failed: OSError: netlink: device busy" in err
            assert json.loads(agent.state.path.read_text())["pids"] == [4243] and "pids 4243" in err


def test_call_each_asks_all_at_once_and_names_every_server_that_failed_or_did_not_answer():
    import threading

    gate = threading.Event()

    def refused():
        raise AgentError("s2: build_share: no room")

    def broken():
        raise ValueError("bad reply")

    wall: dict = {}
    assert call_each({"s1": lambda: {"ok": 1}, "s2": lambda: {"ok": 2}}, "ping", 5, wall) == {"s1": {"ok": 1},
                                                                                            "s2": {"ok": 2}}
    assert set(wall) == {"s1", "s2"}
    t0 = time.monotonic()
    with pytest.raises(AgentError) as e:
        call_each({"s1": lambda: {}, "s2": refused, "s3": broken, "s4": lambda: gate.wait(5)}, "build_share", 0.2)
    gate.set()
    assert time.monotonic() - t0 < 2   # the silent one is waited for only until the deadline
    assert str(e.value) == ("s2: build_share: no room; s3: ValueError: bad reply; s4: no answer to build_share")
