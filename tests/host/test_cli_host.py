"""The command line on the host: bad invocations are one line and exit 2; the lab VM returns exit status and
output; nothing is created by a refused command."""

import os
import subprocess
import sys

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
import testbed.cli, testbed.doctor, testbed.clean, testbed.runner, testbed.labvm, testbed.scenarios
testbed.scenarios.all_scenarios()
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
