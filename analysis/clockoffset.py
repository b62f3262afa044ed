"""One clock across servers: how far a server's clock is from the reference server's, and how sure we are, from
NTP-style ping-pong exchanges (RFC 5905's on-wire calculation, with its minimum-delay filter).

Each exchange is four timestamps: the reference sends at ``t0`` (its clock), the server receives at ``t1`` and
replies at ``t2`` (the server's clock), the reference receives at ``t3`` (its clock). With ``offset`` = server
clock - reference clock and one-way delays ``d_fwd``, ``d_back`` >= 0::

    t1 = t0 + offset + d_fwd        t3 = t2 - offset + d_back

so every exchange bounds the offset: ``t2 - t3 <= offset <= t1 - t0``, an interval of width ``delay = (t3 - t0) -
(t2 - t1)`` (the round trip minus the server's turnaround) centred on ``theta = ((t1 - t0) + (t2 - t3)) / 2``.
That bound needs no assumption about the path; the centre is exact only when the two directions took equally long.
Any asymmetry (a queue on one direction, a scheduler stall between a packet's arrival and its timestamp) moves
theta by half the difference, never by more than delay / 2. Hence the minimum-delay filter: the exchanges that took
least time bound the offset most tightly, and a slow exchange (an outlier) only has a wide interval, so it is left
out rather than averaged in. More exchanges help only by making a fast one likelier; no count of them removes the
asymmetry of the fastest path (the estimate's uncertainty says how large it can be).

Timestamps are the clocks the run directory uses (``time.monotonic()``, CLOCK_MONOTONIC: seconds since each
machine's boot, so two machines' clocks differ by the difference of their uptimes). Two estimates, at a run's start
and end, give the clock's drift between them (:func:`between`); a model applied to a server's CSVs is
analysis.clockalign's job.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

#: the share of exchanges (the fastest) the minimum-delay filter keeps; at least MIN_KEPT of them
KEEP_FRACTION = 0.1
MIN_KEPT = 3


class ClockError(ValueError):
    """The exchanges cannot give an offset (none valid, or their bounds contradict each other). One line."""


@dataclass(frozen=True)
class Exchange:
    """One ping-pong: t0 sent and t3 received on the reference clock, t1 received and t2 replied on the server's."""

    t0: float
    t1: float
    t2: float
    t3: float

    @property
    def delay_s(self) -> float:
        """The round trip on the wire: (t3 - t0) minus the server's turnaround (t2 - t1)."""
        return (self.t3 - self.t0) - (self.t2 - self.t1)

    @property
    def theta_s(self) -> float:
        """The offset if both directions took equally long."""
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) / 2

    def valid(self) -> bool:
        """Finite, in causal order on each clock, and a non-negative round trip."""
        ts = (self.t0, self.t1, self.t2, self.t3)
        return all(math.isfinite(t) for t in ts) and self.t3 >= self.t0 and self.t2 >= self.t1 and self.delay_s >= 0


@dataclass(frozen=True)
class Offset:
    """A server's clock offset (server - reference, seconds) at reference time ``at_s``, within +- uncertainty_s.

    ``uncertainty_s`` is a bound, not a standard deviation: the true offset lies in [offset - u, offset + u] as long
    as the clocks did not step or drift apart by more than that while the exchanges ran. ``spread_s`` is how far the
    kept exchanges' centres lie apart: a spread near 2u or wider says the clock moved while they ran."""

    offset_s: float
    uncertainty_s: float
    at_s: float
    delay_min_s: float
    spread_s: float
    n: int            # valid exchanges
    n_kept: int       # the fastest, used for the estimate
    n_invalid: int    # exchanges dropped as non-causal or non-finite

    def as_dict(self) -> dict:
        return asdict(self)

    def to_reference(self, t_server_s: float) -> float:
        """A server timestamp on the reference clock."""
        return t_server_s - self.offset_s

    def text(self) -> str:
        return (f"offset {self.offset_s:+.6f} s +- {self.uncertainty_s * 1e6:.0f} us (min RTT "
                f"{self.delay_min_s * 1e6:.0f} us, {self.n_kept} of {self.n} exchanges kept)")


def estimate(exchanges: Iterable[Exchange | Sequence[float]], keep_fraction: float = KEEP_FRACTION) -> Offset:
    """The offset from ping-pong exchanges with the minimum-delay filter (see the module docstring).

    Keeps the fastest ``keep_fraction`` of the valid exchanges (at least MIN_KEPT, or all when fewer), and
    intersects their bounds ``[t2 - t3, t1 - t0]``: the estimate is that intersection's centre and the uncertainty
    its half-width. When the kept bounds do not overlap (a clock stepped or drifted faster than the exchanges'
    delays), falls back to the median of their centres with half the largest kept delay plus their spread as the
    uncertainty. Raises ClockError when no exchange is valid."""
    if not 0 < keep_fraction <= 1:
        raise ClockError(f"keep_fraction must be in (0, 1] (got {keep_fraction!r})")
    given = [e if isinstance(e, Exchange) else Exchange(*map(float, e)) for e in exchanges]
    good = [e for e in given if e.valid()]
    if not good:
        raise ClockError(f"no valid clock exchange among {len(given)} (each needs t0 <= t3, t1 <= t2, finite)")
    good.sort(key=lambda e: e.delay_s)
    kept = good[:max(min(MIN_KEPT, len(good)), math.ceil(keep_fraction * len(good)))]
    thetas = sorted(e.theta_s for e in kept)
    spread = thetas[-1] - thetas[0]
    low = max(e.t2 - e.t3 for e in kept)
    high = min(e.t1 - e.t0 for e in kept)
    if low <= high:
        offset, uncertainty = (low + high) / 2, (high - low) / 2
    else:
        offset = _median(thetas)
        uncertainty = max(e.delay_s for e in kept) / 2 + spread
    at = _median([(e.t0 + e.t3) / 2 for e in kept])
    return Offset(offset, uncertainty, at, kept[0].delay_s, spread, len(good), len(kept), len(given) - len(good))


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


@dataclass(frozen=True)
class ClockModel:
    """A server's offset as a straight line through two estimates (a run's start and end): a clock running at a
    slightly different rate (crystal error, tens of ppm; a software-emulated guest's timer, more) drifts linearly
    over a run of minutes. One estimate gives a constant model (drift 0)."""

    start: Offset
    end: Offset | None = None

    @property
    def drift_ppm(self) -> float:
        if self.end is None or self.end.at_s == self.start.at_s:
            return 0.0
        return (self.end.offset_s - self.start.offset_s) / (self.end.at_s - self.start.at_s) * 1e6

    @property
    def drift_bound_ppm(self) -> float:
        """The largest drift the two estimates allow (their offsets' change plus both bounds, over the time between
        them): a drift_ppm below this is not resolved, only bounded."""
        if self.end is None or self.end.at_s == self.start.at_s:
            return math.inf  # one estimate, or two at the same instant: drift is not bounded at all
        change = abs(self.end.offset_s - self.start.offset_s) + self.start.uncertainty_s + self.end.uncertainty_s
        return change / abs(self.end.at_s - self.start.at_s) * 1e6

    @property
    def uncertainty_s(self) -> float:
        """A bound on the model's error between the two estimates (a linear interpolation of two bounded values is
        bounded by the larger bound; outside them the drift is extrapolated and the bound is only nominal)."""
        return max(self.start.uncertainty_s, self.end.uncertainty_s if self.end else 0.0)

    def offset_at(self, t_reference_s: float) -> float:
        return self.start.offset_s + self.drift_ppm * 1e-6 * (t_reference_s - self.start.at_s)

    def to_reference(self, t_server_s: float) -> float:
        """A server timestamp on the reference clock (the model is evaluated at the server time less the start
        offset: the drift over the error of that guess is below a nanosecond for any real clock)."""
        return t_server_s - self.offset_at(t_server_s - self.start.offset_s)

    def as_dict(self) -> dict:
        return {"start": self.start.as_dict(), "end": self.end.as_dict() if self.end else None,
                "drift_ppm": self.drift_ppm, "drift_bound_ppm": self.drift_bound_ppm,
                "uncertainty_s": self.uncertainty_s}

    @classmethod
    def from_dict(cls, d: dict) -> "ClockModel":
        return cls(Offset(**d["start"]), Offset(**d["end"]) if d.get("end") else None)


def between(start: Offset, end: Offset) -> ClockModel:
    """The model through a run's start and end estimates."""
    return ClockModel(start, end)
