"""Recursive halving / doubling all-reduce (Rabenseifner; MPICH's algorithm for long messages).

Reduce-scatter by recursive halving (log2 p rounds; in round i rank exchanges half of its current window
with the rank whose number differs in bit log2(p)-1-i), then all-gather by recursive doubling (the windows
grow back).  Every rank sends 2(p-1)/p of the message in 2 log2 p messages.

Rank counts that are not a power of two use MPICH's pre/post step (``non_power_of_two="prepost"``, the
default): with p the largest power of two below n and rem = n - p, each even rank 2i < 2 rem first sends
its whole input to rank 2i+1 and sits out; after the power-of-two algorithm the odd rank sends the result
back.  ``non_power_of_two="error"`` rejects such rank counts instead.

``chunks`` cuts the data into that many contiguous slices, each all-reduced by its own instance of the
algorithm; slice k of round q waits for slice k-1 of round q, so slices follow each other through the rounds.
"""

from __future__ import annotations

from ..schedule import Schedule, ScheduleBuilder, ScheduleError
from ._common import pieces, segments

__all__ = ["halving_doubling_allreduce"]


def halving_doubling_allreduce(
    ranks: int, count: int, *, dtype: str, chunks: int, params: dict, non_power_of_two: str = "prepost"
) -> Schedule:
    """Recursive halving reduce-scatter + recursive doubling all-gather all-reduce (see the module doc)."""
    n = ranks
    if non_power_of_two not in ("prepost", "error"):
        raise ScheduleError(f"non_power_of_two must be 'prepost' or 'error', got {non_power_of_two!r}")
    p = 1 << (n.bit_length() - 1)
    if p != n and non_power_of_two == "error":
        raise ScheduleError(f"halving_doubling needs a power-of-two rank count, got {n} "
                            "(or use non_power_of_two='prepost')")
    b = ScheduleBuilder(n)
    handles = _step_handles(b, n, p, chunks)
    for k, (s_off, s_size) in enumerate(pieces(0, count, chunks)):
        _chunk(b, handles, k, s_off, s_size, n, p)
    bufs = [{"input": count, "output": count}] * n
    return b.build(collective="allreduce", algorithm="halving_doubling", count=count, dtype=dtype, buffers=bufs,
                   params=params)


def _step_handles(b: ScheduleBuilder, n: int, p: int, chunks: int) -> dict[tuple[int, int, int], tuple[int, int]]:
    """(rank, chunk, round) -> step: round 0 the pre-step, 1..L halving, L+1..2L doubling, 2L+1 the post-step (pre-
    and post-steps only on the ranks below 2 * rem that fold in, rounds 1..2L only on the p participants); each step
    after the rank's previous one and after the same round of the previous chunk."""
    rem = n - p
    rounds = 2 * (p.bit_length() - 1) + 2
    handles: dict[tuple[int, int, int], tuple[int, int]] = {}
    for k in range(chunks):
        last: dict[int, tuple[int, int] | None] = {r: None for r in range(n)}
        for q in range(rounds):
            for r in range(n):
                if q in (0, rounds - 1):
                    active = r < 2 * rem
                else:
                    active = (r % 2 == 1) if r < 2 * rem else True  # the participants (new rank not None)
                if not active:
                    continue
                handles[(r, k, q)] = b.step(r, [last[r], handles.get((r, k - 1, q))], label=f"hd k={k} q={q}")
                last[r] = handles[(r, k, q)]
    return handles


def _chunk(b: ScheduleBuilder, handles: dict, k: int, s_off: int, s_size: int, n: int, p: int) -> None:
    """The transfers of chunk ``k`` (``s_size`` elements from ``s_off``): fold the extra ranks in, halve, double,
    hand the result back."""
    rem = n - p
    L = p.bit_length() - 1
    rounds = 2 * L + 2

    def real(nr: int) -> int:
        return 2 * nr + 1 if nr < rem else nr + rem

    segs = segments(s_size, p)
    seg_off = [s_off + o for o, _ in segs] + [s_off + s_size]

    def span(lo: int, hi: int) -> tuple[int, int]:
        return seg_off[lo], seg_off[hi] - seg_off[lo]

    whole = ("output", s_off, s_size)
    # pre-step: even ranks below 2*rem hand their data to the odd neighbour
    for r in range(0, 2 * rem, 2):
        h_odd = handles[(r + 1, k, 0)]
        b.local(h_odd, ("input", s_off, s_size), whole)
        b.transfer(handles[(r, k, 0)], ("input", s_off, s_size), h_odd, whole, op="reduce")
    for r in range(2 * rem, n):  # participants without a pre-step start from their own input
        b.local(handles[(r, k, 1)], ("input", s_off, s_size), whole)
    # recursive halving
    window = {nr: (0, p) for nr in range(p)}
    for i in range(L):
        mask = p >> (i + 1)
        new_window = {}
        for nr in range(p):
            lo, hi = window[nr]
            mid = (lo + hi) // 2
            keep, give = ((mid, hi), (lo, mid)) if nr & mask else ((lo, mid), (mid, hi))
            new_window[nr] = keep
            off, cnt = span(*give)
            b.transfer(handles[(real(nr), k, 1 + i)], ("output", off, cnt),
                       handles[(real(nr ^ mask), k, 1 + i)], ("output", off, cnt), op="reduce")
        window = new_window
    # recursive doubling
    for i in range(L):
        mask = 1 << i
        for nr in range(p):
            lo = (nr >> i) << i
            off, cnt = span(lo, lo + (1 << i))
            b.transfer(handles[(real(nr), k, 1 + L + i)], ("output", off, cnt),
                       handles[(real(nr ^ mask), k, 1 + L + i)], ("output", off, cnt))
    # post-step: odd ranks return the result
    for r in range(0, 2 * rem, 2):
        b.transfer(handles[(r + 1, k, rounds - 1)], whole, handles[(r, k, rounds - 1)], whole)
