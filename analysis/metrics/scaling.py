"""Scaling efficiency between N and kN ranks and its verdict (the seed article's 75-80% bar)."""

from __future__ import annotations

import math
from dataclasses import dataclass



@dataclass(frozen=True)
class ScalingResult:
    """Scaling efficiency between N and kN ranks with its verdict (poor / marginal / good)."""

    mode: str
    k: float
    efficiency: float
    verdict: str


#: The seed article's bar: 75-80% scaling efficiency.
POOR_BELOW = 0.75
GOOD_ABOVE = 0.80


def scaling_verdict(eff: float) -> str:
    """``poor`` below 0.75, ``marginal`` for 0.75 <= eff <= 0.80, ``good`` above 0.80, ``n/a`` for nan."""
    if eff is None or math.isnan(eff):
        return "n/a"
    if eff < POOR_BELOW:
        return "poor"
    if eff <= GOOD_ABOVE:
        return "marginal"
    return "good"


def scaling_efficiency(t_n: float, t_kn: float, k: float, mode: str = "weak") -> ScalingResult:
    """Scaling efficiency from step times at N ranks (``t_n``) and at kN ranks (``t_kn``).

    Both are ``achieved throughput at kN / (k * throughput at N)``:

    * weak scaling (per-rank work W fixed, throughput = N*W/T): ``eff = T_N / T_kN``
    * strong scaling (total work W fixed, throughput = W/T):    ``eff = T_N / (k * T_kN)``

    Pass a tail-aware statistic of the step time (e.g. the median; compare p99 too).
    """
    if mode not in ("weak", "strong"):
        raise ValueError(f"mode must be 'weak' or 'strong', got {mode!r}")
    if k <= 0:
        raise ValueError(f"k must be > 0, got {k}")
    if not (t_n > 0 and t_kn > 0):
        eff = math.nan
    else:
        eff = t_n / t_kn if mode == "weak" else t_n / (k * t_kn)
    return ScalingResult(mode, float(k), float(eff), scaling_verdict(eff))
