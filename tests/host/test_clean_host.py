"""A deliberately killed run leaves namespaces behind; `testbed clean` removes every one of them, and its links; a
run sent SIGTERM tears its own down. The run: a drop-tail incast of one sender over a dumbbell (h1 -> s1 -> s2 ->
r1: 4 namespaces, HTB and bfifo only, so the host kernel runs it), long enough (2000 rounds) to be killed mid-run.
These ran in the lab VM on the smoke scenario (RED) until 2026-12-05: 38 and 22 s there, a few seconds here."""

import os
import signal
import subprocess
import sys
import time

import pytest


def _ours():
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in ns.splitlines() if ln.startswith("tb-")]


@pytest.fixture(autouse=True)
def nothing_else_up():
    """`testbed clean` removes every leftover of the project on the machine, and the counts below are the machine's:
    so no other run's namespace may be up before, and none of the killed run's may stay after (removed, then
    failed on, should an assertion have stopped the test before its own clean)."""
    before = _ours()
    assert not before, f"another run's namespaces are up (this test's clean would remove them): {before}"
    yield
    left = _ours()
    if left:
        subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], capture_output=True, timeout=180)
    assert not left, f"namespaces left behind: {left}"


#: `testbed run` of a drop-tail incast that builds NAMESPACES namespaces and runs for about a minute
RUN = [sys.executable, "-m", "testbed.cli", "run", "incast", "--vm", "never", "--set", "topology=dumbbell",
       "--set", "senders=1", "--set", "rounds=2000"]
NAMESPACES = 4


def _tmp_files() -> set[str]:
    """The project's named temporary files in the temporary directory (a queue sampler's rows once were)."""
    import glob
    import tempfile

    return set(glob.glob(os.path.join(tempfile.gettempdir(), "tb-*.tsv")))


def test_clean_after_kill(tmp_path):
    files_before = _tmp_files()
    err = open(tmp_path / "stderr", "w")
    p = subprocess.Popen([*RUN, "--out", str(tmp_path / "run")], stdout=subprocess.DEVNULL, stderr=err,
                         start_new_session=True)
    deadline = time.monotonic() + 90
    while len(_ours()) < NAMESPACES and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    if len(_ours()) != NAMESPACES:
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError("the run did not build its namespaces: " + (tmp_path / "stderr").read_text())
    samplers = subprocess.run(["pgrep", "-g", str(p.pid), "-f", "testbed.measure.telemetry"], capture_output=True,
                              text=True).stdout.split()
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert samplers, "no queue sampler was running when the run was killed (the check below would prove nothing)"
    assert len(_ours()) == NAMESPACES  # killed -9: nothing could clean up
    # ... but the queue sampler's rows have no name in /tmp to leave behind (each killed run left an empty one)
    assert _tmp_files() <= files_before, _tmp_files() - files_before
    manifest = (tmp_path / "run" / "manifest.json").read_text()
    assert '"complete": false' in manifest
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert f"removed {NAMESPACES} namespaces" in r.stdout, r.stdout
    assert _ours() == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert " tb" not in links
    again = subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], capture_output=True, text=True)
    assert "nothing to clean" in again.stdout


def test_sigterm_tears_down(tmp_path):
    p = subprocess.Popen([*RUN, "--quiet", "--out", str(tmp_path / "run")], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while len(_ours()) < NAMESPACES and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)
    assert len(_ours()) == NAMESPACES, p.stderr.read() if p.poll() is not None else "namespaces not built in 90 s"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    assert _ours() == []
