"""analysis.budget: the failure budget's models, verdicts and knees (pure logic), and `testbed budget`'s bad input
(one line, exit status 2, nothing created)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analysis import budget

ROOT = Path(__file__).resolve().parent.parent.parent


def test_jitter_model_is_the_mean_of_the_slowest_ranks_uniform_compute():
    rng = np.random.default_rng(1)
    c, n, j = 60.0, 8, 0.5
    draws = rng.uniform(c * (1 - j), c * (1 + j), size=(200_000, n)).max(axis=1).mean()
    assert budget.expected_step_jitter_ms(10.0, c, n, j) == pytest.approx(10.0 + draws - c, rel=2e-3)
    assert budget.expected_step_jitter_ms(10.0, c, 1, j) == 10.0  # one rank waits for nobody


def test_straggler_model_counts_steps_where_any_straggler_straggles():
    assert budget.expected_step_straggler_ms(100.0, 50.0, 0.0, 3.0, 2) == 100.0
    assert budget.expected_step_straggler_ms(100.0, 50.0, 1.0, 3.0, 2) == 200.0
    assert budget.expected_step_straggler_ms(100.0, 50.0, 0.5, 3.0, 2) == pytest.approx(100.0 + 0.75 * 100.0)


@pytest.mark.parametrize("low,high,want", [(0.8, 0.9, budget.ABSORBED), (0.75, 0.9, budget.ABSORBED),
                                           (0.6, 0.74, budget.OVER), (0.7, 0.8, budget.NEAR)])
def test_verdict_against_the_bar(low, high, want):
    assert budget.verdict(low, high, 0.75) == want


def _pt(value, verdict, axis="jitter"):
    return budget.Point(axis, value, 100.0, 0.8, 0.7, 0.9, 0.8, verdict, 3)


def test_knee_is_the_last_absorbed_value_before_the_first_that_is_not():
    pts = [_pt(0.1, budget.ABSORBED), _pt(0.2, budget.ABSORBED), _pt(0.4, budget.NEAR), _pt(0.6, budget.OVER),
           _pt(0.8, budget.ABSORBED)]
    b = budget.budget(pts)
    assert (b.absorbed, b.unsure, b.breaks) == (0.2, 0.4, 0.6)
    text = budget.describe(b, pts, 0.75, "compute jitter")
    assert text.startswith("The job absorbs compute jitter up to 0.2") and "falls below 0.75 at 0.6" in text
    assert "not yet told from the 0.75 bar at 0.4" in text


def test_nothing_absorbed_and_nothing_broken_are_said_plainly():
    none = [_pt(0.1, budget.OVER)]
    assert "absorbs none of the compute jitter swept" in budget.describe(budget.budget(none), none, 0.75,
                                                                         "compute jitter")
    fine = [_pt(0.1, budget.ABSORBED), _pt(0.3, budget.ABSORBED)]
    assert "stays above 0.75 over the whole sweep" in budget.describe(budget.budget(fine), fine, 0.75,
                                                                      "compute jitter")


def test_measure_uses_the_ratio_of_mean_steps_and_its_interval():
    p = budget.measure("jitter", 0.5, [100.0, 101.0, 99.0, 100.5, 99.5], [130.0, 131.0, 129.0, 130.5, 129.5],
                       125.0, 0.75)
    assert p.efficiency == pytest.approx(100.0 / 130.0)
    assert p.low <= p.efficiency <= p.high and p.verdict == budget.ABSORBED and p.runs == 5
    assert p.expected == pytest.approx(100.0 / 125.0)


def test_plot_writes_a_png(tmp_path):
    pts = [_pt(0.1, budget.ABSORBED), _pt(0.5, budget.OVER, "straggler_prob")]
    assert budget.plot(pts, 0.75, tmp_path / "b.png").stat().st_size > 5000


@pytest.mark.parametrize("args,says", [
    (["--set", "compute_ms=0"], "needs --set compute_ms"),
    (["--set", "compute_ms=50", "--jitter", "0.2,0.1"], "values must increase"),
    (["--set", "compute_ms=50", "--jitter", "1.2"], "every value must be in (0, 1)"),
    (["--set", "compute_ms=50", "--straggler-prob", "0.1"], "--straggler-prob needs --set stragglers"),
    (["--set", "compute_ms=50", "--repeat", "2"], "--repeat must be at least 3"),
    (["--set", "compute_ms=50", "--set", "jitter=0.1"], "the budget sweeps it itself"),
    (["--set", "compute_ms=50", "--bar", "1.5"], "--bar must be in (0, 1)"),
])
def test_bad_input_is_one_line_and_status_2_before_anything_exists(tmp_path, args, says):
    out = tmp_path / "never"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "budget", *args, "--out", str(out)],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()
