"""analysis.stats: the median's distribution-free interval (known answers, its coverage) and the comparison of two
sets of runs (a clear difference is told, two samples of one distribution are not)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import stats


def test_estimate_known_answers_for_small_n():
    # 5 runs: no order-statistic interval reaches 95%; [min, max] covers 1 - 2/2^5 = 93.75%
    e = stats.estimate([3.0, 1.0, 5.0, 2.0, 4.0])
    assert (e.median, e.low, e.high, e.n) == (3.0, 1.0, 5.0, 5)
    assert e.coverage == pytest.approx(1 - 2 / 32)
    assert e.cv == pytest.approx(np.std([1, 2, 3, 4, 5], ddof=1) / 3)
    # 6 runs: [min, max] covers 1 - 2/64 = 96.9%; the median of an even count is the mean of the middle two
    e = stats.estimate([1, 2, 3, 4, 5, 60])
    assert (e.median, e.low, e.high) == (3.5, 1, 60) and e.coverage == pytest.approx(1 - 2 / 64)
    # 10 runs: [x(2), x(9)] covers 1 - 2 P(Bin(10, 1/2) <= 1) = 1 - 22/1024 = 97.9%; [x(3), x(8)] would be 89%
    e = stats.estimate(range(1, 11))
    assert (e.low, e.high) == (2, 9) and e.coverage == pytest.approx(1 - 22 / 1024)
    # 1 run: a number without an interval; no runs: nothing
    e = stats.estimate([7.0])
    assert (e.median, e.low, e.high, e.n, e.cv) == (7.0, 7.0, 7.0, 1, None) and "no interval" in e.text()
    e = stats.estimate([])
    assert e.n == 0 and math.isnan(e.median) and e.text() == "no runs"
    # a run without the value (None, nan) is not a run
    assert stats.estimate([1.0, None, float("nan"), 3.0]).n == 2
    assert stats.estimate([2.0, 2.0]).cv == 0.0 and stats.estimate([0.0, 0.0]).cv is None
    assert stats.Estimate(**stats.estimate([1, 2, 3]).as_dict()) == stats.estimate([1, 2, 3])


@pytest.mark.parametrize("n", [5, 10, 20])
def test_the_order_statistic_interval_covers_the_true_median_as_often_as_it_says(n):
    """Run times are skewed (a lognormal here, median 1): the interval must still cover the true median in its
    stated share of trials. 4000 trials: the standard error of the share is below 0.4 points."""
    rng = np.random.default_rng(25)
    samples = rng.lognormal(mean=0.0, sigma=1.0, size=(4000, n))
    hits, stated = 0, None
    for row in samples:
        e = stats.estimate(row)
        hits += e.low <= 1.0 <= e.high
        stated = e.coverage
    assert hits / len(samples) == pytest.approx(stated, abs=0.015)
    assert stated >= (0.95 if n >= 6 else 0.93)


def test_a_clear_difference_is_told_with_its_ratio():
    d = stats.compare([10, 11, 12, 13, 14], [5, 5.5, 6, 6.5, 7])
    assert d.verdict == "A > B" and d.distinguishable and d.runs_needed is None
    assert d.ratio == pytest.approx(2.0) and 1 < d.ratio_low < 2 < d.ratio_high
    assert d.p_value == pytest.approx(2 / 252)  # exact Mann-Whitney: complete separation of 5 and 5
    r = stats.compare([5, 5.5, 6, 6.5, 7], [10, 11, 12, 13, 14])
    assert r.verdict == "A < B" and r.ratio_high < 1
    assert set(d.as_dict()) == {"a", "b", "ratio", "ratio_low", "ratio_high", "p_value", "verdict", "runs_needed"}


def test_three_runs_a_side_can_never_tell():
    d = stats.compare([1, 2, 3], [7, 8, 9])  # separated, but 3 vs 3 cannot reach p < 0.05 (smallest p = 0.1)
    assert d.verdict == "not distinguishable (3 runs)" and d.p_value == pytest.approx(0.1)
    assert d.runs_needed == stats.MIN_RUNS_FOR_VERDICT
    # 3 vs 4: smallest p = 2/35 = 0.057; 3 vs 5 can tell (2/56 = 0.036)
    assert stats.compare([1, 2, 3], [7, 8, 9, 10]).verdict == "not distinguishable (3 vs 4 runs)"
    assert stats.compare([1, 2, 3], [7, 8, 9, 10, 11]).verdict == "A < B"
    assert stats.compare([], [1, 2]).verdict == "no runs"


def test_two_samples_of_one_distribution_are_not_distinguishable():
    rng = np.random.default_rng(7)
    d = stats.compare(rng.normal(100, 10, 8), rng.normal(100, 10, 8))
    assert d.verdict == "not distinguishable (8 runs)" and d.ratio_low < 1 < d.ratio_high
    assert d.runs_needed is not None and d.runs_needed >= stats.MIN_RUNS_FOR_VERDICT
    # and rarely otherwise: over 300 pairs of 5 runs the false "difference" rate stays near the rank test's size
    # (exact two-sided Mann-Whitney at 5% for 5 vs 5: 8/252 = 3.2%)
    told = sum(stats.compare(rng.lognormal(0, 0.5, 5), rng.lognormal(0, 0.5, 5)).distinguishable
               for _ in range(300))
    assert told / 300 <= 0.07
    same = stats.compare([4.0] * 5, [4.0] * 5)
    assert not same.distinguishable and same.ratio == 1.0 and same.runs_needed is None


def test_runs_needed_grows_as_the_difference_shrinks():
    rng = np.random.default_rng(11)
    base = rng.normal(100, 10, 6)
    wide = stats.runs_needed(base, base * 1.05)
    narrow = stats.runs_needed(base, base * 1.01)
    assert stats.MIN_RUNS_FOR_VERDICT <= wide < narrow
    # a difference of one standard deviation: about 2 (1.96 + 0.84)^2 / 0.955 = 16.4 -> 17 runs a side
    sd = math.sqrt(4 / 3)  # the sample standard deviation of -1, 1, -1, 1
    assert stats.runs_needed(np.array([-1.0, 1.0, -1.0, 1.0]), np.array([-1.0, 1.0, -1.0, 1.0]) + sd) == 17
