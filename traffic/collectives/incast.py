"""Gather-style incast: every rank sends its input to one root at once (the classic incast pattern)."""

from __future__ import annotations

from ..schedule import Schedule, ScheduleBuilder
from ._common import pieces

__all__ = ["direct_gather"]


def direct_gather(ranks: int, count: int, *, dtype: str, chunks: int, params: dict, root: int = 0) -> Schedule:
    """All ranks send to ``root`` concurrently (a many-to-one incast); piece k of every sender is received in the
    root's step k, into block i of its ``output`` (n x count, rank order).  Non-root outputs are empty."""
    n = ranks
    b = ScheduleBuilder(n)
    prev: dict[int, tuple[int, int] | None] = {}
    for k, (off, cnt) in enumerate(pieces(0, count, chunks)):
        h = {}
        for r in range(n):
            h[r] = b.step(r, [prev.get(r)], label=f"incast k={k}")
            prev[r] = h[r]
        b.local(h[root], ("input", off, cnt), ("output", root * count + off, cnt))
        for r in range(n):
            if r != root:
                b.transfer(h[r], ("input", off, cnt), h[root], ("output", r * count + off, cnt))
    bufs = [{"input": count, "output": n * count if r == root else 0} for r in range(n)]
    return b.build(collective="gather", algorithm="direct", count=count, dtype=dtype, buffers=bufs, root=root,
                   params=params)
