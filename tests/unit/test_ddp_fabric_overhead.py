"""The DDP overhead benchmark's pure parts: a run's step-time spread, the spread over runs, the summary over both
sides (failed runs left out, the step CV compared like the step times) and where the results file goes. Its runs
need root and fabrics: a documented command (docs/programs.md), not a test."""

import argparse
import importlib.util
import math
from pathlib import Path

import pytest

from testbed.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ddp_fabric_overhead", ROOT / "benchmarks" / "ddp_fabric_overhead.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_a_runs_spread_is_its_fastest_and_slowest_step_and_their_cv():
    s = bench.within_run_spread([600.0, 580.0, 640.0, 620.0])
    assert s["step_ms_min"] == 580.0 and s["step_ms_max"] == 640.0
    assert s["step_cv"] == pytest.approx(25.82 / 610.0, rel=1e-3)  # sample std (ddof=1) over the mean
    one = bench.within_run_spread([600.0])
    assert one["step_cv"] is None and one["step_ms_min"] == one["step_ms_max"] == 600.0
    assert bench.within_run_spread([]) == {"step_ms_min": None, "step_ms_max": None, "step_cv": None}


def test_the_spread_over_runs_reads_cv_and_range_and_skips_missing_values():
    assert bench.across_runs_text([100.0, 110.0, None, math.nan, 90.0]) == "CV 10.0%, 90.0-110.0 (n 3)"
    assert bench.across_runs_text([100.0]) == "CV n/a, 100.0-100.0 (n 1)"
    assert bench.across_runs_text([]) == "no runs"


def _row(side, seed, p50, cv=0.05):
    return {"side": side, "seed": seed, "step_ms_p50": p50, "step_ms_p99": p50 * 1.1,
            "steady_step_ms_p99": p50 * 1.05, "step_ms_min": p50 * 0.9, "step_ms_max": p50 * 1.1, "step_cv": cv,
            "tcp_retrans_segs": 1, "switch_drops": 0, "cpu_busy_fraction": 0.4, "fidelity_ok": True,
            "fidelity_reasons": ""}


def test_the_summary_compares_the_sides_over_the_runs_that_did_not_fail():
    rows = [_row("fabric", i, 110.0 + i, cv=0.08) for i in range(6)] + \
           [_row("bare", i, 100.0 + i, cv=0.04) for i in range(6)] + [{"side": "fabric", "seed": 7, "error": "x"}]
    a = argparse.Namespace(rate_mbps=20.0, steps=15, repeats=7)
    out = bench.summarize(rows, a)
    assert out["sides"]["fabric"]["runs"] == 6 and out["sides"]["bare"]["runs"] == 6
    p50 = out["fabric_over_bare_step_ms_p50"]
    assert p50["ratio"] == pytest.approx(112.5 / 102.5) and p50["verdict"] == "A > B"
    assert "fabric > bare" in p50["text"] and "[" in p50["text"]
    assert out["fabric_over_bare_step_cv"]["ratio"] == pytest.approx(2.0)
    assert out["sides"]["bare"]["step_ms_range"] == [90.0, pytest.approx(105 * 1.1)]
    assert out["sides"]["fabric"]["step_ms_p50_across_runs_text"].endswith("110.0-115.0 (n 6)")
    assert "failed (left out): x" in bench.run_line(rows[-1])
    assert "CV 8.0%" in bench.run_line(rows[0]) and "steps 99.0-121.0 ms" in bench.run_line(rows[0])


def test_the_results_file_defaults_to_a_dated_name_and_refuses_a_folder(tmp_path):
    p = bench.results_path(None, 0.0)
    assert p == ROOT / "results" / "ddp_fabric_overhead-19700101T000000Z.json"
    assert bench.results_path(str(tmp_path / "new" / "r.json"), 0.0) == tmp_path / "new" / "r.json"
    with pytest.raises(UsageError, match="is a folder"):
        bench.results_path(str(tmp_path), 0.0)
    with pytest.raises(UsageError, match="--results"):
        bench.results_path("/proc/r.json", 0.0)


def _results(path, rate, steps, rows):
    import json
    path.write_text(json.dumps({"rate_mbps": rate, "steps": steps, "repeats": 1, "runs": rows}))
    return str(path)


def test_pooling_joins_batches_of_the_same_rate_and_steps_and_refuses_others(tmp_path):
    a = _results(tmp_path / "a.json", 20.0, 15, [_row("fabric", 1, 110.0), _row("bare", 1, 100.0)])
    b = _results(tmp_path / "b.json", 20.0, 15, [_row("bare", 1, 101.0), _row("fabric", 1, 111.0)])
    rows, params = bench.load_pool([a, b])
    assert len(rows) == 4 and (params.rate_mbps, params.steps, params.repeats) == (20.0, 15, 2)
    assert bench.summarize(rows, params)["sides"]["bare"]["runs"] == 2
    c = _results(tmp_path / "c.json", 100.0, 30, [_row("fabric", 1, 50.0)])
    with pytest.raises(UsageError, match="differ in"):
        bench.load_pool([a, c])
    (tmp_path / "d.json").write_text('{"runs": 3}')
    with pytest.raises(UsageError, match="not a results file"):
        bench.load_pool([str(tmp_path / "d.json")])
    with pytest.raises(UsageError, match="cannot read it"):
        bench.load_pool([str(tmp_path / "none.json")])
    with pytest.raises(UsageError, match="holds the same batch as"):
        bench.load_pool([a, b, a])  # a batch given twice would count its runs twice
