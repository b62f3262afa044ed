"""Shared helpers of the schedule generators (not public API)."""

from __future__ import annotations

from ..schedule import ScheduleError, offsets_of, split_evenly

__all__ = ["pieces", "segments", "check_root", "no_opts"]


def pieces(offset: int, size: int, chunks: int) -> list[tuple[int, int]]:
    """(offset, count) of the ``chunks`` pipelining pieces of [offset, offset+size); some may be empty."""
    sizes = split_evenly(size, chunks)
    return [(offset + o, s) for o, s in zip(offsets_of(sizes), sizes)]


def segments(count: int, parts: int) -> list[tuple[int, int]]:
    """(offset, count) of ``parts`` contiguous segments of ``count`` elements, remainder spread."""
    return pieces(0, count, parts)


def check_root(root: object, ranks: int) -> int:
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < ranks:
        raise ScheduleError(f"root must be a rank in 0..{ranks - 1}, got {root!r}")
    return root


def no_opts(name: str, opts: dict) -> None:
    if opts:
        raise ScheduleError(f"unknown option {sorted(opts)[0]!r} for {name}")
