"""Broadcast from a root: binary tree (pieces pipelined down a heap tree) or ring (a pipelined chain)."""

from __future__ import annotations

from ..schedule import Schedule, ScheduleBuilder
from ._common import pieces
from .tree import tree_broadcast

__all__ = ["tree_broadcast", "ring_broadcast", "chain"]


def chain(b: ScheduleBuilder, order: list[int], count: int, chunks: int, *, first_keeps: bool, name: str) -> None:
    """Forward the first rank's input along ``order`` piece by piece; every later rank receives into and
    forwards from its ``output``.  If ``first_keeps`` the first rank also copies its input to its output."""
    recv_prev: dict[int, tuple[int, int] | None] = {}
    send_prev: dict[int, tuple[int, int] | None] = {}
    for k, (off, cnt) in enumerate(pieces(0, count, chunks)):
        hs_recv, hs_send = {}, {}
        for pos, r in enumerate(order):
            h_r = None
            if pos > 0:
                h_r = b.step(r, [recv_prev.get(r)], label=f"{name} recv k={k}")
                recv_prev[r] = h_r
                hs_recv[r] = h_r
            if pos < len(order) - 1 or (pos == 0 and first_keeps):
                h_s = b.step(r, [h_r, send_prev.get(r)], label=f"{name} send k={k}")
                send_prev[r] = h_s
                hs_send[r] = h_s
        first = order[0]
        if first_keeps:
            b.local(hs_send[first], ("input", off, cnt), ("output", off, cnt))
        for pos in range(len(order) - 1):
            r, nxt = order[pos], order[pos + 1]
            src = ("input", off, cnt) if pos == 0 else ("output", off, cnt)
            b.transfer(hs_send[r], src, hs_recv[nxt], ("output", off, cnt))


def ring_broadcast(ranks: int, count: int, *, dtype: str, chunks: int, params: dict, root: int = 0) -> Schedule:
    """Ring (chain) broadcast as NCCL's ring broadcast does it: root -> root+1 -> ... -> root-1, pipelined in
    ``chunks`` pieces; each non-root rank receives the message once and all but the last forward it once."""
    b = ScheduleBuilder(ranks)
    chain(b, [(root + i) % ranks for i in range(ranks)], count, chunks, first_keeps=True, name="bcast")
    bufs = [{"input": count, "output": count}] * ranks
    return b.build(collective="broadcast", algorithm="ring", count=count, dtype=dtype, buffers=bufs, root=root,
                   params=params)
