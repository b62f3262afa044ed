"""Hierarchical all-reduce, as NCCL runs it across servers with several GPUs: reduce-scatter inside each server
(over the scale-up domain: NVLink-class), all-reduce between servers of each local index's slice (over the fabric:
one ring per local index, i.e. per rail), all-gather inside each server.

Ranks are numbered server by server: server s holds ranks s*G .. s*G + G - 1 (``local_size`` = G, the job's
``gpus_per_host``). Each server's ring moves (G-1)/G of the message twice over its own domain; the fabric carries
only 2(S-1)/S of a 1/G slice per rank (S servers), where a flat ring over all S*G ranks sends 2(n-1)/n of the whole
message from every rank, across the fabric wherever the ring leaves a server.
"""

from __future__ import annotations

from ..schedule import Schedule, ScheduleBuilder, ScheduleError
from ._common import pieces, segments

__all__ = ["hierarchical_allreduce"]


def _ring(b: ScheduleBuilder, members: list[int], region: tuple[int, int], chunks: int, kind: str,
          after: dict[int, list], copy_in: bool = False, label: str = "") -> dict[int, list]:
    """One ring over ``members`` (global ranks, in ring order) on ``region`` (offset, count) of ``output``, cut in
    len(members) segments: ``kind="rs"`` reduce-scatter (member i ends owning segment i+1, summed; ``copy_in``: its
    own contribution comes from ``input``, else it is already in ``output``), ``"ag"`` all-gather (member i starts
    owning segment i+1). Each member's first step waits for its handles in ``after``; returns its last handles."""
    k = len(members)
    if k == 1:
        return after
    segs = segments(region[1], k)
    segs = [(region[0] + o, c) for o, c in segs]
    handles: dict[tuple[int, int, int], tuple[int, int]] = {}
    for s in range(k - 1):
        for i, r in enumerate(members):
            for c in range(chunks):
                deps = list(after.get(r, [])) if s == 0 else [handles[(i, s - 1, c)]]
                handles[(i, s, c)] = b.step(r, deps + [handles.get((i, s, c - 1))], label=f"{label} s={s} k={c}")
    for s in range(k - 1):
        for i, r in enumerate(members):
            j = (i + 1) % k
            seg = (i - s) % k if kind == "rs" else (i + 1 - s) % k
            for c, (off, cnt) in enumerate(pieces(*segs[seg], chunks)):
                if kind == "rs":
                    src = ("input" if copy_in and s == 0 else "output", off, cnt)
                    if copy_in:
                        b.local(handles[(j, s, c)], ("input", off, cnt), ("output", off, cnt))
                    b.transfer(handles[(i, s, c)], src, handles[(j, s, c)], ("output", off, cnt), op="reduce")
                else:
                    b.transfer(handles[(i, s, c)], ("output", off, cnt), handles[(j, s, c)], ("output", off, cnt))
    return {r: [handles[(i, k - 2, c)] for c in range(chunks)] for i, r in enumerate(members)}


def hierarchical_allreduce(ranks: int, count: int, *, dtype: str, chunks: int, params: dict,
                           local_size: int = 1) -> Schedule:
    """NCCL-style hierarchical all-reduce (module docstring); ``local_size`` = ranks per server (G >= 1, dividing
    ``ranks``). G = 1 is a flat ring over the servers; G = ranks a ring inside one server."""
    g = local_size
    if isinstance(g, bool) or not isinstance(g, int) or g < 1 or ranks % g:
        raise ScheduleError(f"local_size must be a positive divisor of ranks ({ranks}), got {g!r}")
    servers = ranks // g
    b = ScheduleBuilder(ranks)
    whole = (0, count)
    local = [list(range(s * g, (s + 1) * g)) for s in range(servers)]
    after: dict[int, list] = {}
    for members in local:  # 1. reduce-scatter inside each server
        after.update(_ring(b, members, whole, chunks, "rs", {}, copy_in=True, label="intra reduce-scatter"))
    if g == 1:  # no intra phase: the input has to reach the output before the inter-server ring sums into it
        for r in range(ranks):
            h = b.step(r, [], label="copy input")
            b.local(h, ("input", 0, count), ("output", 0, count))
            after[r] = [h]
    owned = segments(count, g)  # local rank l owns slice (l + 1) % g of the server's sum
    for lr in range(g):  # 2. all-reduce of each slice between the servers, one ring per local index (a rail)
        members = [s * g + lr for s in range(servers)]
        region = owned[(lr + 1) % g]
        done = _ring(b, members, region, chunks, "rs", after, label=f"inter reduce-scatter l={lr}")
        after.update(_ring(b, members, region, chunks, "ag", done, label=f"inter all-gather l={lr}"))
    for members in local:  # 3. all-gather inside each server
        _ring(b, members, whole, chunks, "ag", after, label="intra all-gather")
    bufs = [{"input": count, "output": count}] * ranks
    return b.build(collective="allreduce", algorithm="hierarchical", count=count, dtype=dtype, buffers=bufs,
                   params={**params, "local_size": g})
