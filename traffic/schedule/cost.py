"""The alpha-beta cost model of a collective: nccl-tests' bus-bandwidth factor and message size, and the lower
bound on a collective's time over links of a given rate and latency (Chan et al. 2007)."""

from __future__ import annotations

import math

from .base import ScheduleError, check_int

_FACTOR_ALIASES = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "all_to_all": "alltoall",
    "incast": "gather",
    "sendrecv": "pipeline",
}


def _canon(collective: str) -> str:
    c = str(collective).lower().replace("-", "_")
    return _FACTOR_ALIASES.get(c, c)


#: nccl-tests bus-bandwidth factors as functions of the rank count n: the share of the nccl-tests "size" the
#: busiest rank's link carries. analysis.metrics.BUSBW_FACTORS holds the same table for the busbw it computes from
#: ops.csv: traffic may not import analysis nor analysis traffic, and the one package both may import (topologies)
#: is the shape of a network, which analysis must not load; tests/unit/test_metric_agreement.py pins the two equal.
BUSBW_FACTORS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "pipeline": lambda n: 1.0,
}


def _factor_key(collective: str) -> str:
    """The table's key for a schedule's spelling: case, ``_``, ``-`` and spaces ignored, incast = gather and
    sendrecv = pipeline (as analysis.metrics matches names)."""
    key = _canon(collective).replace("_", "").replace(" ", "")
    return _FACTOR_ALIASES.get(key, key)


def busbw_factor(collective: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor, algbw = nccl-tests size / time.

    Where each factor comes from: :func:`analysis.metrics.busbw_factor`'s docstring (nccl-tests' PERFORMANCE.md and
    each test's ``*GetBw``). Accepts the schedule's aliases and raises :class:`ScheduleError`. The matching "size"
    is :func:`nccl_size_bytes`.
    """
    n = check_int("ranks", ranks, 1)
    key = _factor_key(collective)
    if key not in BUSBW_FACTORS:
        raise ScheduleError(f"no bus-bandwidth factor for collective {collective!r}")
    return float(BUSBW_FACTORS[key](n))


def nccl_size_bytes(collective: str, ranks: int, message_bytes: int) -> int:
    """The "size" nccl-tests would print for a run where each rank's input is ``message_bytes``.

    nccl-tests reports allgather and gather by their total (gathered) size, n x the per-rank input; all
    other collectives by the per-rank input size.
    """
    n = check_int("ranks", ranks, 1)
    m = check_int("message_bytes", message_bytes, 1)
    c = _canon(collective)
    busbw_factor(c, n)  # rejects unknown names
    return n * m if c in ("allgather", "gather") else m


def alpha_beta_bound_s(
    collective: str, ranks: int, message_bytes: int, link_bytes_per_s: float, latency_s: float
) -> float:
    """Alpha-beta lower bound (seconds) for ``collective`` when each rank's input is ``message_bytes``.

    Model: every rank has one full-duplex link of ``link_bytes_per_s``; every message costs ``latency_s``.
    Bound = latency term + bandwidth term, as in Chan et al. 2007 (no compute term): the bandwidth term is
    the minimum bytes the busiest link must carry (= nccl_size * busbw_factor / B); the latency term is
    ceil(log2 n) * alpha (any collective that combines or spreads n ranks' data needs that many rounds),
    except pipeline, whose last stage is n-1 hops from the first ((n-1) * alpha).
    """
    n = check_int("ranks", ranks, 1)
    m = check_int("message_bytes", message_bytes, 1)
    if not isinstance(link_bytes_per_s, (int, float)) or isinstance(link_bytes_per_s, bool) or not link_bytes_per_s > 0:
        raise ScheduleError(f"link_bytes_per_s must be a positive number, got {link_bytes_per_s!r}")
    if not isinstance(latency_s, (int, float)) or isinstance(latency_s, bool) or not latency_s >= 0:
        raise ScheduleError(f"latency_s must be a number >= 0, got {latency_s!r}")
    c = _canon(collective)
    bw = nccl_size_bytes(c, n, m) * busbw_factor(c, n) / float(link_bytes_per_s)
    hops = (n - 1) if c == "pipeline" else math.ceil(math.log2(n)) if n > 1 else 0
    return hops * float(latency_s) + bw
