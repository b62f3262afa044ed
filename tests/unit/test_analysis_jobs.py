"""analysis.jobs: a job's slowdown from its neighbours, together / solo, through analysis.stats (pure)."""

from __future__ import annotations

import math

from analysis import jobs as aj


def runs(values_per_run):
    return [{"step_ms": list(v), "cct_ms": list(v)} for v in values_per_run]


def test_slowdown_told_with_interval_above_one():
    solo = runs([[100 + i for i in range(12)]])
    together = runs([[180 + 2 * i for i in range(12)]])
    d = aj.slowdown(together, solo, "step_ms")
    assert d["p50_verdict"] == "A > B" and 1.7 < d["p50_ratio"] < 1.9 and d["p50_low"] > 1
    assert d["p50_n"] == "12 vs 12 iterations"
    assert math.isnan(d["p99_low"]) and "no interval" in d["p99_verdict"]  # one run a side


def test_same_distribution_not_told_and_p99_over_runs():
    base = [100, 104, 98, 101, 103, 99, 102, 97, 105, 100]
    d = aj.slowdown(runs([base, base[::-1]]), runs([base[1:] + base[:1], base]), "step_ms")
    assert d["p50_verdict"].startswith("not distinguishable")
    assert d["p99_verdict"].startswith("not distinguishable") and not math.isnan(d["p99_low"])


def test_verdict_line_reads_as_a_sentence():
    row = {"job": "train", "beside": "ckpt, data", "step_p50_ratio": 1.62, "step_p50_low": 1.31,
           "step_p50_high": 1.9, "step_p50_verdict": "A > B", "step_p50_n": "20 vs 20 iterations",
           "step_p99_ratio": 2.1,
           "step_p99_low": math.nan, "step_p99_high": math.nan}
    assert aj.verdict_line(row).startswith("train: 1.62x slower beside ckpt, data [1.31, 1.90] (step p50")
    row.update(step_p50_verdict="not distinguishable (20 runs)", step_p50_ratio=1.01)
    assert "no slowdown told" in aj.verdict_line(row)


def test_four_runs_a_side_compare_run_medians_not_iterations():
    """A run-level offset (this machine slower in some runs) is not a slowdown: with 4 runs a side the p50 verdict
    rests on the runs' medians, which differ no more than the runs do."""
    together = runs([[100 + i % 3 for i in range(10)], [110 + i % 3 for i in range(10)],
                     [104 + i % 3 for i in range(10)], [96 + i % 3 for i in range(10)]])
    solo = runs([[102 + i % 3 for i in range(10)], [98 + i % 3 for i in range(10)],
                 [108 + i % 3 for i in range(10)], [101 + i % 3 for i in range(10)]])
    d = aj.slowdown(together, solo, "step_ms")
    assert d["p50_n"] == "4 vs 4 runs" and d["p50_verdict"].startswith("not distinguishable")
