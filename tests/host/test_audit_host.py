"""`testbed audit` on the host kernel: a small weak-scaling audit (2 -> 4 ranks, one leaf -> two) writes its table,
Markdown and HTML page; the efficiency is computed from the points' own step times, with a verdict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parent.parent.parent


def test_a_small_audit_writes_its_table_page_and_verdict(tmp_path):
    out = tmp_path / "audit"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "audit", "--set", "ranks=2", "--set", "hosts_per_leaf=2",
                        "--set", "size=256K", "--set", "iterations=3", "--set", "compute_ms=50", "--scale", "1,2",
                        "--vm", "never", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    df = pd.read_csv(out / "audit.csv")
    assert list(df["ranks"]) == [2, 4] and list(df["leaves"]) == [1, 2]
    assert df["efficiency"].iloc[0] == pytest.approx(1.0)
    step2, step4 = df["step_ms_p50"]
    assert df["efficiency"].iloc[1] == pytest.approx(step2 / step4)  # weak scaling: T_N / T_kN
    assert df["verdict"].iloc[1] in ("good", "marginal", "poor")
    assert "weak scaling from 2 to 4 ranks: efficiency" in r.stdout
    page = (out / "audit.html").read_text()
    assert "Scaling audit" in page and "What grew with scale" in page and "slowest op" in page
    assert (out / "ranks=2" / "summary.json").exists() and (out / "ranks=4" / "ops.csv").exists()
