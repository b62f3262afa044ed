"""Collective-communication schedules: the pure-logic model that per-host agents walk.

A :class:`Schedule` is a per-rank dependency DAG of :class:`Step` s (like htsim's send-done / receive-done
triggers), not a timetable.  Every rank owns named element buffers (numpy arrays of the schedule's dtype):

* ``input``  -- the rank's contribution, ``count`` elements, filled by the caller, never written by a schedule;
* ``output`` -- what the collective leaves on the rank (its size depends on collective and rank; may be 0);
* anything else (by convention ``scratch``) -- working space.

Every buffer except ``input`` starts zero-filled.  A step may start once all its dependencies (indices of
earlier steps of the same rank) are complete.  When a step starts, its ``local`` operations run first, in
order (``copy``: ``dst = src``; ``reduce``: ``dst += src``); then its sends and receives are all posted at
once.  A send is done when its data has left ``src``; a receive is done when the data is in ``dst`` (``copy``)
or has been summed into it (``reduce``).  The step is complete when every send and receive is done.  A send
from rank *a* to *b* with tag *t* matches exactly one receive on *b* from *a* with tag *t* and equal count.

See ``docs/schedules.md`` for the full model and the JSON format (``traffic/schedule_json.py``).

The parts: ``base`` (error, names, integer helpers), ``steps`` (regions, transfers, steps, rank programs),
``model`` (:class:`Schedule` and its global checks), ``simulate`` (the DAG driver and numpy simulator),
``reference`` (first-principles outputs and seeded inputs), ``builder`` (for generators), ``cost`` (alpha-beta
model and nccl-tests factors). Import from ``traffic.schedule``; the parts are its layout.
"""

from .base import (ACTIONS, COLLECTIVES, DTYPES, ROOTED_COLLECTIVES, ScheduleError, offsets_of, split_evenly,
                   stable_rng, stable_shuffle)
from .builder import ScheduleBuilder
from .cost import alpha_beta_bound_s, busbw_factor, nccl_size_bytes
from .model import Schedule
from .reference import expected_output, expected_output_sizes, expected_outputs, random_input, random_inputs
from .simulate import simulate
from .steps import Local, RankProgram, Recv, Region, Send, Step

__all__ = [
    "ScheduleError",
    "Region",
    "Send",
    "Recv",
    "Local",
    "Step",
    "RankProgram",
    "Schedule",
    "ScheduleBuilder",
    "COLLECTIVES",
    "ROOTED_COLLECTIVES",
    "DTYPES",
    "ACTIONS",
    "simulate",
    "expected_outputs",
    "expected_output_sizes",
    "expected_output",
    "random_input",
    "random_inputs",
    "split_evenly",
    "offsets_of",
    "busbw_factor",
    "nccl_size_bytes",
    "alpha_beta_bound_s",
    "stable_rng",
    "stable_shuffle",
]
