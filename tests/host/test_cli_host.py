"""The command line on the host: bad invocations are one line and exit 2; the lab VM returns exit status and
output; nothing is created by a refused command."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTBED = [sys.executable, "-m", "testbed.cli"]


def run(*args, env=None, user=None):
    argv = [*TESTBED, *args]
    if user:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def run_python(code, *args):
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def netns_list():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def one_line_exit_2(r):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_unknown_subcommand():
    one_line_exit_2(run("frobnicate"))


def test_unknown_scenario():
    one_line_exit_2(run("run", "nosuch"))


def test_bad_parameter_creates_nothing():
    before = netns_list()
    one_line_exit_2(run("run", "smoke", "--set", "rate_mbps=-5"))
    one_line_exit_2(run("run", "smoke", "--set", "red_min_bytes=60000"))
    one_line_exit_2(run("run", "smoke", "--set", "nosuch=1"))
    assert netns_list() == before


# Imports every module the refused commands reach, as root, then becomes user 65534 and runs the CLI: the refusal
# is testbed's own, wherever the checkout lives (a 0700 folder such as /root/... cannot be read by that user; the
# launcher on PATH covers that case, tests/host/test_quick_start.py).
AS_NOBODY = """
import os, sys
import testbed.cli, testbed.kernel.doctor, testbed.commands.clean, testbed.commands.runner
import testbed.vm.labvm, testbed.scenario
testbed.scenario.all_scenarios()
os.setgroups([]); os.setgid(65534); os.setuid(65534)
sys.exit(testbed.cli.main(sys.argv[1:]))
"""


def test_not_root():
    for args in (("doctor",), ("clean",), ("run", "smoke"), ("vm", "--", "true")):
        r = run_python(AS_NOBODY, *args)
        one_line_exit_2(r)
        assert "root" in r.stderr


def test_vm_without_kernel():
    env = dict(os.environ, TESTBED_VM_KERNEL="0.0-none")
    r = run("vm", "--", "true", env=env)
    one_line_exit_2(r)
    assert "kernel" in r.stderr


def test_help_everywhere():
    for args in (("--help",), ("doctor", "--help"), ("vm", "--help"), ("clean", "--help"), ("run", "--list"),
                 ("run", "smoke", "--help")):
        r = run(*args)
        assert r.returncode == 0 and len(r.stdout) > 100, (args, r.stdout, r.stderr)


def test_vm_exit_status_and_shared_output(tmp_path):
    out = tmp_path / "shared"
    r = run("vm", "--rwdir", str(out), "--", "sh", "-c",
            f"uname -r > {out}/release; echo to-stdout; echo to-stderr >&2; exit 7")
    assert r.returncode == 7, (r.stdout, r.stderr)
    assert "to-stdout" in r.stdout and "to-stderr" in r.stderr
    release = (out / "release").read_text().strip()
    assert release and release != os.uname().release  # it really ran on the VM's kernel



def test_a_vm_that_dies_mid_command_says_so_with_its_console_and_status_125():
    """The guest powers off under the command (sysrq 'o': what a QEMU crash or a guest panic looks like from
    outside): no exit status was reported, so `testbed vm` returns 125 (the suite's script boots once more on
    it, and only on it) and says when the VM stopped and where its console log is."""
    r = run("vm", "--", "sh", "-c", "echo working; sleep 1; echo o > /proc/sysrq-trigger; sleep 60")
    assert r.returncode == 125, (r.returncode, r.stdout, r.stderr)
    assert "working" in r.stdout, r.stdout
    assert "the VM stopped" in r.stderr and "after the command started" in r.stderr, r.stderr
    assert "console log:" in r.stderr, r.stderr
    # The folder is kept for the user to read; the test read it, so it goes (no /tmp/testbed-vm-* per run)
    log = Path(r.stderr.split("console log: ", 1)[1].split()[0])
    assert log.name == "vng.log" and log.parent.name.startswith("testbed-vm-") and log.exists(), log
    shutil.rmtree(log.parent)


def test_sigterm_to_testbed_vm_ends_its_qemu(tmp_path):
    """QEMU runs in a session of its own, so a SIGTERM to `testbed vm` (a CI job's time limit, `kill`) must end it
    too: no emulated VM is left running, and using the CPU, after the command is gone."""
    import signal
    import time

    marker = tmp_path / "vm-sigterm-marker"  # a --rwdir: QEMU's command line names it
    p = subprocess.Popen([*TESTBED, "vm", "--rwdir", str(marker), "--", "sh", "-c", f"touch {marker}/up; sleep 600"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        deadline = time.time() + 300
        while not (marker / "up").exists() and time.time() < deadline and p.poll() is None:
            time.sleep(0.5)
        assert (marker / "up").exists(), "the VM never ran the command"
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        time.sleep(1)
        left = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True).stdout.split()
        assert not left, f"processes left behind: {left}"
    finally:
        if p.poll() is None:
            p.kill()
        subprocess.run(["pkill", "-f", str(marker)], check=False)

# ------------------------------------------------------------------------------ bad --out: one line, nothing made

@contextlib.contextmanager
def read_only_mount(where, prepare=None):
    """A read-only tmpfs at `where` (a folder under tmp_path), unmounted afterwards; `prepare(where)` fills it
    while it is still writable."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True)
    try:
        if prepare:
            prepare(where)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def _names(listing):
    return {line.split()[0] for line in listing.splitlines() if line.strip()}  # "name (id: 3)" -> name


def _other_runs_namespaces():
    """Namespaces recorded by live runs in /run/testbed: another test session's, not this test's commands (which
    record theirs in a private TESTBED_STATE_DIR, asserted to stay empty)."""
    out = set()
    for f in Path("/run/testbed").glob("*.json"):
        try:
            out |= set(json.loads(f.read_text()).get("namespaces", []))
        except (OSError, ValueError):
            continue
    return out


def no_new_netns(before):
    """No namespace appeared since `before`. Runs of other sessions on this host may add and remove theirs
    meanwhile; those are recorded in /run/testbed (read before and after listing, so neither a run that starts
    nor one that ends in between is taken for ours)."""
    others = _other_runs_namespaces()
    now = _names(netns_list())
    others |= _other_runs_namespaces()
    added = now - _names(before) - others
    assert not added, added


def refused_bad_out(r, path, why):
    """Exit 2, one line that names --out and the reason, no traceback; the path was not created."""
    one_line_exit_2(r)
    assert "--out" in r.stderr and why in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not os.path.lexists(path) or not os.path.isdir(path), f"{path} was created"


def fake_run_dir(path):
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"scenario": "smoke", "params": {}, "seed": 1,
                                                    "complete": True}))
    (path / "summary.json").write_text(json.dumps({"goodput_mbps": 1.0}))
    return path


def test_bad_out_is_one_line_and_creates_nothing(tmp_path, monkeypatch):
    state = tmp_path / "state"  # a run's state file would appear here (testbed.kernel.state): none may
    monkeypatch.setenv("TESTBED_STATE_DIR", str(state))
    afile = tmp_path / "afile"
    afile.write_text("a regular file\n")
    cases = [
        (afile / "run", "not a directory"),  # a file as a parent component
        (afile / "a" / "b" / "run", "not a directory"),
        (afile, "not a directory"),  # an existing file
        ("/proc/forbidden", "inside /proc"),
        ("/sys/x", "inside /sys"),
        ("/sys/class/net/testbed-nonexistent/run", "inside /sys"),
    ]
    before_ns = netns_list()
    with read_only_mount(tmp_path / "ro") as ro:
        cases += [(ro / "run", "read-only"),  # the parent is a read-only mount
                  (ro / "missing" / "chain" / "run", "read-only")]  # a parent chain that cannot be created
        for path, why in cases:
            refused_bad_out(run("run", "smoke", "--out", str(path)), path, why)
        # the same check guards the other commands that write
        sweep_out = ro / "sweep"
        refused_bad_out(run("sweep", "smoke", "--set", "rate_mbps=10,20", "--out", str(sweep_out)), sweep_out,
                        "read-only")
        refused_bad_out(run("sweep", "smoke", "--set", "rate_mbps=10,20", "--out", "/proc/forbidden"),
                        "/proc/forbidden", "inside /proc")
        a, b = fake_run_dir(tmp_path / "runs" / "a"), fake_run_dir(tmp_path / "runs" / "b")
        for path, why in ((afile / "report", "not a directory"), (ro / "report", "read-only"),
                          ("/sys/report", "inside /sys")):
            refused_bad_out(run("report", str(a), "--out", str(path)), path, why)
        for path, why in ((afile / "cmp", "not a directory"), (ro / "cmp", "read-only"),
                          ("/proc/cmp", "inside /proc")):
            refused_bad_out(run("compare", str(a), str(b), "--out", str(path)), path, why)
        assert sorted(os.listdir(ro)) == []
    assert not list(tmp_path.joinpath("runs").rglob("report*")) and not list(tmp_path.rglob("compare.*"))
    no_new_netns(before_ns)
    assert not state.exists()


def test_report_into_a_read_only_run_dir_is_one_line(tmp_path):
    with read_only_mount(tmp_path / "ro", prepare=lambda d: fake_run_dir(d / "run")) as ro:
        r = run("report", str(ro / "run"))
        one_line_exit_2(r)
        assert "read-only" in r.stderr and "--out DIR" in r.stderr, r.stderr
        assert sorted(os.listdir(ro / "run")) == ["manifest.json", "summary.json"]


def test_a_good_out_passes_the_check(tmp_path):
    """A path the check accepts is not refused for its --out: the refusal that follows is another one (a bad
    parameter, checked first), so nothing runs."""
    out = tmp_path / "new" / "chain" / "run"
    r = run("run", "smoke", "--set", "rate_mbps=-5", "--out", str(out))
    one_line_exit_2(r)
    assert "rate_mbps" in r.stderr and not out.exists() and not (tmp_path / "new").exists()


# ------------------------------------------------------------------------------ --seed: 0..2**32-1, else exit 2

def test_bad_seed_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    before = netns_list()
    for seed in ("-1", str(2**32), "abc", "1.5", ""):
        for args in (("run", "smoke"), ("sweep", "smoke", "--set", "rate_mbps=10,20")):
            r = run(*args, "--seed", seed, "--out", str(tmp_path / "out"))
            one_line_exit_2(r)
            assert "seed" in r.stderr and "0..4294967295" in r.stderr, r.stderr
        r = run("run", "smoke", f"--seed={seed}", "--out", str(tmp_path / "out"))
        one_line_exit_2(r)
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()
    no_new_netns(before)


def test_seed_bounds_are_accepted():
    """0 and 2**32-1 get past --seed parsing: the command then stops at the --out check (nothing runs)."""
    for seed in ("0", str(2**32 - 1)):
        for args in (("run", "smoke"), ("sweep", "smoke", "--set", "rate_mbps=10,20")):
            r = run(*args, "--seed", seed, "--out", "/proc/forbidden")
            one_line_exit_2(r)
            assert "inside /proc" in r.stderr and "seed" not in r.stderr, r.stderr


def test_seed_is_documented():
    r = run("run", "smoke", "--help")
    assert "--seed N" in r.stdout and "0..4294967295" in r.stdout
    r = run("sweep", "--help")
    assert "0..4294967295" in r.stdout
