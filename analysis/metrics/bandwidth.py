"""Bandwidth: nccl-tests' algorithm and bus bandwidth (with the bus-bandwidth factor of each collective), goodput
and the max-min fair share of a link."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


#: nccl-tests bus-bandwidth factors, as functions of the rank count n. traffic.schedule's cost model holds the same
#: table (analysis imports no traffic, traffic no analysis); tests/unit/test_metric_agreement.py pins the two equal.
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

#: other spellings of the same collectives (the scenario's aliases): an incast is a gather to one root, a
#: pipeline is a chain of send/recv pairs (nccl-tests' sendrecv)
_COLLECTIVE_ALIASES = {"incast": "gather", "sendrecv": "pipeline"}


def _norm_collective(name: str) -> str:
    key = str(name).lower().replace("_", "").replace("-", "").replace(" ", "")
    return _COLLECTIVE_ALIASES.get(key, key)


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests factor turning algbw into busbw for ``collective`` over ``n`` ranks: ``busbw = algbw * factor``
    with ``algbw = size / time`` and ``size`` the message size nccl-tests prints.

    The factor makes busbw comparable with the link rate: it is the share of ``size`` that the busiest rank's
    link must carry, whatever the algorithm (nccl-tests' PERFORMANCE.md and the ``*GetBw`` function of each
    test in its ``src/``):

    * allreduce ``2(n-1)/n`` (a reduce-scatter then an all-gather);
    * allgather, reducescatter, alltoall ``(n-1)/n`` (every rank receives / sends all but its own share);
    * **gather and scatter ``(n-1)/n``**: nccl-tests' gather.cu / scatter.cu compute ``baseBw = count * nranks *
      typesize / time`` (the *total* gathered or scattered size) and multiply it by ``(nranks-1)/nranks``: the
      root's link carries every rank's part but its own. (An earlier copy here had no gather/scatter and gave nan.)
    * broadcast, reduce ``1``; **pipeline (sendrecv) ``1``**: nccl-tests' sendrecv.cu uses factor 1, every rank
      sends and receives the whole message once.

    Names are matched case-insensitively ignoring ``_``/``-``/spaces, with ``incast`` = gather and ``sendrecv`` =
    pipeline. ``ValueError`` for an unknown collective or ``n < 1``.
    """
    key = _norm_collective(collective)
    if key not in BUSBW_FACTORS:
        raise ValueError(f"no bus-bandwidth factor for collective {collective!r}; known: {sorted(BUSBW_FACTORS)}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"rank count must be an integer >= 1, got {n!r}")
    return float(BUSBW_FACTORS[key](int(n)))


def algbw(size_bytes: float, cct_s: float) -> float:
    """Algorithm bandwidth ``size / CCT`` in bytes/s (nan if CCT <= 0)."""
    return float(size_bytes) / cct_s if cct_s > 0 else math.nan


def busbw(algbw_Bps: float, collective: str, n: int) -> float:
    """Bus bandwidth ``algbw * factor(collective, n)`` in bytes/s."""
    return algbw_Bps * busbw_factor(collective, n)


def goodput(nbytes: float, seconds: float) -> float:
    """Application bytes delivered per second (nan if ``seconds <= 0``)."""
    return float(nbytes) / seconds if seconds > 0 else math.nan


def maxmin_share(victim_cap: float, other_caps: Sequence[float], link: float) -> float:
    """Max-min fair rate of one flow (the victim, capped at ``victim_cap`` by its own bottleneck) on a link of
    capacity ``link`` shared with flows capped at ``other_caps`` (water-filling; any rate unit)."""
    flows = sorted([(c, False) for c in other_caps] + [(victim_cap, True)])
    left = link
    for k, (cap, is_victim) in enumerate(flows):
        rate = min(cap, left / (len(flows) - k))
        if is_victim:
            return rate
        left -= rate
    return 0.0
