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
