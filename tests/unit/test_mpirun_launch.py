"""mpirun on the fabric (testbed.workloads.mpirun): the rsh agent's routing of addresses to hosts, how far a launch
got (daemons up, a rank started) read from real processes, and the one line that ends a launch that started no rank;
each host's own hostname (testbed.kernel.uts)."""

import os
import subprocess
import time
import uuid

import pytest

from testbed.kernel import uts
from testbed.workloads import mpirun

NODES = [mpirun.Node("198.18.1.1", "tb-x-h1", "h1"), mpirun.Node("198.18.1.2", "tb-x-h2", "h2")]


def test_the_hostfile_lists_each_fabric_address_with_its_slots():
    assert mpirun.hostfile(NODES, {"h1": 2, "h2": 1}) == "198.18.1.1 slots=2\n198.18.1.2 slots=1\n"


def test_the_rsh_agent_enters_the_host_under_its_name_and_refuses_other_addresses(tmp_path):
    agent = tmp_path / "rsh"
    agent.write_text(mpirun.rsh_agent(NODES))
    text = agent.read_text()
    assert "198.18.1.2) ns=tb-x-h2 name=h2 ;;" in text
    assert 'exec nsenter --net=/run/netns/$ns unshare --uts' in text and '"$name" "$*"' in text
    r = subprocess.run(["sh", str(agent), "-x", "10.0.0.9", "orted", "--daemonize"],
                       capture_output=True, text=True)
    assert r.returncode == 255 and "10.0.0.9 is not a host of this fabric" in r.stderr


def test_mpirun_argv_holds_transports_to_the_fabric_and_exports_each_name_once():
    from pathlib import Path

    a = mpirun.argv(Path("/r/hostfile"), Path("/r/rsh"), 4, Path("/r/mpi"), ["A", "B", "A"], "/w", "x.py")
    assert a[:2] == ["mpirun", "--allow-run-as-root"] and a[-3:] == ["sh", "-c", "x.py"]
    assert a[a.index("btl_tcp_if_include") + 1] == "198.18.0.0/16" == a[a.index("oob_tcp_if_include") + 1]
    assert [a[i + 1] for i, x in enumerate(a) if x == "-x"] == ["A", "B"]


@pytest.mark.parametrize("up, says", [
    ([], "no daemon (orted) came up on h2, h3, h4"),
    (["h2", "h4"], "its daemons (orted) came up on h2, h4, not on h3"),
    (["h2", "h3", "h4"], "its daemons (orted) came up on all of h2, h3, h4"),
])
def test_the_no_rank_line_says_where_the_daemons_got_to(up, says):
    line = mpirun.no_rank_line(30, ["h2", "h3", "h4"], up, "")
    assert line == f"program: mpirun started no rank within 30 s: {says}; nothing on mpirun.stderr"
    assert "\n" not in line
    assert mpirun.no_rank_line(30, ["h2"], [], "oops").endswith("; mpirun.stderr: oops")


def _after_exec(pid: int, name: str) -> None:
    """Wait (up to 5 s) until a child started by Popen has finished its exec: Popen returns when the exec has closed
    the child's close-on-exec pipe, and the kernel sets the new name at the same point, but the new environment
    (/proc/PID/environ) is laid out after that; a read in between finds an empty environment."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if (open(f"/proc/{pid}/comm").read().strip() == name
                    and b"TESTBED_PROGRAM=" in open(f"/proc/{pid}/environ", "rb").read()):
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not finish exec'ing {name} within 5 s")


def test_a_launch_is_read_from_the_processes_that_carry_its_mark(tmp_path):
    token = uuid.uuid4().hex[:16]
    env = {**os.environ, "TESTBED_PROGRAM": token}
    inode = os.stat("/proc/self/ns/net").st_ino
    (tmp_path / "orted").symlink_to("/bin/sleep")  # a process named orted: the daemon of this host
    daemon = subprocess.Popen([str(tmp_path / "orted"), "30"], env=env)
    _after_exec(daemon.pid, "orted")
    try:
        procs = mpirun.program_processes(token)
        assert [p.pid for p in procs] == [daemon.pid] and not mpirun.rank_started(procs)
        assert mpirun.daemon_hosts(procs, {inode: "h2"}) == ["h2"]
        watch = mpirun.StartWatch(token, {}, bound_s=5, every_s=0)
        watch.inode_host, watch.hosts = {inode: "h2"}, ["h1", "h2", "h3"]
        assert watch.check(1.0) is None  # within the bound
        assert watch.check(6.0) == ("program: mpirun started no rank within 5 s: its daemons (orted) came up on "
                                    "h2, not on h3; nothing on mpirun.stderr")
        rank = subprocess.Popen(["sleep", "30"], env={**env, "OMPI_COMM_WORLD_RANK": "0"})
        _after_exec(rank.pid, "sleep")
        try:
            assert mpirun.rank_started(mpirun.program_processes(token))
            assert watch.check(7.0) is None and watch.started  # a rank started: the bound no longer applies
            assert watch.check(100.0) is None
        finally:
            rank.kill()
            rank.wait()
    finally:
        daemon.kill()
        daemon.wait()


def test_a_host_process_runs_under_the_hosts_own_name():
    out = subprocess.run(uts.named("h3", ["sh", "-c", 'echo "$(hostname) $1"', "x", "a b"]), capture_output=True,
                         text=True, check=True).stdout
    assert out == "h3 a b\n"
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() != "h3"  # ours unchanged
    for node, name in (("h1", "h1"), ("leaf1", "leaf1"), ("h1_2", "h1-2"), ("-h", "h"), ("x" * 70, "x" * 63),
                       ("h1;rm -rf", "h1-rm--rf"), ("", "node"), ("__", "node")):
        assert uts.hostname_for(node) == name
        r = subprocess.run(uts.named(node, ["hostname"]), capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.strip() == name, (node, r)


def test_a_killed_mpiruns_session_directory_is_removed_and_only_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    d = mpirun.session_dir("h1", 4242)
    assert d == tmp_path / f"ompi.h1.{os.geteuid()}" / "pid.4242"
    (d / "0" / "0").mkdir(parents=True)
    other = mpirun.session_dir("h1", 4343)
    other.mkdir()
    mpirun.remove_session_dir("h1", 4242)
    assert not d.exists() and other.exists()
    mpirun.remove_session_dir("h1", 4343)
    assert not other.parent.exists()  # the host's top directory goes once empty
    mpirun.remove_session_dir("h1", 4343)  # nothing there: no error
