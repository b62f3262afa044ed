"""One sample's summary: nearest-rank percentiles (always an observed value, with the sample count that
says whether p99 is more than the max), the coefficient of variation, and the union length of intervals."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd


PERCENTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "p999": 0.999}


def nearest_rank(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile: the ``ceil(q * n)``-th smallest sample (1-based), ``nan`` if empty.

    Always an observed value. With ``n < 1 / (1 - q)`` samples it is the maximum: p99 of 10 samples is
    just the max, p99.9 needs more than 1000 samples to differ from it.
    """
    x = np.sort(np.asarray(list(values) if not isinstance(values, (np.ndarray, pd.Series)) else values,
                           dtype=float))
    x = x[~np.isnan(x)]
    if x.size == 0:
        return math.nan
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    k = max(1, math.ceil(round(q * x.size, 9)))  # round(): 0.95*20 must be 19, not 19.000000000000004
    return float(x[k - 1])


@dataclass(frozen=True)
class Percentiles:
    """Tail summary of a sample: nearest-rank p50/p95/p99/p99.9, max, mean and the sample count ``n``."""

    p50: float
    p95: float
    p99: float
    p999: float
    max: float
    mean: float
    n: int

    def resolves(self, q: float) -> bool:
        """True when the q-percentile is not simply the max, i.e. ``ceil(q * n) < n``."""
        return self.n > 0 and math.ceil(round(q * self.n, 9)) < self.n

    def as_dict(self) -> dict:
        return asdict(self)

    def scaled(self, factor: float) -> "Percentiles":
        """Same summary with every value multiplied (e.g. 1e3 for seconds -> milliseconds)."""
        return Percentiles(self.p50 * factor, self.p95 * factor, self.p99 * factor, self.p999 * factor,
                           self.max * factor, self.mean * factor, self.n)


def percentiles(values: Iterable[float]) -> Percentiles:
    """:class:`Percentiles` of ``values`` (NaNs ignored); all-NaN fields and ``n == 0`` if empty."""
    x = np.asarray(values if isinstance(values, (np.ndarray, pd.Series)) else list(values), dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return Percentiles(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0)
    return Percentiles(*(nearest_rank(x, q) for q in PERCENTILES.values()), float(x.max()), float(x.mean()),
                       int(x.size))


def cv(values: Iterable[float]) -> float:
    """Coefficient of variation ``std / mean`` with the sample std (ddof=1); nan for fewer than 2 values."""
    x = np.asarray(values if isinstance(values, (np.ndarray, pd.Series)) else list(values), dtype=float)
    x = x[~np.isnan(x)]
    if x.size < 2 or x.mean() == 0:
        return math.nan
    return float(x.std(ddof=1) / x.mean())


def _union_length(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Total length of the union of intervals clipped to [lo, hi]."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total
