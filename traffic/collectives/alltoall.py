"""All-to-all by pairwise exchange, with an optional MoE-like skew of the per-destination block sizes."""

from __future__ import annotations

from ..schedule import Schedule, ScheduleBuilder, ScheduleError, offsets_of, split_evenly, stable_rng, stable_shuffle
from ._common import pieces

__all__ = ["pairwise_alltoall", "moe_splits"]


def _largest_remainder(total: int, weights: list[float]) -> list[int]:
    s = sum(weights)
    raw = [total * w / s for w in weights]
    out = [int(x) for x in raw]
    short = total - sum(out)
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - out[i]), i))
    for i in order[:short]:
        out[i] += 1
    return out


def moe_splits(ranks: int, count: int, skew: float, seed: int) -> tuple[tuple[int, ...], ...]:
    """Element counts splits[i][j] that rank i sends to rank j, each row summing to ``count``.

    ``skew`` = 0 gives the even split.  Otherwise, like tokens routed to experts in a mixture-of-experts
    layer: experts (destination ranks) get a popularity order shuffled from ``seed``; the expert of
    popularity rank q gets weight 1/(q+1)**skew (Zipf-like, the same hot experts for every source), times a
    per-(source, expert) factor uniform in [0.5, 1.5).  Weights become exact integer counts by largest
    remainder.  Uses only ``random.Random(seed).random()``, so it is identical across Python/NumPy versions.
    """
    if (isinstance(skew, bool) or not isinstance(skew, (int, float)) or not skew >= 0 or skew != skew
            or skew == float("inf")):
        raise ScheduleError(f"skew must be a finite number >= 0, got {skew!r}")
    n = ranks
    if skew == 0:
        return tuple(tuple(split_evenly(count, n)) for _ in range(n))
    rng = stable_rng(seed)
    popularity = stable_shuffle(rng, list(range(n)))  # popularity[j] = popularity rank of expert j
    base = [1.0 / (popularity[j] + 1.0) ** skew for j in range(n)]
    rows = []
    for _i in range(n):
        w = [base[j] * (0.5 + rng.random()) for j in range(n)]
        rows.append(tuple(_largest_remainder(count, w)))
    return tuple(rows)


def pairwise_alltoall(
    ranks: int, count: int, *, dtype: str, chunks: int, params: dict, seed: int = 0, skew: float = 0.0
) -> Schedule:
    """Pairwise-exchange all-to-all (NCCL/MPI style): in step s = 1..n-1 rank r sends its block for rank r+s
    and receives rank r-s's block for it, one peer at a time; the block for itself is a local copy.

    Rank i's input holds its blocks for ranks 0..n-1 in order (sizes ``splits[i]``, see :func:`moe_splits`);
    rank j's output holds the blocks from ranks 0..n-1 in order.  Empty blocks are not sent.
    """
    n = ranks
    splits = moe_splits(n, count, skew, seed)
    in_off = [offsets_of(row) for row in splits]
    col = [[splits[i][j] for i in range(n)] for j in range(n)]
    out_off = [offsets_of(c) for c in col]  # out_off[j][i]: where block i->j lands on j
    b = ScheduleBuilder(n)
    handles: dict[tuple[int, int, int], tuple[int, int]] = {}
    for r in range(n):
        prev = None
        for s in range(1, n):
            for k in range(chunks):
                prev = handles[(r, s, k)] = b.step(r, [prev], label=f"alltoall s={s} k={k}")
    for r in range(n):
        b.local(handles[(r, 1, 0)], ("input", in_off[r][r], splits[r][r]), ("output", out_off[r][r], splits[r][r]))
    for s in range(1, n):
        for r in range(n):
            dst = (r + s) % n
            for k, (off, cnt) in enumerate(pieces(0, splits[r][dst], chunks)):
                b.transfer(handles[(r, s, k)], ("input", in_off[r][dst] + off, cnt),
                           handles[(dst, s, k)], ("output", out_off[dst][r] + off, cnt))
    bufs = [{"input": count, "output": sum(col[j])} for j in range(n)]
    splits_field = None if skew == 0 else splits
    return b.build(collective="alltoall", algorithm="pairwise", count=count, dtype=dtype, buffers=bufs,
                   splits=splits_field, params=params)
