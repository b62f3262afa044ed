"""What each rank's ``output`` must hold after a collective, from first principles (not from running a schedule),
and the seeded integer inputs agents and tests feed schedules with."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import ScheduleError, check_splits, is_int, offsets_of, split_evenly
from .simulate import simulate
from .steps import ScheduleLike


def expected_output_sizes(
    collective: str, ranks: int, count: int, *, root: int | None = 0, splits: Sequence[Sequence[int]] | None = None
) -> list[int]:
    """Length of each rank's ``output`` buffer for ``collective`` (see :func:`expected_outputs`)."""
    n, root = ranks, root or 0
    if collective == "allreduce" or collective == "broadcast":
        return [count] * n
    if collective == "allgather":
        return [n * count] * n
    if collective == "reducescatter":
        return split_evenly(count, n)
    if collective == "alltoall":
        m = splits if splits is not None else [split_evenly(count, n)] * n
        return [sum(m[i][j] for i in range(n)) for j in range(n)]
    if collective == "reduce":
        return [count if r == root else 0 for r in range(n)]
    if collective == "gather":
        return [n * count if r == root else 0 for r in range(n)]
    if collective == "pipeline":
        return [0] + [count] * (n - 1)
    raise ScheduleError(f"no expected result for collective {collective!r}")


def expected_outputs(
    collective: str,
    inputs: Sequence[np.ndarray],
    *,
    root: int = 0,
    splits: Sequence[Sequence[int]] | None = None,
) -> list[np.ndarray]:
    """What each rank's ``output`` must hold after ``collective``, from first principles.

    allreduce: the elementwise sum of all inputs, on every rank.  allgather: the concatenation of all inputs
    in rank order.  reducescatter: rank r gets the r-th of n contiguous slices (sizes from
    :func:`split_evenly`) of the sum.  alltoall: rank j gets, in order of source rank i, the j-th block of
    rank i's input (blocks sized by ``splits[i]``, default even).  broadcast: the root's input everywhere.
    reduce: the sum at the root, empty elsewhere.  gather (incast): the root gets the concatenation, others
    empty.  pipeline: every stage after the first gets stage 0's input; stage 0 keeps nothing.
    """
    ins = [np.asarray(x) for x in inputs]
    n = len(ins)
    if n < 1:
        raise ScheduleError("need at least one input")
    count = ins[0].shape[0] if ins[0].ndim == 1 else -1
    for r, a in enumerate(ins):
        if a.ndim != 1 or a.shape[0] != count:
            raise ScheduleError(f"input of rank {r} has shape {a.shape}; all inputs must be 1-D of equal length")
    if not is_int(root) or not 0 <= root < n:
        raise ScheduleError(f"root {root!r} out of range (ranks={n})")
    dtype = ins[0].dtype
    empty = np.zeros(0, dtype=dtype)
    if collective in ("allreduce", "reducescatter", "reduce"):
        total = ins[0].copy()
        for a in ins[1:]:
            total += a
        if collective == "allreduce":
            return [total.copy() for _ in range(n)]
        if collective == "reduce":
            return [total.copy() if r == root else empty.copy() for r in range(n)]
        sizes = split_evenly(count, n)
        offs = offsets_of(sizes)
        return [total[offs[r] : offs[r] + sizes[r]].copy() for r in range(n)]
    if collective == "allgather":
        cat = np.concatenate(ins)
        return [cat.copy() for _ in range(n)]
    if collective == "gather":
        cat = np.concatenate(ins)
        return [cat.copy() if r == root else empty.copy() for r in range(n)]
    if collective == "broadcast":
        return [ins[root].copy() for _ in range(n)]
    if collective == "pipeline":
        return [empty.copy()] + [ins[0].copy() for _ in range(n - 1)]
    if collective == "alltoall":
        m = (check_splits(splits, n, count) if splits is not None
             else tuple(tuple(split_evenly(count, n)) for _ in range(n)))
        return [_alltoall_output(ins, m, j, empty) for j in range(n)]
    raise ScheduleError(f"no expected result for collective {collective!r}")


def _alltoall_output(ins: Sequence[np.ndarray], m: Sequence[Sequence[int]], j: int, empty: np.ndarray) -> np.ndarray:
    """Rank ``j``'s all-to-all result: the j-th block of every rank's input, in source-rank order."""
    parts = []
    for i in range(len(ins)):
        off = sum(m[i][:j])
        parts.append(ins[i][off : off + m[i][j]])
    return np.concatenate(parts) if parts else empty.copy()


def random_input(schedule: ScheduleLike, seed: int, rank: int, low: int = -8, high: int = 8) -> np.ndarray:
    """Rank ``rank``'s input: integer values (exact under any summation order), from its own stream of (seed, rank),
    so one rank's input costs one rank's work (an agent makes only its own)."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(low, high, size=schedule.count, dtype=np.int8).astype(schedule.dtype)


def random_inputs(schedule: ScheduleLike, seed: int = 0, low: int = -8, high: int = 8) -> list[np.ndarray]:
    """Every rank's :func:`random_input`, for checking a schedule or an agent run."""
    return [random_input(schedule, seed, r, low, high) for r in range(schedule.ranks)]


def expected_output(schedule: ScheduleLike, seed: int, rank: int) -> np.ndarray:
    """What rank ``rank``'s output must hold after the schedule ran on :func:`random_inputs`: the same as
    ``schedule.expected_outputs(random_inputs(schedule, seed))[rank]`` (or :func:`simulate`'s for a custom
    schedule), computed one input at a time, so a rank holds its own result and one input instead of every rank's
    inputs and results (at 64 ranks of 1 MB: 2 MB instead of 130 MB per agent)."""
    n, c, dt = schedule.ranks, schedule.collective, np.dtype(schedule.dtype)
    root = schedule.root or 0
    empty = np.zeros(0, dtype=dt)

    def inp(r: int) -> np.ndarray:
        return random_input(schedule, seed, r)

    if c in ("allreduce", "reducescatter") or (c == "reduce" and rank == root):
        total = np.zeros(schedule.count, dtype=dt)
        for r in range(n):
            total += inp(r)
        if c != "reducescatter":
            return total
        sizes = split_evenly(schedule.count, n)
        off = offsets_of(sizes)[rank]
        return total[off:off + sizes[rank]].copy()
    if c == "allgather" or (c == "gather" and rank == root):
        return np.concatenate([inp(r) for r in range(n)])
    if c in ("reduce", "gather"):
        return empty
    if c == "broadcast":
        return inp(root)
    if c == "pipeline":
        return empty if rank == 0 else inp(0)
    if c == "alltoall":
        m = (check_splits(schedule.splits, n, schedule.count) if schedule.splits is not None
             else tuple(tuple(split_evenly(schedule.count, n)) for _ in range(n)))
        parts = [inp(i)[sum(m[i][:rank]):sum(m[i][:rank]) + m[i][rank]] for i in range(n)]
        return np.concatenate(parts) if parts else empty
    inputs = random_inputs(schedule, seed)
    if c == "custom":
        return simulate(schedule, inputs)[rank]
    return expected_outputs(c, inputs, root=root, splits=schedule.splits)[rank]
