"""`testbed run ... --live` on the host kernel: while an all-to-all runs, the terminal shows the busiest ports
(queue depth, drops, ECN marks, rate) and the collective's iteration, drawn from the queue sampler's own rounds;
the run directory is the same as without it."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.load import load_run

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parent.parent.parent


def test_live_view_shows_the_busiest_ports_and_the_iteration_while_the_run_goes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "collective", "--vm", "never", "--live",
                        "--set", "collective=alltoall", "--set", "size=512K", "--set", "iterations=6",
                        "--set", "sample_interval_ms=20", "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    err = r.stderr
    assert "busiest ports of 16" in err, err[-3000:]
    assert re.search(r"iteration \d of 7", err), err[-3000:]  # 6 iterations + 1 warm-up, reported by rank 0
    rows = re.findall(r"│ ((?:h|leaf|spine)\d+:\S+)\s+│\s+([\d,]+) │", err)
    assert rows and any(int(q.replace(",", "")) > 0 for _, q in rows), err[-3000:]  # a queue held bytes
    run = load_run(tmp_path / "run")
    assert len(run.queues) > 100 and run.summary["data_verified"]  # the samples the view read were recorded
    assert not glob.glob("/tmp/tb-live-*.json")  # the snapshot file went with the view


def _under_pty(argv: list[str], timeout_s: float = 300) -> tuple[int, str]:
    """Run argv with a pseudo-terminal as stdout and stderr (as a projector's terminal); its exit status and
    everything it drew, escape sequences removed."""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, cwd=ROOT)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:
                break  # the child closed the terminal
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    proc.wait(timeout=30)
    text = b"".join(chunks).decode(errors="replace")
    return proc.returncode, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def test_live_incast_under_a_terminal_shows_the_bottleneck_filling_and_dropping(tmp_path):
    argv = [sys.executable, "-m", "testbed.cli", "run", "incast", "--vm", "never", "--set", "rounds=20"]
    rc, screen = _under_pty([*argv, "--live", "--out", str(tmp_path / "live")])
    assert rc == 0, screen[-3000:]
    # every redraw of the bottleneck's row: queue bytes and drops so far
    frames = [(int(q.replace(",", "")), int(d)) for q, d in
              re.findall(r"leaf1:h1\s*│\s*([\d,]+)\s*│[^│\n]*│\s*(\d+)\s*│", screen)]
    assert len(frames) >= 3, screen[-3000:]
    assert len(set(frames)) >= 2, frames  # the screen changed while the run went
    assert max(q for q, _ in frames) > 0 and max(d for _, d in frames) > 0, frames  # it filled and dropped
    # the run directory is the same as without --live (the view reads the sampler, it writes nothing)
    r = subprocess.run([*argv, "--out", str(tmp_path / "plain")], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    live, plain = tmp_path / "live", tmp_path / "plain"
    assert sorted(p.name for p in live.iterdir()) == sorted(p.name for p in plain.iterdir())
    for name in ("queues.csv", "rounds.csv", "ports.csv"):
        assert (live / name).read_text().splitlines()[0] == (plain / name).read_text().splitlines()[0], name
    assert sorted(load_run(live).summary) == sorted(load_run(plain).summary)
