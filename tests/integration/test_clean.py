"""A deliberately killed run leaves namespaces behind; `testbed clean` removes every one of them, and its links."""

import os
import signal
import subprocess
import sys
import time


def _ours():
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in ns.splitlines() if ln.startswith("tb-")]


def test_clean_after_kill(tmp_path):
    err = open(tmp_path / "stderr", "w")
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "smoke", "--vm", "never",
                          "--set", "duration_s=30", "--out", str(tmp_path / "run")],
                         stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    deadline = time.monotonic() + 90
    while len(_ours()) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    if len(_ours()) != 3:
        os.killpg(p.pid, signal.SIGKILL)
        raise AssertionError("the run did not build its namespaces: " + (tmp_path / "stderr").read_text())
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert len(_ours()) == 3  # killed -9: nothing could clean up
    manifest = (tmp_path / "run" / "manifest.json").read_text()
    assert '"complete": false' in manifest
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert "removed 3 namespaces" in r.stdout, r.stdout
    assert _ours() == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert " tb" not in links
    again = subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], capture_output=True, text=True)
    assert "nothing to clean" in again.stdout


def test_sigterm_tears_down(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", "smoke", "--vm", "never", "--quiet",
                          "--set", "duration_s=30", "--out", str(tmp_path / "run")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while len(_ours()) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)
    assert len(_ours()) == 3, p.stderr.read() if p.poll() is not None else "namespaces not built in 90 s"
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    assert _ours() == []
