"""Executing a schedule without a network: the DAG driven with rendezvous semantics (a step completes once the
peer steps holding the other side of its transfers have started), deadlock detection, and the numpy simulator
the real agents are checked against."""

from __future__ import annotations

from collections import deque
from typing import Callable, Sequence

import numpy as np

from .base import ScheduleError
from .steps import RankProgram, Region, ScheduleLike, where


def _index(progs: Sequence[RankProgram]) -> tuple[dict, dict, list[list[list[int]]]]:
    """Where each transfer's two sides sit: (src, dst, tag) -> the step of the send, and of the receive; and per
    rank and step, the later steps that depend on it."""
    send_at: dict[tuple[int, int, int], int] = {}
    recv_at: dict[tuple[int, int, int], int] = {}
    dependents: list[list[list[int]]] = [[[] for _ in p.steps] for p in progs]
    for p in progs:
        for i, st in enumerate(p.steps):
            for op in st.sends:
                send_at[(p.rank, op.peer, op.tag)] = i
            for rv in st.recvs:
                recv_at[(rv.peer, p.rank, rv.tag)] = i
            for d in st.deps:
                dependents[p.rank][d].append(i)
    return send_at, recv_at, dependents


def drive(
    s: ScheduleLike,
    on_start: Callable[[int, int], None] | None = None,
    on_complete: Callable[[int, int], None] | None = None,
) -> None:
    """Run the DAG abstractly with rendezvous semantics; call back on step start/complete; detect deadlock.

    A step starts when its dependencies are complete; it completes once every peer step holding the other
    side of each of its transfers has started.  Assumes matching has been checked.
    """
    progs = s.programs
    send_at, recv_at, dependents = _index(progs)
    waiting = [[len(st.sends) + len(st.recvs) for st in p.steps] for p in progs]
    pending = [[len(st.deps) for st in p.steps] for p in progs]
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
                    raise ScheduleError(f"deadlock: {where(p, i)} {why} (cycle through messages and dependencies)")


# ---------------------------------------------------------------------------------------------- execution


def check_inputs(s: ScheduleLike, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(inputs) != s.ranks:
        raise ScheduleError(f"need {s.ranks} input arrays, got {len(inputs)}")
    out = []
    for r, x in enumerate(inputs):
        a = np.asarray(x)
        if a.shape != (s.count,):
            raise ScheduleError(f"input of rank {r} has shape {a.shape}, need ({s.count},)")
        out.append(a.astype(s.dtype, copy=True))
    return out


def simulate(schedule: ScheduleLike, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Execute ``schedule`` on ``inputs`` (one 1-D array of ``count`` elements per rank) without a network.

    Steps run in an order an agent could produce (dependencies and rendezvous respected); sends take their
    data when their step starts, receives land when their step completes.  Returns each rank's ``output``.
    The schedule is validated first.  This is the reference the real agents are checked against.
    """
    schedule.validate()
    ins = check_inputs(schedule, inputs)
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

    drive(schedule, start, complete)
    return [m["output"].copy() for m in mem]
