"""One metric vocabulary: summary.json (as analysis recomputes it), the report and compare agree on every metric.

Over the fixture runs in tests/fixtures/runs/ (``straggler_collective``: 3 ranks x 4 iterations of an allreduce,
rank 2 computes 100 ms against the others' 30 ms, ops.csv with ``iter_start_s`` and ``size_bytes`` as the
collective scenario writes it; its summary.json holds what the scenario computes with analysis.summary).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from analysis import metrics as m
from analysis import summary as asum
from analysis.compare import compare
from analysis.report import fmt, write_report

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
FIXTURES = ["small_collective", "incomplete", "straggler_collective"]
STRAGGLER = RUNS / "straggler_collective"


def report_metrics(md: str) -> list[tuple[str, str]]:
    """(metric, value) of every row of the report's metric tables (columns metric | value | from)."""
    out = []
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[2] in ("the files", "summary.json"):
            out.append((cells[0], cells[1]))
    return out


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("name", FIXTURES)
def test_summary_report_and_compare_agree(name, tmp_path):
    vals = asum.summarize(RUNS / name)
    stored = asum.load_quietly(RUNS / name).summary
    assert vals, name
    _, md_p = write_report(RUNS / name, tmp_path)
    rows = report_metrics(md_p.read_text())
    names = [k for k, _ in rows]
    assert len(names) == len(set(names)), "a metric appears twice in the report"
    shown = dict(rows)
    df = compare([RUNS / name])
    assert df["metric"].is_unique, "a metric has two rows in compare"
    cmp = dict(zip(df["metric"], df[name]))
    for k, (v, _src) in vals.items():
        # the report shows summarize's value, once (a summary.json value as written: true, not 1)
        assert shown[k] == fmt(stored[k] if _src == "summary" else v), (k, shown[k], v)
        assert same(cmp[k], float(v)), (k, cmp[k], v)  # compare shows the same number
    assert set(cmp) == set(vals)


def test_in_run_summary_is_what_analysis_recomputes():
    """The collective scenario writes analysis.summary's values into summary.json: none is stale."""
    run = asum.load_quietly(STRAGGLER)
    data = asum.data_metrics(run)
    assert asum.stale_keys(run, data) == []
    stored = json.loads((STRAGGLER / "summary.json").read_text())
    for k in ("step_cv", "comm_wait_fraction", "step_ms_p50", "cct_ms_p99", "busbw_gbps", "tcp_retrans_segs"):
        assert same(float(stored[k]), float(data[k])), k


def test_straggler_steps_by_hand():
    """Steps are barrier to barrier from the end of the warm-up (the latest rank origin, 1000.002): 122, 128, 126,
    122 ms. Without iter_start_s the first step would start at the first op (94 ms, no compute in it): that was the
    second definition (step_cv 0.13 against 0.024)."""
    ops = asum.load_quietly(STRAGGLER).ops
    cm = asum.collective_metrics(ops)
    assert m.step_times(ops)["step_s"].mul(1e3).tolist() == pytest.approx([122, 128, 126, 122])
    assert cm["step_ms_p50"] == pytest.approx(122) and cm["step_ms_mean"] == pytest.approx(124.5)
    assert cm["step_cv"] == pytest.approx(3 / 124.5)
    # comm-wait: waits (0.072+0.072+0.076+0.072) + (0.071+0.070+0.074+0.070) over each rank's own steps
    steps = m.rank_step_times(ops).groupby("rank")["step_s"].sum()
    # each rank's steps add up to its last end minus its origin
    assert steps.sum() == pytest.approx((1000.498 - 1000.000) + (1000.499 - 1000.000) + (1000.500 - 1000.002))
    assert cm["comm_wait_fraction"] == pytest.approx((0.292 + 0.285) / steps.sum())
    # busbw: allreduce, 3 ranks, size 600000 B (ops.csv size_bytes), mean CCT 96.5 ms
    assert cm["algbw_gbps"] == pytest.approx(600000 * 8 / 0.0965 / 1e9)
    assert cm["busbw_gbps"] == pytest.approx(cm["algbw_gbps"] * 4 / 3)
    old = asum.collective_metrics(ops.drop(columns="iter_start_s"))
    assert old["step_ms_p50"] == pytest.approx(122) and old["step_cv"] > 5 * cm["step_cv"]


def test_a_stale_summary_value_is_flagged_and_shown_once(tmp_path):
    run = shutil.copytree(STRAGGLER, tmp_path / "run")
    s = json.loads((run / "summary.json").read_text())
    s["step_cv"] = 0.0857  # what an older version wrote
    (run / "summary.json").write_text(json.dumps(s))
    _, md_p = write_report(run, tmp_path / "r")
    md = md_p.read_text()
    rows = report_metrics(md)
    assert [v for k, v in rows if k == "step_cv"] == [fmt(3 / 124.5)]
    assert "summary.json's step_cv (0.0857) differs from the value recomputed from the files" in md
    df = compare([run, STRAGGLER])
    r = df[df["metric"] == "step_cv"]
    assert len(r) == 1 and r["source"].iloc[0] == "data" and r.iloc[0, 2] == pytest.approx(3 / 124.5)


def test_two_runs_side_by_side_match_each_runs_summary():
    df = compare([RUNS / "small_collective", STRAGGLER])
    for name in ("small_collective", "straggler_collective"):
        vals = asum.summarize(RUNS / name)
        col = dict(zip(df["metric"], df[name]))
        for k, (v, _src) in vals.items():
            assert same(col[k], float(v)), (name, k)


def test_busbw_factor_is_one_definition():
    """traffic.schedule's factor is analysis.metrics' (nccl-tests: gather/scatter (n-1)/n, sendrecv 1)."""
    from traffic.schedule import busbw_factor as sched_factor

    for coll in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "gather", "scatter",
                 "pipeline", "incast", "sendrecv", "all_reduce"):
        for n in (2, 3, 8):
            assert sched_factor(coll, n) == m.busbw_factor(coll, n), (coll, n)
    assert m.busbw_factor("gather", 4) == pytest.approx(0.75) and m.busbw_factor("scatter", 4) == pytest.approx(0.75)
    assert m.busbw_factor("pipeline", 4) == 1.0 and m.busbw_factor("incast", 8) == pytest.approx(7 / 8)
