"""The helper schedule generators build with (traffic/collectives): steps, matched transfers, pruning."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from .base import ScheduleError
from .model import Scalar, Schedule
from .steps import Local, RankProgram, Recv, Region, Send, Step


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

    def local(
        self, at: tuple[int, int], src: tuple[str, int, int], dst: tuple[str, int, int], op: str = "copy"
    ) -> None:
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
                    steps.append(Step(tuple(sorted(deps)), tuple(st["local"]), tuple(st["sends"]), tuple(st["recvs"]),
                                      st["label"]))
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
