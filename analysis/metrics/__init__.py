"""Pure metric functions over the DataFrames of a run directory (see docs/analysis.md for definitions).

Every function takes DataFrames / numbers and returns numbers, small dataclasses or DataFrames; none reads
files or touches global state. Units: seconds, bytes, bytes per second (``_Bps``); fractions in [0, 1].
The lesson these encode: collective tail time, not link bandwidth, sets AI-cluster throughput, so prefer
:func:`percentiles` (p99, with its sample count) and :func:`scaling_efficiency` over means.

One module per family: ``samples`` (percentiles, cv), ``bandwidth`` (algbw, busbw, goodput), ``collectives``
(ops.csv, rounds.csv), ``queues`` (queues.csv), ``tcp`` (tcp.csv), ``pauses`` (pfc.csv), ``scaling``. Import from
``analysis.metrics``.
"""

from .bandwidth import BUSBW_FACTORS, algbw, busbw, busbw_factor, goodput, maxmin_share
from .collectives import (cct_split_vs_bound, comm_wait_fraction, group_ids, op_arrivals, op_table, rank_op_split,
                          rank_step_times, rank_timeline, round_times, step_times)
from .pauses import pause_fraction, pause_intervals, rate_by_pause_state
from .queues import LossRate, counter_deltas, ecn_mark_fraction, incast_loss_rate, port_counter_deltas, queue_stats
from .samples import PERCENTILES, Percentiles, cv, nearest_rank, percentiles
from .scaling import GOOD_ABOVE, POOR_BELOW, ScalingResult, scaling_efficiency, scaling_verdict
from .tcp import retransmit_rate, tcp_deltas

__all__ = [
    "BUSBW_FACTORS",
    "GOOD_ABOVE",
    "PERCENTILES",
    "POOR_BELOW",
    "LossRate",
    "Percentiles",
    "ScalingResult",
    "algbw",
    "busbw",
    "busbw_factor",
    "cct_split_vs_bound",
    "comm_wait_fraction",
    "counter_deltas",
    "cv",
    "ecn_mark_fraction",
    "goodput",
    "incast_loss_rate",
    "maxmin_share",
    "nearest_rank",
    "op_arrivals",
    "op_table",
    "pause_fraction",
    "pause_intervals",
    "percentiles",
    "port_counter_deltas",
    "queue_stats",
    "rate_by_pause_state",
    "retransmit_rate",
    "round_times",
    "scaling_efficiency",
    "scaling_verdict",
    "step_times",
    "rank_op_split",
    "group_ids",
    "rank_step_times",
    "rank_timeline",
    "tcp_deltas",
]
