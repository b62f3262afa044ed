"""Ring algorithms, as NCCL's ring does them: data in n segments, each step every rank sends to rank+1.

With ``chunks`` = c every segment is cut into c pieces and piece k of ring step s depends on piece k of step
s-1 (its data) and on piece k-1 of step s (so each link carries pieces in order): a pipelined ring.
"""

from __future__ import annotations

from ..schedule import Schedule, ScheduleBuilder
from ._common import pieces, segments

__all__ = ["ring_allreduce", "ring_allgather", "ring_reduce_scatter"]


def _reduce_scatter_phase(b: ScheduleBuilder, n: int, count: int, chunks: int, final_shift: int, allreduce: bool):
    """Ring reduce-scatter over n-1 steps; returns the last step handle per (rank, piece).

    At step s rank r sends segment (r - s + a) and receives segment (r - s - 1 + a), summing it with its own
    input (copied in by the step's local op) -- so after n-1 steps rank r owns segment (r + 1 + a) reduced.
    ``a`` = 0 for all-reduce (rank r ends with segment r+1), -1 for reduce-scatter (rank r ends with segment r).
    Partial sums live in ``output`` (all-reduce) or ``scratch`` (reduce-scatter, except the last receive which
    lands in the rank's own ``output`` slice).
    """
    a = final_shift
    segs = segments(count, n)
    last: dict[tuple[int, int], tuple[int, int] | None] = {(r, k): None for r in range(n) for k in range(chunks)}
    handles: dict[tuple[int, int, int], tuple[int, int]] = {}
    for s in range(n - 1):
        for r in range(n):
            for k in range(chunks):
                deps = [last[(r, k)], handles.get((r, s, k - 1))]
                handles[(r, s, k)] = b.step(r, deps, label=f"reduce-scatter s={s} k={k}")
                last[(r, k)] = handles[(r, s, k)]

    def where(r: int, seg: int, s: int, off: int, cnt: int) -> tuple[str, int, int]:
        if allreduce:
            return ("output", off, cnt)
        if s == n - 2:  # the final receive: the rank's own slice
            return ("output", off - segs[seg][0], cnt)
        return ("scratch", off, cnt)

    for s in range(n - 1):
        for r in range(n):
            right = (r + 1) % n
            send_seg = (r - s + a) % n
            for k, (off, cnt) in enumerate(pieces(*segs[send_seg], chunks)):
                src = ("input", off, cnt) if s == 0 else where(r, send_seg, s - 1, off, cnt)
                h_dst = handles[(right, s, k)]
                # the receiver first copies its own contribution into the destination, then sums into it
                dst = where(right, send_seg, s, off, cnt)
                b.local(h_dst, ("input", off, cnt), dst)
                b.transfer(handles[(r, s, k)], src, h_dst, dst, op="reduce")
    return last


def ring_allreduce(ranks: int, count: int, *, dtype: str, chunks: int, params: dict) -> Schedule:
    """Ring all-reduce as NCCL's ring algorithm does it: ring reduce-scatter then ring all-gather.

    2(n-1) steps (times ``chunks``); every rank sends and receives 2(n-1)/n of the message.
    """
    n = ranks
    b = ScheduleBuilder(n)
    segs = segments(count, n)
    last = _reduce_scatter_phase(b, n, count, chunks, 0, allreduce=True)
    handles: dict[tuple[int, int, int], tuple[int, int]] = {}
    for t in range(n - 1):
        for r in range(n):
            for k in range(chunks):
                handles[(r, t, k)] = b.step(r, [last[(r, k)], handles.get((r, t, k - 1))],
                                            label=f"all-gather t={t} k={k}")
                last[(r, k)] = handles[(r, t, k)]
    for t in range(n - 1):
        for r in range(n):
            right = (r + 1) % n
            seg = (r + 1 - t) % n
            for k, (off, cnt) in enumerate(pieces(*segs[seg], chunks)):
                b.transfer(handles[(r, t, k)], ("output", off, cnt), handles[(right, t, k)], ("output", off, cnt))
    bufs = [{"input": count, "output": count}] * n
    return b.build(collective="allreduce", algorithm="ring", count=count, dtype=dtype, buffers=bufs, params=params)


def ring_reduce_scatter(ranks: int, count: int, *, dtype: str, chunks: int, params: dict) -> Schedule:
    """Ring reduce-scatter as NCCL does it: n-1 steps, rank r ends with the r-th slice of the sum.

    Partial sums travel in ``scratch`` (count elements); each rank sends (n-1)/n of its input.
    """
    n = ranks
    b = ScheduleBuilder(n)
    _reduce_scatter_phase(b, n, count, chunks, -1, allreduce=False)
    segs = segments(count, n)
    bufs = [{"input": count, "output": segs[r][1], "scratch": count if n > 2 else 0} for r in range(n)]
    return b.build(collective="reducescatter", algorithm="ring", count=count, dtype=dtype, buffers=bufs, params=params)


def ring_allgather(ranks: int, count: int, *, dtype: str, chunks: int, params: dict) -> Schedule:
    """Ring all-gather as NCCL does it: n-1 steps; at step t rank r forwards block r-t to rank r+1.

    ``output`` holds n blocks of ``count`` elements in rank order; each rank sends (n-1) x its input.
    """
    n = ranks
    b = ScheduleBuilder(n)
    handles: dict[tuple[int, int, int], tuple[int, int]] = {}
    for t in range(n - 1):
        for r in range(n):
            for k in range(chunks):
                handles[(r, t, k)] = b.step(r, [handles.get((r, t - 1, k)), handles.get((r, t, k - 1))],
                                            label=f"all-gather t={t} k={k}")
    for r in range(n):
        for k, (off, cnt) in enumerate(pieces(0, count, chunks)):
            b.local(handles[(r, 0, k)], ("input", off, cnt), ("output", r * count + off, cnt))
    for t in range(n - 1):
        for r in range(n):
            right = (r + 1) % n
            blk = (r - t) % n
            for k, (off, cnt) in enumerate(pieces(0, count, chunks)):
                src = ("input", off, cnt) if t == 0 else ("output", blk * count + off, cnt)
                b.transfer(handles[(r, t, k)], src, handles[(right, t, k)], ("output", blk * count + off, cnt))
    bufs = [{"input": count, "output": n * count}] * n
    return b.build(collective="allgather", algorithm="ring", count=count, dtype=dtype, buffers=bufs, params=params)
