"""`testbed budget` on the host kernel: a 4-rank ring all-reduce (16 kB, 60 ms of compute a step, 12 steps) without
compute variance, with jitter 0.3 and 0.9 and with one straggler 3x slow half the time, 3 runs a point.

The job waits for its slowest rank every step, so its efficiency follows the order statistic of the ranks' compute
(analysis.budget): 0.86 expected at jitter 0.3 and 0.68 at 0.9 from a 69 ms base step. Measured (one budget, 3 runs
a point, shared 2-CPU host): 0.87 [0.85, 0.88] and 0.67 [0.66, 0.69]; the straggler point 0.64 [0.44, 0.64]
against a model of 0.53 (12 steps draw the straggler a binomial number of times, so its spread is wide and the
model is not asserted there). The asserted band, 0.08 around the model, is ~3x the largest deviation seen;
the verdicts rest on intervals 0.1 from the bar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parent.parent.parent


def test_a_budget_finds_the_jitter_a_synchronized_job_absorbs_and_where_it_breaks(tmp_path):
    out = tmp_path / "budget"
    sets = ["ranks=4", "size=16K", "compute_ms=60", "iterations=12", "warmup=1", "stragglers=2", "straggler_factor=3"]
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "budget", *sum((["--set", s] for s in sets), []),
                        "--jitter", "0.3,0.9", "--straggler-prob", "0.5", "--repeat", "3", "--vm", "never",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    df = pd.read_csv(out / "budget.csv").set_index(["axis", "value"])
    assert list(df.index) == [("jitter", 0.3), ("jitter", 0.9), ("straggler_prob", 0.5)]
    assert (df["runs"] == 3).all(), df
    for key in (("jitter", 0.3), ("jitter", 0.9)):
        row = df.loc[key]
        assert row["low"] <= row["efficiency"] <= row["high"], row
        assert abs(row["efficiency"] - row["expected"]) < 0.08, (key, row.to_dict())
    assert df.loc[("jitter", 0.3), "verdict"] == "absorbed", df
    assert df.loc[("jitter", 0.9), "verdict"] == "over budget", df
    assert df.loc[("straggler_prob", 0.5), "verdict"] == "over budget", df
    md = (out / "budget.md").read_text()
    assert "The job absorbs compute jitter up to 0.3" in md and "falls below 0.75 at 0.9" in md, md
    assert (out / "budget.png").stat().st_size > 5000
    assert {"base", "jitter=0.3", "jitter=0.9", "straggler_prob=0.5"} <= {p.name for p in out.iterdir()}
