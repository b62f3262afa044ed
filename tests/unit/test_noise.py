"""The noise floor's pure logic (testbed.commands.noise): what it records from a battery's values, how a test or a
lab reads a repeat count from it, and its refusals (one line, exit status 2, nothing run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from analysis import stats
from testbed.commands import noise
from testbed.errors import UsageError

VALUES = {
    "incast_round_ms_p99": [251.0, 262.0, 240.0, 300.0, 255.0],
    "incast_round_p50_vs_ideal": [1.10, 1.12, 1.09, 1.15, 1.11],
    "incast_queue_median_bytes": [30_000.0, 31_000.0, 29_500.0, 30_500.0, float("nan")],
    "allreduce_cct_ms_p99": [400.0, 410.0, 390.0, 405.0, 395.0],
    "allreduce_cct_vs_bound": [1.20, 1.21, 1.19, 1.22, 1.20],
}


def test_floor_records_each_metrics_estimate_and_the_runs_each_effect_needs():
    rec = noise.floor(VALUES)
    assert set(rec) == set(noise.METRICS)
    r = rec["incast_round_ms_p99"]
    e = stats.estimate(VALUES["incast_round_ms_p99"])
    assert (r["median"], r["low"], r["high"], r["n"], r["cv"]) == (e.median, e.low, e.high, e.n, e.cv)
    assert r["unit"] == "ms" and set(r["runs_needed"]) == {"1.2x", "1.5x", "2x"}
    need = r["runs_needed"]
    # a larger effect never needs more runs; never fewer than a verdict can have
    assert need["1.2x"] >= need["1.5x"] >= need["2x"] >= stats.MIN_RUNS_FOR_VERDICT
    # a lost value (NaN) is left out of the estimate, kept in the record
    assert rec["incast_queue_median_bytes"]["n"] == 4 and len(rec["incast_queue_median_bytes"]["values"]) == 5
    # a queue that stays empty: no CV (mean 0), the fewest runs
    empty = noise.floor({"incast_queue_median_bytes": [0.0] * 5})["incast_queue_median_bytes"]
    assert empty["cv"] is None and empty["median"] == 0.0


def test_a_noisier_metric_needs_more_runs_for_the_same_effect():
    quiet = noise.floor({"allreduce_cct_vs_bound": [1.20, 1.21, 1.19, 1.22, 1.20]})["allreduce_cct_vs_bound"]
    noisy = noise.floor({"allreduce_cct_vs_bound": [1.0, 1.6, 1.1, 2.2, 1.3]})["allreduce_cct_vs_bound"]
    assert noisy["runs_needed"]["1.2x"] > quiet["runs_needed"]["1.2x"]


def test_repeats_for_reads_the_recorded_floor_and_falls_back_without_one(tmp_path, monkeypatch):
    monkeypatch.setattr(noise, "NOISE_DIR", tmp_path)
    assert noise.load("host") is None
    assert noise.repeats_for("incast_round_ms_p99", 1.5, "host", default=7) == 7
    (tmp_path / "host.json").write_text(json.dumps({"metrics": noise.floor(VALUES)}))
    got = noise.repeats_for("incast_round_ms_p99", 1.5, "host")
    assert got == noise.floor(VALUES)["incast_round_ms_p99"]["runs_needed"]["1.5x"]
    assert noise.repeats_for("no_such_metric", 1.5, "host", default=6) == 6


def test_where_tells_the_lab_vm_from_the_host(monkeypatch):
    monkeypatch.setenv("TESTBED_IN_VM", "1")
    assert noise.where() == "lab-vm" and noise.default_path().name == "lab-vm.json"
    monkeypatch.delenv("TESTBED_IN_VM")
    assert noise.where() == "host"


@pytest.mark.parametrize("repeats", [0, 1, 51])
def test_a_repeat_count_without_a_spread_is_refused(repeats):
    with pytest.raises(UsageError, match="--repeat must be 2..50"):
        noise.main(repeats=repeats)


def test_the_cli_refuses_in_one_line_before_running_anything(tmp_path):
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "doctor", "--noise", "--repeat", "1", "--out",
                        str(tmp_path / "n.json")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--repeat" in r.stderr, r.stderr
    assert not (tmp_path / "n.json").exists() and list(tmp_path.iterdir()) == []
