"""placement=topo with burn-in's health file in a real collective run (run under the shared lock).

The health file is a real burn-in's (tests/fixtures/burnin/slow-h2-health.json: 2 spines x 2 leaves x 4 hosts at
20 Mbit/s with h2's NIC at a quarter of its rate; burn-in flagged h2 alone). With it, a 4-rank job placed by topo
runs on leaf2's h5..h8 (packed would take h1..h4, h2 among them), as the run's manifest records; an 8-rank job
cannot be had on the 7 healthy hosts and is refused with its one line, exit status 2, before any namespace exists.
Kernel facts asserted, not timings: which namespaces ran ranks, and that no namespace was made. Both tests took
3.7 s together on this 2-CPU machine (fabric build included).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parent.parent.parent
HEALTH = ROOT / "tests" / "fixtures" / "burnin" / "slow-h2-health.json"
FABRIC = ["--set", "hosts_per_leaf=4", "--set", "placement=topo", "--set", f"health={HEALTH}"]


def collective(out: Path, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "testbed.cli", "run", "collective", "--vm", "never", "--out",
                           str(out), *FABRIC, *sets], capture_output=True, text=True, timeout=300, cwd=ROOT)


def netns() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def test_topo_keeps_the_job_off_the_host_burn_in_flagged(tmp_path):
    r = collective(tmp_path / "run", "--set", "ranks=4", "--set", "size=64K", "--set", "iterations=2")
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["placement"] == {"0": "h5", "1": "h6", "2": "h7", "3": "h8"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["hosts"] == "h5,h6,h7,h8" and summary["data_verified"] is True


def test_a_job_the_healthy_hosts_cannot_hold_is_refused_before_anything_is_built(tmp_path):
    before = netns()
    r = collective(tmp_path / "refused", "--set", "ranks=8")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("testbed: health: refused: 8 ranks need 8 healthy hosts; 7 are healthy (h2: tx_mbps")
    assert r.stderr.count("\n") == 1
    assert netns() <= before and not (tmp_path / "refused").exists()
