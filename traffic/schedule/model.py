"""The schedule model: a collective as per-rank step DAGs plus what it means (collective, dtype, per-rank input
count), and the global checks that make it runnable (every send matched, no races, no deadlock)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .base import COLLECTIVES, DTYPES, ROOTED_COLLECTIVES, ScheduleError, check_int, check_splits
from .reference import expected_output_sizes, expected_outputs
from .simulate import drive, simulate
from .steps import RankProgram, Recv, Send, Step, where



Scalar = int | float | str | bool | None


@dataclass(frozen=True)
class Schedule:
    """A collective as per-rank step DAGs, plus what it means (collective, dtype, per-rank input count).

    ``root`` is the root rank of broadcast / reduce / gather.  ``splits`` (all-to-all only) is the
    ranks x ranks matrix of element counts rank i sends to rank j (rows sum to ``count``; None means the even
    split of :func:`split_evenly`).  ``params`` records how the schedule was generated (for run manifests).
    """

    collective: str
    ranks: int
    count: int
    programs: tuple[RankProgram, ...] = field(repr=False)
    dtype: str = "float32"
    algorithm: str = "custom"
    root: int | None = None
    splits: tuple[tuple[int, ...], ...] | None = field(default=None, repr=False)
    params: tuple[tuple[str, Scalar], ...] = ()

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ScheduleError(f"unknown collective {self.collective!r}; known: {', '.join(COLLECTIVES)}")
        if not isinstance(self.algorithm, str) or not self.algorithm:
            raise ScheduleError("algorithm must be a non-empty string")
        n = check_int("ranks", self.ranks, 1)
        object.__setattr__(self, "ranks", n)
        object.__setattr__(self, "count", check_int("count", self.count, 1))
        if self.dtype not in DTYPES:
            raise ScheduleError(f"unsupported dtype {self.dtype!r}; supported: {', '.join(DTYPES)}")
        progs = tuple(self.programs)
        if len(progs) != n:
            raise ScheduleError(f"{n} ranks but {len(progs)} rank programs")
        for i, p in enumerate(progs):
            if not isinstance(p, RankProgram):
                raise ScheduleError(f"program {i} is not a RankProgram")
            if p.rank != i:
                raise ScheduleError(f"program {i} is for rank {p.rank}; programs must be in rank order")
            if p.buffer_size("input") != self.count:
                raise ScheduleError(
                    f"rank {i}: input buffer has {p.buffer_size('input')} elements, count is {self.count}")
            for si, st in enumerate(p.steps):
                for op in (*st.sends, *st.recvs):
                    if op.peer >= n:
                        raise ScheduleError(f"rank {i} step {si}: peer {op.peer} out of range (ranks={n})")
        object.__setattr__(self, "programs", progs)
        if self.collective in ROOTED_COLLECTIVES:
            if self.root is None:
                raise ScheduleError(f"{self.collective} needs a root rank")
        if self.root is not None:
            root = check_int("root", self.root, 0)
            if root >= n:
                raise ScheduleError(f"root {root} out of range (ranks={n})")
            object.__setattr__(self, "root", root)
        if self.splits is not None:
            if self.collective != "alltoall":
                raise ScheduleError("splits are only meaningful for alltoall")
            object.__setattr__(self, "splits", check_splits(self.splits, n, self.count))
        params = self.params.items() if isinstance(self.params, Mapping) else self.params
        clean = []
        for item in params:
            k, v = item
            if not isinstance(k, str) or not (v is None or isinstance(v, (bool, int, float, str))):
                raise ScheduleError(f"param {k!r}: values must be scalars (number, string, bool, null)")
            clean.append((k, v))
        object.__setattr__(self, "params", tuple(sorted(clean)))

    # ---- sizes and accounting

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def message_bytes(self) -> int:
        """Bytes of each rank's input (the ``message_bytes`` given to ``make_schedule``)."""
        return self.count * self.itemsize

    def steps(self, rank: int) -> tuple[Step, ...]:
        return self.programs[rank].steps

    def num_steps(self, rank: int | None = None) -> int:
        if rank is None:
            return sum(len(p.steps) for p in self.programs)
        return len(self.programs[rank].steps)

    def output_size(self, rank: int) -> int:
        return self.programs[rank].buffer_size("output")

    def bytes_sent(self, rank: int) -> int:
        """Payload bytes ``rank`` sends over the network during one execution."""
        return self.itemsize * sum(s.src.count for st in self.programs[rank].steps for s in st.sends)

    def bytes_received(self, rank: int) -> int:
        """Payload bytes ``rank`` receives over the network during one execution."""
        return self.itemsize * sum(r.dst.count for st in self.programs[rank].steps for r in st.recvs)

    def total_bytes(self) -> int:
        return sum(self.bytes_sent(r) for r in range(self.ranks))

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)

    # ---- checking and executing

    def validate(self) -> "Schedule":
        """Check global consistency; raise :class:`ScheduleError` (one line) on the first problem; return self.

        Checks: every send matched by exactly one receive (same src, dst, tag) of equal size and vice versa;
        regions in bounds; dependencies point at earlier steps (so the per-rank graphs are acyclic); steps of a
        rank that are not ordered by dependencies never touch overlapping memory where one of them writes;
        the DAG completes even if every transfer needs both its send and its receive posted (no cycle through
        messages); output buffer sizes match the collective.
        """
        _check_matching(self)
        if self.collective != "custom":
            want = expected_output_sizes(self.collective, self.ranks, self.count, root=self.root, splits=self.splits)
            for r, w in enumerate(want):
                if self.output_size(r) != w:
                    raise ScheduleError(
                        f"rank {r}: output buffer has {self.output_size(r)} elements, {self.collective} needs {w}")
        for p in self.programs:
            _check_races(p)
        drive(self)
        return self

    def simulate(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return simulate(self, inputs)

    def expected_outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return expected_outputs(self.collective, inputs, root=self.root or 0, splits=self.splits)



def _check_matching(s: Schedule) -> None:
    sends: dict[tuple[int, int, int], tuple[int, Send]] = {}
    recvs: dict[tuple[int, int, int], tuple[int, Recv]] = {}
    for p in s.programs:
        for i, st in enumerate(p.steps):
            for op in st.sends:
                key = (p.rank, op.peer, op.tag)
                if key in sends:
                    raise ScheduleError(
                        f"{where(p, i)}: send to rank {op.peer} tag {op.tag} duplicates one in step {sends[key][0]}")
                sends[key] = (i, op)
            for rv in st.recvs:
                key = (rv.peer, p.rank, rv.tag)
                if key in recvs:
                    raise ScheduleError(f"{where(p, i)}: receive from rank {rv.peer} tag {rv.tag} duplicates one in "
                                        f"step {recvs[key][0]}")
                recvs[key] = (i, rv)
    for key, (i, op) in sends.items():
        if key not in recvs:
            raise ScheduleError(
                f"{where(s.programs[key[0]], i)}: send to rank {key[1]} tag {key[2]} has no matching receive")
        j, rv = recvs[key]
        if rv.dst.count != op.src.count:
            raise ScheduleError(
                f"{where(s.programs[key[0]], i)}: send to rank {key[1]} tag {key[2]} has {op.src.count} elements "
                f"but the receive in rank {key[1]} step {j} expects {rv.dst.count}"
            )
    for key, (j, rv) in recvs.items():
        if key not in sends:
            raise ScheduleError(
                f"{where(s.programs[key[1]], j)}: receive from rank {key[0]} tag {key[2]} has no matching send")


def _ancestors(p: RankProgram) -> list[int]:
    anc: list[int] = []
    for st in p.steps:
        a = 0
        for d in st.deps:
            a |= anc[d] | (1 << d)
        anc.append(a)
    return anc


def _check_races(p: RankProgram) -> None:
    anc = _ancestors(p)
    by_buf: dict[str, list[tuple[int, int, int, bool]]] = {}
    for i, st in enumerate(p.steps):
        for region, w in st.accesses():
            by_buf.setdefault(region.buffer, []).append((region.offset, region.end, i, w))
    for buf, items in by_buf.items():
        items.sort()
        active: list[tuple[int, int, int, bool]] = []
        for start, end, i, w in items:
            active = [a for a in active if a[1] > start]
            for _, aend, j, aw in active:
                if j == i or not (w or aw):
                    continue
                lo, hi = (j, i) if j < i else (i, j)
                if not (anc[hi] >> lo) & 1:
                    raise ScheduleError(
                        f"rank {p.rank}: steps {lo} and {hi} are not ordered by dependencies but both touch "
                        f"{buf}[{max(start, 0)}:{min(end, aend)}] and one writes it"
                    )
            active.append((start, end, i, w))
