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
"""

from __future__ import annotations

import math
import random
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

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


class ScheduleError(ValueError):
    """A schedule, its parameters or its JSON form is invalid.  The message is always a single line."""

    def __init__(self, message: object) -> None:
        super().__init__(" ".join(str(message).split()))


#: Collectives whose result :func:`expected_outputs` knows.  ``custom`` schedules (e.g. imported traces) can be
#: validated and simulated but have no first-principles expected result.
COLLECTIVES = (
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "reduce",
    "gather",
    "pipeline",
    "custom",
)
#: Collectives with a distinguished root rank (the ``root`` field is required).
ROOTED_COLLECTIVES = ("broadcast", "reduce", "gather")
#: Supported element types -> bytes per element (numpy names).
DTYPES: dict[str, int] = {"float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}
#: What a receive (or local operation) does with the data: overwrite or sum into the destination.
ACTIONS = ("copy", "reduce")

_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _int(what: str, v: object, minimum: int | None = None) -> int:
    if not _is_int(v):
        raise ScheduleError(f"{what} must be an integer, got {type(v).__name__} {v!r}")
    v = int(v)  # type: ignore[arg-type]
    if minimum is not None and v < minimum:
        raise ScheduleError(f"{what} must be >= {minimum}, got {v}")
    return v


def split_evenly(total: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous pieces of ``total`` elements; the remainder goes one each to the first pieces."""
    total = _int("total", total, 0)
    parts = _int("parts", parts, 1)
    base, rem = divmod(total, parts)
    return [base + (1 if i < rem else 0) for i in range(parts)]


def offsets_of(sizes: Sequence[int]) -> list[int]:
    """Start offsets of consecutive pieces with the given sizes (exclusive prefix sums)."""
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out


# ---------------------------------------------------------------------------------------------- the data model


@dataclass(frozen=True)
class Region:
    """A contiguous run of ``count`` elements of one of a rank's buffers, starting at element ``offset``."""

    buffer: str
    offset: int
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.buffer, str) or not _NAME.fullmatch(self.buffer):
            raise ScheduleError(f"buffer name must match [a-z][a-z0-9_]*, got {self.buffer!r}")
        object.__setattr__(self, "offset", _int("region offset", self.offset, 0))
        object.__setattr__(self, "count", _int("region count", self.count, 1))

    @property
    def end(self) -> int:
        return self.offset + self.count

    def overlaps(self, other: "Region") -> bool:
        return self.buffer == other.buffer and self.offset < other.end and other.offset < self.end

    def __str__(self) -> str:
        return f"{self.buffer}[{self.offset}:{self.end}]"


def _check_action(op: object) -> str:
    if op not in ACTIONS:
        raise ScheduleError(f"action must be one of {'/'.join(ACTIONS)}, got {op!r}")
    return op  # type: ignore[return-value]


@dataclass(frozen=True)
class Send:
    """Send the elements of ``src`` to rank ``peer``, labelled ``tag`` (unique per ordered rank pair)."""

    peer: int
    tag: int
    src: Region

    def __post_init__(self) -> None:
        object.__setattr__(self, "peer", _int("send peer", self.peer, 0))
        object.__setattr__(self, "tag", _int("send tag", self.tag, 0))
        if not isinstance(self.src, Region):
            raise ScheduleError(f"send src must be a Region, got {type(self.src).__name__}")


@dataclass(frozen=True)
class Recv:
    """Receive the message ``tag`` from rank ``peer`` into ``dst``: ``copy`` overwrites it, ``reduce`` sums into it."""

    peer: int
    tag: int
    dst: Region
    op: str = "copy"

    def __post_init__(self) -> None:
        object.__setattr__(self, "peer", _int("recv peer", self.peer, 0))
        object.__setattr__(self, "tag", _int("recv tag", self.tag, 0))
        if not isinstance(self.dst, Region):
            raise ScheduleError(f"recv dst must be a Region, got {type(self.dst).__name__}")
        _check_action(self.op)


@dataclass(frozen=True)
class Local:
    """A memory operation on the rank itself: ``copy`` (dst = src) or ``reduce`` (dst += src); no network."""

    src: Region
    dst: Region
    op: str = "copy"

    def __post_init__(self) -> None:
        if not isinstance(self.src, Region) or not isinstance(self.dst, Region):
            raise ScheduleError("local src and dst must be Regions")
        if self.src.count != self.dst.count:
            raise ScheduleError(f"local op sizes differ: {self.src} has {self.src.count}, {self.dst} has {self.dst.count}")
        if self.src.overlaps(self.dst):
            raise ScheduleError(f"local op source {self.src} overlaps its destination {self.dst}")
        _check_action(self.op)


@dataclass(frozen=True)
class Step:
    """One node of a rank's DAG: local ops (run first, in order), then concurrent sends and receives.

    ``deps`` are indices of earlier steps of the same rank that must be complete before this one starts.
    Within a step, the sends' and receives' regions may not conflict: no receive may write where another
    receive writes or where a send reads (the local ops are sequenced before them, so they may touch anything).
    """

    deps: tuple[int, ...] = ()
    local: tuple[Local, ...] = ()
    sends: tuple[Send, ...] = ()
    recvs: tuple[Recv, ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        for name, kind in (("local", Local), ("sends", Send), ("recvs", Recv)):
            items = tuple(getattr(self, name))
            for it in items:
                if not isinstance(it, kind):
                    raise ScheduleError(f"step {name} must hold {kind.__name__} objects, got {type(it).__name__}")
            object.__setattr__(self, name, items)
        deps = tuple(_int("dependency", d, 0) for d in self.deps)
        if len(set(deps)) != len(deps):
            raise ScheduleError(f"duplicate dependency in {list(deps)}")
        object.__setattr__(self, "deps", deps)
        if not isinstance(self.label, str) or "\n" in self.label:
            raise ScheduleError("step label must be a one-line string")
        seen: set[tuple[int, int]] = set()
        for s in self.sends:
            if (s.peer, s.tag) in seen:
                raise ScheduleError(f"two sends to rank {s.peer} with tag {s.tag} in one step")
            seen.add((s.peer, s.tag))
        seen.clear()
        for r in self.recvs:
            if (r.peer, r.tag) in seen:
                raise ScheduleError(f"two receives from rank {r.peer} with tag {r.tag} in one step")
            seen.add((r.peer, r.tag))
        for i, r in enumerate(self.recvs):
            for r2 in self.recvs[i + 1 :]:
                if r.dst.overlaps(r2.dst):
                    raise ScheduleError(f"receives into overlapping regions {r.dst} and {r2.dst} in one step")
            for s in self.sends:
                if r.dst.overlaps(s.src):
                    raise ScheduleError(f"receive into {r.dst} overlaps send from {s.src} in one step")

    @property
    def is_empty(self) -> bool:
        return not (self.local or self.sends or self.recvs)

    def accesses(self) -> Iterable[tuple[Region, bool]]:
        """(region, is_write) for every buffer access of the step."""
        for lo in self.local:
            yield lo.src, False
            yield lo.dst, True
        for s in self.sends:
            yield s.src, False
        for r in self.recvs:
            yield r.dst, True


@dataclass(frozen=True)
class RankProgram:
    """What one rank does: its buffers (name -> element count) and its steps, in a dependency-respecting order."""

    rank: int
    buffers: tuple[tuple[str, int], ...]
    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        rank = _int("rank", self.rank, 0)
        object.__setattr__(self, "rank", rank)
        raw = self.buffers.items() if isinstance(self.buffers, Mapping) else self.buffers
        bufs: list[tuple[str, int]] = []
        names: set[str] = set()
        for item in raw:
            name, size = item
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ScheduleError(f"rank {rank}: buffer name must match [a-z][a-z0-9_]*, got {name!r}")
            if name in names:
                raise ScheduleError(f"rank {rank}: buffer {name!r} declared twice")
            names.add(name)
            bufs.append((name, _int(f"rank {rank} buffer {name!r} size", size, 0)))
        for required in ("input", "output"):
            if required not in names:
                raise ScheduleError(f"rank {rank}: missing buffer {required!r}")
        object.__setattr__(self, "buffers", tuple(bufs))
        steps = tuple(self.steps)
        sizes = dict(bufs)
        for i, st in enumerate(steps):
            if not isinstance(st, Step):
                raise ScheduleError(f"rank {rank} step {i}: not a Step")
            for d in st.deps:
                if d >= i:
                    raise ScheduleError(f"rank {rank} step {i}: dependency {d} is not an earlier step")
            for region, is_write in st.accesses():
                if region.buffer not in sizes:
                    raise ScheduleError(f"rank {rank} step {i}: unknown buffer {region.buffer!r}")
                if region.end > sizes[region.buffer]:
                    raise ScheduleError(
                        f"rank {rank} step {i}: region {region} out of bounds "
                        f"(buffer {region.buffer!r} has {sizes[region.buffer]} elements)"
                    )
                if is_write and region.buffer == "input":
                    raise ScheduleError(f"rank {rank} step {i}: writes to read-only buffer 'input' ({region})")
            for op in (*st.sends, *st.recvs):
                if op.peer == rank:
                    raise ScheduleError(f"rank {rank} step {i}: sends to or receives from itself")
        object.__setattr__(self, "steps", steps)

    @property
    def buffer_sizes(self) -> dict[str, int]:
        return dict(self.buffers)

    def buffer_size(self, name: str) -> int:
        return self.buffer_sizes[name]


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
        n = _int("ranks", self.ranks, 1)
        object.__setattr__(self, "ranks", n)
        object.__setattr__(self, "count", _int("count", self.count, 1))
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
                raise ScheduleError(f"rank {i}: input buffer has {p.buffer_size('input')} elements, count is {self.count}")
            for si, st in enumerate(p.steps):
                for op in (*st.sends, *st.recvs):
                    if op.peer >= n:
                        raise ScheduleError(f"rank {i} step {si}: peer {op.peer} out of range (ranks={n})")
        object.__setattr__(self, "programs", progs)
        if self.collective in ROOTED_COLLECTIVES:
            if self.root is None:
                raise ScheduleError(f"{self.collective} needs a root rank")
        if self.root is not None:
            root = _int("root", self.root, 0)
            if root >= n:
                raise ScheduleError(f"root {root} out of range (ranks={n})")
            object.__setattr__(self, "root", root)
        if self.splits is not None:
            if self.collective != "alltoall":
                raise ScheduleError("splits are only meaningful for alltoall")
            object.__setattr__(self, "splits", _check_splits(self.splits, n, self.count))
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
                    raise ScheduleError(f"rank {r}: output buffer has {self.output_size(r)} elements, {self.collective} needs {w}")
        for p in self.programs:
            _check_races(p)
        _drive(self)
        return self

    def simulate(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return simulate(self, inputs)

    def expected_outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return expected_outputs(self.collective, inputs, root=self.root or 0, splits=self.splits)


def _check_splits(splits: object, n: int, count: int) -> tuple[tuple[int, ...], ...]:
    rows = tuple(tuple(row) for row in splits)  # type: ignore[union-attr]
    if len(rows) != n or any(len(r) != n for r in rows):
        raise ScheduleError(f"splits must be a {n}x{n} matrix")
    out = []
    for i, row in enumerate(rows):
        vals = tuple(_int(f"splits[{i}]", v, 0) for v in row)
        if sum(vals) != count:
            raise ScheduleError(f"splits[{i}] sums to {sum(vals)}, must equal count {count}")
        out.append(vals)
    return tuple(out)


def _where(p: RankProgram, i: int) -> str:
    label = p.steps[i].label
    return f"rank {p.rank} step {i}" + (f" ({label})" if label else "")


def _check_matching(s: Schedule) -> None:
    sends: dict[tuple[int, int, int], tuple[int, Send]] = {}
    recvs: dict[tuple[int, int, int], tuple[int, Recv]] = {}
    for p in s.programs:
        for i, st in enumerate(p.steps):
            for op in st.sends:
                key = (p.rank, op.peer, op.tag)
                if key in sends:
                    raise ScheduleError(f"{_where(p, i)}: send to rank {op.peer} tag {op.tag} duplicates one in step {sends[key][0]}")
                sends[key] = (i, op)
            for rv in st.recvs:
                key = (rv.peer, p.rank, rv.tag)
                if key in recvs:
                    raise ScheduleError(f"{_where(p, i)}: receive from rank {rv.peer} tag {rv.tag} duplicates one in step {recvs[key][0]}")
                recvs[key] = (i, rv)
    for key, (i, op) in sends.items():
        if key not in recvs:
            raise ScheduleError(f"{_where(s.programs[key[0]], i)}: send to rank {key[1]} tag {key[2]} has no matching receive")
        j, rv = recvs[key]
        if rv.dst.count != op.src.count:
            raise ScheduleError(
                f"{_where(s.programs[key[0]], i)}: send to rank {key[1]} tag {key[2]} has {op.src.count} elements "
                f"but the receive in rank {key[1]} step {j} expects {rv.dst.count}"
            )
    for key, (j, rv) in recvs.items():
        if key not in sends:
            raise ScheduleError(f"{_where(s.programs[key[1]], j)}: receive from rank {key[0]} tag {key[2]} has no matching send")


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


def _drive(
    s: Schedule,
    on_start: Callable[[int, int], None] | None = None,
    on_complete: Callable[[int, int], None] | None = None,
) -> None:
    """Run the DAG abstractly with rendezvous semantics; call back on step start/complete; detect deadlock.

    A step starts when its dependencies are complete; it completes once every peer step holding the other
    side of each of its transfers has started.  Assumes matching has been checked.
    """
    progs = s.programs
    send_at: dict[tuple[int, int, int], int] = {}
    recv_at: dict[tuple[int, int, int], int] = {}
    for p in progs:
        for i, st in enumerate(p.steps):
            for op in st.sends:
                send_at[(p.rank, op.peer, op.tag)] = i
            for rv in st.recvs:
                recv_at[(rv.peer, p.rank, rv.tag)] = i
    waiting = [[len(st.sends) + len(st.recvs) for st in p.steps] for p in progs]
    pending = [[len(st.deps) for st in p.steps] for p in progs]
    dependents: list[list[list[int]]] = [[[] for _ in p.steps] for p in progs]
    for p in progs:
        for i, st in enumerate(p.steps):
            for d in st.deps:
                dependents[p.rank][d].append(i)
    started = [[False] * len(p.steps) for p in progs]
    done = [[False] * len(p.steps) for p in progs]
    events: deque[tuple[bool, int, int]] = deque()  # (is_completion, rank, step)
    for p in progs:
        for i in range(len(p.steps)):
            if pending[p.rank][i] == 0:
                events.append((False, p.rank, i))
    remaining = sum(len(p.steps) for p in progs)

    def release(r: int, i: int) -> None:
        waiting[r][i] -= 1
        if waiting[r][i] == 0 and started[r][i]:
            events.append((True, r, i))

    while events:
        is_done, r, i = events.popleft()
        st = progs[r].steps[i]
        if not is_done:
            started[r][i] = True
            if on_start:
                on_start(r, i)
            for op in st.sends:
                release(op.peer, recv_at[(r, op.peer, op.tag)])
            for rv in st.recvs:
                release(rv.peer, send_at[(rv.peer, r, rv.tag)])
            if waiting[r][i] == 0:
                events.append((True, r, i))
        else:
            done[r][i] = True
            remaining -= 1
            if on_complete:
                on_complete(r, i)
            for j in dependents[r][i]:
                pending[r][j] -= 1
                if pending[r][j] == 0:
                    events.append((False, r, j))
    if remaining:
        for p in progs:
            for i in range(len(p.steps)):
                if not done[p.rank][i]:
                    why = "never starts" if not started[p.rank][i] else "waits for a peer step that never starts"
                    raise ScheduleError(f"deadlock: {_where(p, i)} {why} (cycle through messages and dependencies)")


# ---------------------------------------------------------------------------------------------- execution


def _check_inputs(s: Schedule, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(inputs) != s.ranks:
        raise ScheduleError(f"need {s.ranks} input arrays, got {len(inputs)}")
    out = []
    for r, x in enumerate(inputs):
        a = np.asarray(x)
        if a.shape != (s.count,):
            raise ScheduleError(f"input of rank {r} has shape {a.shape}, need ({s.count},)")
        out.append(a.astype(s.dtype, copy=True))
    return out


def simulate(schedule: Schedule, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Execute ``schedule`` on ``inputs`` (one 1-D array of ``count`` elements per rank) without a network.

    Steps run in an order an agent could produce (dependencies and rendezvous respected); sends take their
    data when their step starts, receives land when their step completes.  Returns each rank's ``output``.
    The schedule is validated first.  This is the reference the real agents are checked against.
    """
    schedule.validate()
    ins = _check_inputs(schedule, inputs)
    mem: list[dict[str, np.ndarray]] = []
    for p, x in zip(schedule.programs, ins):
        bufs = {name: np.zeros(size, dtype=schedule.dtype) for name, size in p.buffers}
        bufs["input"] = x
        mem.append(bufs)
    mailbox: dict[tuple[int, int, int], np.ndarray] = {}

    def view(r: int, reg: Region) -> np.ndarray:
        return mem[r][reg.buffer][reg.offset : reg.end]

    def start(r: int, i: int) -> None:
        st = schedule.programs[r].steps[i]
        for lo in st.local:
            src = view(r, lo.src).copy()
            if lo.op == "copy":
                view(r, lo.dst)[:] = src
            else:
                view(r, lo.dst)[:] += src
        for op in st.sends:
            mailbox[(r, op.peer, op.tag)] = view(r, op.src).copy()

    def complete(r: int, i: int) -> None:
        for rv in schedule.programs[r].steps[i].recvs:
            data = mailbox.pop((rv.peer, r, rv.tag))
            if rv.op == "copy":
                view(r, rv.dst)[:] = data
            else:
                view(r, rv.dst)[:] += data

    _drive(schedule, start, complete)
    return [m["output"].copy() for m in mem]


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
    if not _is_int(root) or not 0 <= root < n:
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
        m = _check_splits(splits, n, count) if splits is not None else tuple(tuple(split_evenly(count, n)) for _ in range(n))
        outs = []
        for j in range(n):
            parts = []
            for i in range(n):
                off = sum(m[i][:j])
                parts.append(ins[i][off : off + m[i][j]])
            outs.append(np.concatenate(parts) if parts else empty.copy())
        return outs
    raise ScheduleError(f"no expected result for collective {collective!r}")


def random_input(schedule: Schedule, seed: int, rank: int, low: int = -8, high: int = 8) -> np.ndarray:
    """Rank ``rank``'s input: integer values (exact under any summation order), from its own stream of (seed, rank),
    so one rank's input costs one rank's work (an agent makes only its own)."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(low, high, size=schedule.count, dtype=np.int8).astype(schedule.dtype)


def random_inputs(schedule: Schedule, seed: int = 0, low: int = -8, high: int = 8) -> list[np.ndarray]:
    """Every rank's :func:`random_input`, for checking a schedule or an agent run."""
    return [random_input(schedule, seed, r, low, high) for r in range(schedule.ranks)]


def expected_output(schedule: Schedule, seed: int, rank: int) -> np.ndarray:
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
        m = (_check_splits(schedule.splits, n, schedule.count) if schedule.splits is not None
             else tuple(tuple(split_evenly(schedule.count, n)) for _ in range(n)))
        parts = [inp(i)[sum(m[i][:rank]):sum(m[i][:rank]) + m[i][rank]] for i in range(n)]
        return np.concatenate(parts) if parts else empty
    inputs = random_inputs(schedule, seed)
    return simulate(schedule, inputs)[rank] if c == "custom" else schedule.expected_outputs(inputs)[rank]


# ---------------------------------------------------------------------------------------------- building


class ScheduleBuilder:
    """Helper for generators: create steps, attach transfers (tags assigned per rank pair), prune empty steps.

    ``step()`` returns a handle (rank, index) or None; ``transfer()`` adds a matched send/receive pair to two
    existing steps and silently skips empty (count 0) transfers; ``local()`` likewise.  ``build()`` drops steps
    that ended up with no operations, re-pointing dependencies at their own dependencies.
    """

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self._steps: list[list[dict[str, Any]]] = [[] for _ in range(ranks)]
        self._tags: dict[tuple[int, int], int] = {}

    def step(self, rank: int, deps: Iterable[tuple[int, int] | None] = (), label: str = "") -> tuple[int, int]:
        idx = []
        for d in deps:
            if d is None:
                continue
            if d[0] != rank:
                raise ScheduleError(f"rank {rank}: dependency on a step of rank {d[0]}")
            idx.append(d[1])
        self._steps[rank].append({"deps": sorted(set(idx)), "local": [], "sends": [], "recvs": [], "label": label})
        return (rank, len(self._steps[rank]) - 1)

    def local(self, at: tuple[int, int], src: tuple[str, int, int], dst: tuple[str, int, int], op: str = "copy") -> None:
        if src[2] == 0:
            return
        self._steps[at[0]][at[1]]["local"].append(Local(Region(*src), Region(*dst), op))

    def transfer(
        self,
        src_step: tuple[int, int],
        src: tuple[str, int, int],
        dst_step: tuple[int, int],
        dst: tuple[str, int, int],
        op: str = "copy",
    ) -> None:
        if src[2] == 0 and dst[2] == 0:
            return
        a, b = src_step[0], dst_step[0]
        tag = self._tags.get((a, b), 0)
        self._tags[(a, b)] = tag + 1
        self._steps[a][src_step[1]]["sends"].append(Send(b, tag, Region(*src)))
        self._steps[b][dst_step[1]]["recvs"].append(Recv(a, tag, Region(*dst), op))

    def build(
        self,
        *,
        collective: str,
        algorithm: str,
        count: int,
        dtype: str,
        buffers: Sequence[Mapping[str, int]],
        root: int | None = None,
        splits: Sequence[Sequence[int]] | None = None,
        params: Mapping[str, Scalar] | None = None,
    ) -> Schedule:
        programs = []
        for r in range(self.ranks):
            raw = self._steps[r]
            final: list[int | None] = []
            resolved: list[list[int]] = []
            steps: list[Step] = []
            for i, st in enumerate(raw):
                deps: set[int] = set()
                for d in st["deps"]:
                    fd = final[d]
                    deps.update([fd] if fd is not None else resolved[d])
                resolved.append(sorted(deps))
                if st["local"] or st["sends"] or st["recvs"]:
                    final.append(len(steps))
                    steps.append(Step(tuple(sorted(deps)), tuple(st["local"]), tuple(st["sends"]), tuple(st["recvs"]), st["label"]))
                else:
                    final.append(None)
            programs.append(RankProgram(r, tuple(buffers[r].items()), tuple(steps)))
        return Schedule(
            collective=collective,
            ranks=self.ranks,
            count=count,
            programs=tuple(programs),
            dtype=dtype,
            algorithm=algorithm,
            root=root,
            splits=None if splits is None else tuple(tuple(r) for r in splits),
            params=tuple((params or {}).items()),
        )


# ---------------------------------------------------------------------------------------------- cost model

_FACTOR_ALIASES = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "all_to_all": "alltoall",
    "incast": "gather",
    "sendrecv": "pipeline",
}


def _canon(collective: str) -> str:
    c = str(collective).lower().replace("-", "_")
    return _FACTOR_ALIASES.get(c, c)


def busbw_factor(collective: str, ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw * factor, algbw = nccl-tests size / time.

    One definition, :func:`analysis.metrics.busbw_factor` (its docstring says where each factor comes from);
    this wrapper accepts the schedule's aliases and raises :class:`ScheduleError`. The matching "size" is
    :func:`nccl_size_bytes`. (Imported when called: agents import this module and need no pandas.)
    """
    from analysis.metrics import busbw_factor as _factor

    n = _int("ranks", ranks, 1)
    try:
        return _factor(_canon(collective), n)
    except ValueError:
        raise ScheduleError(f"no bus-bandwidth factor for collective {collective!r}") from None


def nccl_size_bytes(collective: str, ranks: int, message_bytes: int) -> int:
    """The "size" nccl-tests would print for a run where each rank's input is ``message_bytes``.

    nccl-tests reports allgather and gather by their total (gathered) size, n x the per-rank input; all
    other collectives by the per-rank input size.
    """
    n = _int("ranks", ranks, 1)
    m = _int("message_bytes", message_bytes, 1)
    c = _canon(collective)
    busbw_factor(c, n)  # rejects unknown names
    return n * m if c in ("allgather", "gather") else m


def alpha_beta_bound_s(
    collective: str, ranks: int, message_bytes: int, link_bytes_per_s: float, latency_s: float
) -> float:
    """Alpha-beta lower bound (seconds) for ``collective`` when each rank's input is ``message_bytes``.

    Model: every rank has one full-duplex link of ``link_bytes_per_s``; every message costs ``latency_s``.
    Bound = latency term + bandwidth term, as in Chan et al. 2007 (no compute term): the bandwidth term is
    the minimum bytes the busiest link must carry (= nccl_size * busbw_factor / B); the latency term is
    ceil(log2 n) * alpha (any collective that combines or spreads n ranks' data needs that many rounds),
    except pipeline, whose last stage is n-1 hops from the first ((n-1) * alpha).
    """
    n = _int("ranks", ranks, 1)
    m = _int("message_bytes", message_bytes, 1)
    if not isinstance(link_bytes_per_s, (int, float)) or isinstance(link_bytes_per_s, bool) or not link_bytes_per_s > 0:
        raise ScheduleError(f"link_bytes_per_s must be a positive number, got {link_bytes_per_s!r}")
    if not isinstance(latency_s, (int, float)) or isinstance(latency_s, bool) or not latency_s >= 0:
        raise ScheduleError(f"latency_s must be a number >= 0, got {latency_s!r}")
    c = _canon(collective)
    bw = nccl_size_bytes(c, n, m) * busbw_factor(c, n) / float(link_bytes_per_s)
    hops = (n - 1) if c == "pipeline" else math.ceil(math.log2(n)) if n > 1 else 0
    return hops * float(latency_s) + bw


# ---------------------------------------------------------------------------------------------- determinism


def stable_rng(seed: int) -> random.Random:
    """A seeded generator whose ``random()`` stream Python guarantees across versions (use only ``random()``)."""
    return random.Random(_int("seed", seed))


def stable_shuffle(rng: random.Random, items: Sequence[Any]) -> list[Any]:
    """Fisher-Yates on ``rng.random()`` only, so the result never changes across Python/NumPy versions."""
    out = list(items)
    for i in range(len(out) - 1, 0, -1):
        j = min(int(rng.random() * (i + 1)), i)
        out[i], out[j] = out[j], out[i]
    return out
