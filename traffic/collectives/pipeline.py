"""Point-to-point pipeline: stage i sends to stage i+1 (pipeline-parallel activations), ``chunks`` micro-batches."""

from __future__ import annotations

from ..schedule import Schedule, ScheduleBuilder
from .broadcast import chain

__all__ = ["pipeline_chain"]


def pipeline_chain(ranks: int, count: int, *, dtype: str, chunks: int, params: dict) -> Schedule:
    """Pipeline-parallel forward pass: stage 0 sends its input to stage 1, each stage forwards what it got to
    the next, micro-batch by micro-batch (``chunks``), so stage i+1 works on micro-batch k while stage i sends
    k+1.  No compute is modelled: a stage forwards its input unchanged.  Stage 0's output is empty."""
    b = ScheduleBuilder(ranks)
    chain(b, list(range(ranks)), count, chunks, first_keeps=False, name="stage")
    bufs = [{"input": count, "output": 0 if r == 0 else count} for r in range(ranks)]
    return b.build(collective="pipeline", algorithm="chain", count=count, dtype=dtype, buffers=bufs, params=params)
