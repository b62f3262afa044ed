"""A rank's program: its buffers and its steps (local copies and reductions, then sends and receives posted at once),
the per-rank DAG an agent walks. Each value checks itself on construction and raises :class:`ScheduleError`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Protocol

from .base import ACTIONS, ScheduleError, check_int

_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")




@dataclass(frozen=True)
class Region:
    """A contiguous run of ``count`` elements of one of a rank's buffers, starting at element ``offset``."""

    buffer: str
    offset: int
    count: int

    def __post_init__(self) -> None:
        if not isinstance(self.buffer, str) or not _NAME.fullmatch(self.buffer):
            raise ScheduleError(f"buffer name must match [a-z][a-z0-9_]*, got {self.buffer!r}")
        object.__setattr__(self, "offset", check_int("region offset", self.offset, 0))
        object.__setattr__(self, "count", check_int("region count", self.count, 1))

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
        object.__setattr__(self, "peer", check_int("send peer", self.peer, 0))
        object.__setattr__(self, "tag", check_int("send tag", self.tag, 0))
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
        object.__setattr__(self, "peer", check_int("recv peer", self.peer, 0))
        object.__setattr__(self, "tag", check_int("recv tag", self.tag, 0))
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
            raise ScheduleError(
                f"local op sizes differ: {self.src} has {self.src.count}, {self.dst} has {self.dst.count}")
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
        deps = tuple(check_int("dependency", d, 0) for d in self.deps)
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
        rank = check_int("rank", self.rank, 0)
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
            bufs.append((name, check_int(f"rank {rank} buffer {name!r} size", size, 0)))
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


def where(p: RankProgram, i: int) -> str:
    label = p.steps[i].label
    return f"rank {p.rank} step {i}" + (f" ({label})" if label else "")



class ScheduleLike(Protocol):
    """What the simulator and the reference outputs read from a :class:`~traffic.schedule.model.Schedule` (the model
    module imports them, so they name its fields here instead of importing it back)."""

    collective: str
    ranks: int
    count: int
    dtype: str
    root: int | None
    splits: tuple[tuple[int, ...], ...] | None
    programs: tuple[RankProgram, ...]

    def validate(self) -> object: ...
