"""Disjoint groups of ranks running the same collective at once, as one op: what a parallelism dimension's
communicators do together (every tensor-parallel group's all-reduce of a layer, every data-parallel group's
gradient bucket). Each group runs ``sub`` (a schedule over the group's size) with its ranks mapped to the group's
global ranks; the result is a ``custom`` schedule whose expected output is its simulation (each group's own
collective: a sum over the group, not over everyone)."""

from __future__ import annotations

from dataclasses import replace

from ..schedule import RankProgram, Schedule, ScheduleError

__all__ = ["grouped"]


def grouped(sub: Schedule, groups: list[list[int]], ranks: int) -> Schedule:
    """``sub`` run by every group in ``groups`` (disjoint lists of global ranks, each ``sub.ranks`` long, in the
    group's own rank order) at the same time, over ``ranks`` ranks; a rank in no group has nothing to do."""
    seen: set[int] = set()
    for g in groups:
        if len(g) != sub.ranks:
            raise ScheduleError(f"group {g} has {len(g)} ranks, the schedule {sub.ranks}")
        for r in g:
            if not 0 <= r < ranks or r in seen:
                raise ScheduleError(f"group {g}: rank {r} out of range or in two groups")
            seen.add(r)
    programs: list[RankProgram | None] = [None] * ranks
    for g in groups:
        for p in sub.programs:
            steps = tuple(replace(st, sends=tuple(replace(s, peer=g[s.peer]) for s in st.sends),
                                  recvs=tuple(replace(r, peer=g[r.peer]) for r in st.recvs)) for st in p.steps)
            programs[g[p.rank]] = RankProgram(g[p.rank], p.buffers, steps)
    for r in range(ranks):
        if programs[r] is None:
            programs[r] = RankProgram(r, (("input", sub.count), ("output", 0)), ())
    return Schedule("custom", ranks, sub.count, tuple(programs), dtype=sub.dtype,
                    algorithm=f"{sub.collective}-{sub.algorithm}-grouped",
                    params=(("collective", sub.collective), ("group_size", sub.ranks), ("groups", len(groups)),
                            ("message_bytes", sub.message_bytes)))
