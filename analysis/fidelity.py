"""Did the emulation keep up? The checks behind a summary's ``fidelity_ok`` and ``fidelity_reasons``.

A software fabric on shared CPUs can stop modelling the network without failing: a busy CPU delays forwarding and
shaping, a late sampler misses the queue's peaks, a shaper that is not in control lets more through than its rate,
and a bottleneck that never fills measures the hosts rather than the queue. Each check takes numbers the run
measured and returns one line saying what went wrong, or None; :func:`reasons` keeps the lines, in order.
"""

from __future__ import annotations

import math

__all__ = ["CPU_BUSY_MAX", "cpu_busy", "goodput_below", "reasons", "sampling_too_slow", "shaper_over_rate"]

#: above this mean busy fraction the run's timings say more about the CPU than about the emulated network
CPU_BUSY_MAX = 0.9


def cpu_busy(busy_fraction: float | None, limit: float = CPU_BUSY_MAX) -> str | None:
    """The host CPUs were busier than ``limit`` on average while the run sampled them."""
    if busy_fraction is not None and busy_fraction > limit:
        return f"CPU {busy_fraction:.0%} busy: the emulation may not have kept up"
    return None


def goodput_below(goodput_mbps: float, rate_mbps: float, fraction: float = 0.8) -> str | None:
    """The flows delivered less than ``fraction`` of the bottleneck's rate: the queue under study never ran full."""
    if goodput_mbps < fraction * rate_mbps:
        return f"goodput {goodput_mbps:.1f} Mbit/s below {fraction:.0%} of the {rate_mbps} Mbit/s bottleneck"
    return None


def sampling_too_slow(achieved_s: float, asked_s: float, slack: float = 5.0) -> str | None:
    """The queue sampler's achieved interval (NaN: too few samples) was more than ``slack`` times the one asked."""
    if math.isnan(achieved_s) or achieved_s > slack * asked_s:
        return f"queue sampling achieved {achieved_s * 1e3:.2f} ms, asked {asked_s * 1e3:.2f} ms"
    return None


def shaper_over_rate(utilisation: float, limit: float = 1.05) -> str | None:
    """A port sent more than ``limit`` times its configured rate (bytes sent / busy time / rate)."""
    if utilisation > limit:
        return f"bottleneck sent {utilisation:.2f} x its configured rate: shaper not in control"
    return None


def reasons(*found: str | None) -> list[str]:
    """The checks' lines that report something: ``reasons(cpu_busy(b), goodput_below(g, r))``; empty = faithful."""
    return [r for r in found if r]
