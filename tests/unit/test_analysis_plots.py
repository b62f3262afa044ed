"""analysis.plots: every function writes a non-empty PNG and returns its path."""

from pathlib import Path

import pytest

from analysis import metrics as m
from analysis import plots
from analysis.load import empty_frame, load_run

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run():
    return load_run(RUNS / "small_collective")


def _ok(p, expected):
    assert Path(p) == expected and expected.stat().st_size > 1000
    assert expected.read_bytes()[:8] == PNG


def test_cdf(run, tmp_path):
    cct = m.op_table(run.ops).cct_s * 1e3
    _ok(plots.plot_cdf(cct, tmp_path / "cdf.png"), tmp_path / "cdf.png")
    rounds = m.round_times(run.rounds).round_s * 1e3
    _ok(plots.plot_cdf({"cct": cct, "round": rounds, "none": []}, tmp_path / "sub" / "cdf2.png"),
        tmp_path / "sub" / "cdf2.png")
    _ok(plots.plot_cdf([], tmp_path / "empty.png"), tmp_path / "empty.png")


def test_queue_occupancy(run, tmp_path):
    out = tmp_path / "q.png"
    _ok(plots.plot_queue_occupancy(run.queues, out, ops=m.op_table(run.ops)), out)
    _ok(plots.plot_queue_occupancy(run.queues, tmp_path / "q1.png", ports=["leaf1:eth3"]), tmp_path / "q1.png")
    _ok(plots.plot_queue_occupancy(empty_frame("queues"), tmp_path / "q0.png"), tmp_path / "q0.png")


def test_pause_timeline(run, tmp_path):
    out = tmp_path / "p.png"
    _ok(plots.plot_pause_timeline(run.pfc, out, run_end=run.time_window()[1], t0=run.time_window()[0]), out)
    _ok(plots.plot_pause_timeline(empty_frame("pfc"), tmp_path / "p0.png"), tmp_path / "p0.png")


def test_metric_vs_param(tmp_path):
    out = tmp_path / "sweep.png"
    _ok(plots.plot_metric_vs_param([1, 2, 4, 8], {"p50": [1, 2, 3, 4], "p99": [2, 5, 9, 20]}, out,
                                   xlabel="senders", ylabel="round time (ms)", logx=True), out)
    _ok(plots.plot_metric_vs_param([1, 2], [0.1, 0.2], tmp_path / "s1.png"), tmp_path / "s1.png")


def test_scaling_bars(tmp_path):
    out = tmp_path / "scale.png"
    _ok(plots.plot_scaling_efficiency(["2->4", "4->8", "8->16", "bad"], [0.95, 0.78, 0.6, float("nan")], out), out)
