"""Answers with their uncertainty: a metric over repeated runs as a median with a 95% interval, and whether two sets
of runs differ. Every claim the project makes from runs (a test's comparison, a lab's statement, `compare`'s
verdict) is computed here, with scipy.stats, so that it has one definition.

* :func:`estimate` — the median of n runs with a distribution-free confidence interval (order statistics, the
  binomial argument behind ``scipy.stats.quantile_test``): no assumption that run times are normal, which they are
  not (a round hit by RTOmin is 200 ms late, not a little late). With few runs the interval cannot reach 95%: it is
  then ``[min, max]`` and says its real coverage (5 runs: 93.8%; 6 runs: 96.9%).
* :func:`compare` — two sets of runs: each side's estimate, the ratio of medians with a bootstrap interval
  (``scipy.stats.bootstrap``, percentile method, a fixed random state so a verdict is reproducible) and a
  Mann-Whitney U test. A difference is stated (``A > B`` / ``A < B``) only when the test rejects "same distribution"
  at the level *and* the ratio's interval excludes 1; otherwise ``not distinguishable (n runs)``, with about how
  many runs per side would tell a difference of the size seen.

With fewer than 4 runs a side no two-sided rank test can reach p < 0.05 (3 vs 3: the smallest p is 0.1), so such a
comparison is never a verdict.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np

LEVEL = 0.95
#: the fewest runs per side for which a two-sided Mann-Whitney test can reach p < 0.05 (4 vs 4: p = 2/70 = 0.029)
MIN_RUNS_FOR_VERDICT = 4


def _st():
    """scipy.stats, imported at its first use: it takes ~0.5 s, and every `testbed` command imports this module (the
    runner's repeats, the canary's rules), also one that only refuses bad input in one line."""
    from scipy import stats

    return stats


def _clean(values: Iterable[float]) -> np.ndarray:
    arr = np.asarray([float(v) for v in values if v is not None], dtype=float)
    return arr[np.isfinite(arr)]


@dataclass(frozen=True)
class Estimate:
    """The median of n runs and its confidence interval ``[low, high]`` at ``coverage`` (>= level when n allows)."""
    median: float
    low: float
    high: float
    n: int
    cv: float | None        # coefficient of variation (sample std / mean), None below 2 runs or at mean 0
    coverage: float         # the interval's real coverage: order statistics give discrete levels

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self, fmt: str = "{:.4g}") -> str:
        if self.n == 0:
            return "no runs"
        if self.n == 1:
            return f"{fmt.format(self.median)} (1 run, no interval)"
        return (f"{fmt.format(self.median)} [{fmt.format(self.low)}, {fmt.format(self.high)}] "
                f"({self.n} runs, {self.coverage:.0%} CI)")


def median_interval(sorted_values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """Distribution-free interval for the median: ``[x_(k), x_(n-k+1)]`` with the largest k whose coverage
    ``1 - 2 P(Binomial(n, 1/2) < k)`` is still >= level; below that many runs, ``[min, max]`` with its coverage."""
    x = list(sorted_values)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0.0
    best_k = 1
    for k in range(1, n // 2 + 1):
        cov = 1.0 - 2.0 * _st().binom.cdf(k - 1, n, 0.5)
        if cov >= level:
            best_k = k
        else:
            break
    coverage = 1.0 - 2.0 * _st().binom.cdf(best_k - 1, n, 0.5)
    return x[best_k - 1], x[n - best_k], float(coverage)


def estimate(values: Iterable[float], level: float = LEVEL) -> Estimate:
    """The median of ``values`` (one per run) with its confidence interval, n and coefficient of variation."""
    arr = np.sort(_clean(values))
    n = int(arr.size)
    if n == 0:
        return Estimate(math.nan, math.nan, math.nan, 0, None, 0.0)
    med = float(np.median(arr))
    low, high, coverage = median_interval(arr.tolist(), level)
    mean = float(arr.mean())
    cv = float(arr.std(ddof=1) / abs(mean)) if n >= 2 and mean != 0 else None
    return Estimate(med, float(low), float(high), n, cv, coverage)


@dataclass(frozen=True)
class Difference:
    """Two sets of runs compared: A's and B's estimates, the ratio of medians A/B with its interval, the rank
    test's p-value and the verdict (``A > B``, ``A < B`` or ``not distinguishable (n runs)``)."""
    a: Estimate
    b: Estimate
    ratio: float
    ratio_low: float
    ratio_high: float
    p_value: float
    verdict: str
    runs_needed: int | None   # about how many runs a side would tell a difference of the size seen (None: told)

    @property
    def distinguishable(self) -> bool:
        return self.verdict in ("A > B", "A < B")

    def as_dict(self) -> dict:
        return {"a": self.a.as_dict(), "b": self.b.as_dict(), "ratio": self.ratio, "ratio_low": self.ratio_low,
                "ratio_high": self.ratio_high, "p_value": self.p_value, "verdict": self.verdict,
                "runs_needed": self.runs_needed}


def _ratio_interval(a: np.ndarray, b: np.ndarray, level: float) -> tuple[float, float]:
    """Bootstrap interval of median(a) / median(b), resampling each side on its own (independent runs)."""
    if a.size < 2 or b.size < 2:
        return math.nan, math.nan

    def ratio(x, y, axis=-1):
        mx, my = np.median(x, axis=axis), np.median(y, axis=axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(my == 0, np.where(mx == 0, 1.0, np.inf), mx / np.where(my == 0, 1, my))

    with np.errstate(divide="ignore", invalid="ignore"):
        res = _st().bootstrap((a, b), ratio, paired=False, vectorized=True, confidence_level=level,
                            n_resamples=4000, method="percentile", random_state=np.random.default_rng(20261204))
    ci = res.confidence_interval
    return float(ci.low), float(ci.high)


def runs_needed(a: np.ndarray, b: np.ndarray, level: float = LEVEL, power: float = 0.8) -> int | None:
    """About how many runs per side a two-sided rank test needs to tell apart two distributions whose medians differ
    as much as these do, with this spread: the normal-approximation sample size for a difference of means, divided
    by the rank test's asymptotic efficiency (3/pi against the t-test). None when the medians are equal."""
    if a.size < 2 or b.size < 2:
        return None
    delta = abs(float(np.median(a)) - float(np.median(b)))
    spread = math.sqrt((float(np.var(a, ddof=1)) + float(np.var(b, ddof=1))) / 2)
    if delta == 0:
        return None
    if spread == 0:
        return MIN_RUNS_FOR_VERDICT
    z = _st().norm.ppf(1 - (1 - level) / 2) + _st().norm.ppf(power)
    n = 2 * (z * spread / delta) ** 2 / (3 / math.pi)
    return max(MIN_RUNS_FOR_VERDICT, int(math.ceil(n)))


def compare(a_values: Iterable[float], b_values: Iterable[float], level: float = LEVEL) -> Difference:
    """Is A different from B? Each a list of one metric's values, one per run."""
    a, b = _clean(a_values), _clean(b_values)
    ea, eb = estimate(a, level), estimate(b, level)
    if a.size == 0 or b.size == 0:
        return Difference(ea, eb, math.nan, math.nan, math.nan, math.nan, "no runs", None)
    ratio = (ea.median / eb.median) if eb.median != 0 else (1.0 if ea.median == 0 else math.inf)
    low, high = _ratio_interval(a, b, level)
    if a.size >= 2 and b.size >= 2 and not (np.all(a == a[0]) and np.all(b == a[0])):
        p = float(_st().mannwhitneyu(a, b, alternative="two-sided", method="auto").pvalue)
    else:
        p = 1.0
    alpha = 1 - level
    n = min(a.size, b.size)
    told = (p < alpha and not (math.isnan(low) or math.isnan(high)) and (low > 1 or high < 1 or
            (eb.median == 0 and ea.median > 0 and low > 1)))
    if told:
        verdict = "A > B" if ea.median > eb.median else "A < B"
        need = None
    else:
        verdict = f"not distinguishable ({n} runs)" if a.size == b.size else \
            f"not distinguishable ({a.size} vs {b.size} runs)"
        need = runs_needed(a, b, level)
    return Difference(ea, eb, float(ratio), low, high, p, verdict, need)
