"""The program event protocol: how a real distributed program (PyTorch, MPI, anything) tells the testbed where its
training steps and communication ops begin and end, so the run's step-time tails, comm-wait and correlation with
queues, drops and pauses come from the program's own clock.

The protocol (docs/programs.md), dependency-free: the launcher sets ``TESTBED_EVENTS`` to a file path, in which a
literal ``{rank}`` stands for the rank's number (RANK, or OMPI_COMM_WORLD_RANK / PMI_RANK under mpirun). The program
appends JSON lines, one object each, with ``t`` in seconds of ``CLOCK_MONOTONIC`` (Python's ``time.monotonic()``,
C's ``clock_gettime(CLOCK_MONOTONIC)``: the clock of every sampler of the run):

    {"event": "step_begin", "step": 3, "t": 1234.5}
    {"event": "op_begin", "name": "grads", "collective": "allreduce", "bytes": 4096, "t": 1234.6}
    {"event": "op_end", "name": "grads", "t": 1234.7}
    {"event": "op", "name": "bucket0", "collective": "allreduce", "bytes": 4096, "start": 1234.6, "end": 1234.7}
    {"event": "step_end", "step": 3, "t": 1234.8}

``op`` is an op reported after the fact (an asynchronous one, e.g. a DDP gradient bucket); ``wait_s`` (optional,
default the op's whole duration: a blocking op) is how long the rank was held by it. Lines that are not such objects
are counted and skipped. In Python, :class:`Events` writes them::

    from traffic.progevents import Events
    events = Events()                      # a no-op when TESTBED_EVENTS is not set
    for step in range(steps):
        with events.step(step):
            ...

:func:`ops_rows` turns every rank's events into ops.csv rows (one per op, or per step without ops), which the
existing analysis reads unchanged. This module never imports torch unless :meth:`Events.ddp_hook` is called.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from contextlib import contextmanager

ENV = "TESTBED_EVENTS"
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
KINDS = ("step_begin", "step_end", "op_begin", "op_end", "op")


def own_rank() -> int:
    """This process's rank, from torchrun's or an MPI launcher's environment (0 when none is set)."""
    for var in RANK_VARS:
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


class Events:
    """The writer of one rank's event file (``TESTBED_EVENTS``, ``{rank}`` replaced); every method is a no-op
    without it. Thread-safe: a DDP communication hook reports from gloo's threads."""

    def __init__(self, path: str | None = None, rank: int | None = None):
        self.rank = own_rank() if rank is None else rank
        path = path if path is not None else os.environ.get(ENV, "")
        self._lock = threading.Lock()
        self._file = open(path.replace("{rank}", str(self.rank)), "a", buffering=1) if path else None

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def emit(self, event: str, **fields) -> None:
        if self._file is None:
            return
        fields.setdefault("t", time.monotonic())
        line = json.dumps({"event": event, "rank": self.rank, **fields}) + "\n"
        with self._lock:
            self._file.write(line)

    @contextmanager
    def step(self, step: int):
        """A training step: step_begin now, step_end when the block ends."""
        self.emit("step_begin", step=step)
        yield
        self.emit("step_end", step=step)

    @contextmanager
    def op(self, name: str, collective: str = "", nbytes: int = 0):
        """A blocking communication op around the block (e.g. ``dist.all_reduce(t)`` or ``comm.Allreduce``)."""
        self.emit("op_begin", name=name, collective=collective, bytes=int(nbytes))
        yield
        self.emit("op_end", name=name)

    def ddp_hook(self, model) -> None:
        """Report each gradient bucket all-reduce of a ``DistributedDataParallel`` model as an ``op`` (launch to
        completion, measured in the hook's future): DDP's default all-reduce, averaged as DDP does."""
        import torch.distributed as dist

        def hook(state, bucket):
            buf = bucket.buffer()
            start, name = time.monotonic(), f"bucket{bucket.index()}"
            nbytes = buf.numel() * buf.element_size()
            fut = dist.all_reduce(buf.div_(dist.get_world_size()), async_op=True).get_future()

            def done(f):
                self.emit("op", name=name, collective="allreduce", bytes=nbytes, start=start, end=time.monotonic())
                return f.value()[0]
            return fut.then(done)

        model.register_comm_hook(None, hook)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# --------------------------------------------------------------------------- reading (the runner's side)

class EventError(ValueError):
    """An event file that cannot be read as the protocol."""


def parse(lines) -> tuple[list[dict], int]:
    """The protocol's events among ``lines`` (in order) and how many lines were skipped (not JSON, not an object,
    an unknown event, a missing or non-numeric time)."""
    events, bad = [], 0
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            e = json.loads(line)
        except ValueError:
            bad += 1
            continue
        times = ("start", "end") if isinstance(e, dict) and e.get("event") == "op" else ("t",)
        if (not isinstance(e, dict) or e.get("event") not in KINDS
                or not all(isinstance(e.get(k), (int, float)) and not isinstance(e.get(k), bool) for k in times)):
            bad += 1
            continue
        events.append(e)
    return events, bad


def rank_records(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """One rank's ``(steps, ops)``: steps ``{step, start_s, end_s}`` (begin and end paired by step number, unpaired
    ones dropped) and ops ``{name, collective, bytes, start_s, end_s, wait_s}`` (op_begin/op_end paired by name in
    order; ``op`` events as they are)."""
    steps, begun, ops, open_ops = {}, {}, [], {}
    for e in events:
        kind = e["event"]
        if kind == "step_begin":
            begun[e.get("step")] = e["t"]
        elif kind == "step_end" and e.get("step") in begun:
            steps[e.get("step")] = {"step": e.get("step"), "start_s": begun.pop(e.get("step")), "end_s": e["t"]}
        elif kind == "op_begin":
            open_ops.setdefault(str(e.get("name", "")), []).append(e)
        elif kind == "op_end" and open_ops.get(str(e.get("name", ""))):
            b = open_ops[str(e.get("name", ""))].pop(0)
            ops.append(_op(b, b["t"], e["t"], e.get("wait_s")))
        elif kind == "op":
            ops.append(_op(e, e["start"], e["end"], e.get("wait_s")))
    return sorted(steps.values(), key=lambda s: s["start_s"]), sorted(ops, key=lambda o: o["start_s"])


def _op(e: dict, start: float, end: float, wait) -> dict:
    wait_s = float(wait) if isinstance(wait, (int, float)) else max(0.0, end - start)
    return {"name": str(e.get("name", "op")), "collective": str(e.get("collective") or "op"),
            "bytes": int(e.get("bytes") or 0), "start_s": float(start), "end_s": float(end), "wait_s": wait_s}


def ops_rows(by_rank: dict[int, list[dict]], hosts: dict[int, str], warmup_steps: int = 0) -> list[dict]:
    """ops.csv rows (traffic.jobplan.OPS_COLUMNS) from every rank's events: iteration = the program's step
    (the first ``warmup_steps`` steps of each rank left out), ``iter_start_s`` = its step_begin; each op inside a
    step is a row (``op_index`` = its order among the step's ops of that name and kind, so the same op of every rank
    shares it); a step without ops is one row ``op = step`` spanning it (no wait). Ops outside any step are dropped."""
    records = {rank: rank_records(by_rank[rank]) for rank in sorted(by_rank)}
    # one op_index per op name for every rank (ranks may see their asynchronous ops complete in other orders)
    index = {n: i for i, n in enumerate(sorted({o["name"] for _, ops in records.values() for o in ops}, key=_natural))}
    rows = []
    for rank, (steps, ops) in records.items():
        for s in steps[warmup_steps:]:
            inside = [o for o in ops if s["start_s"] <= o["start_s"] <= s["end_s"]]
            base = {"iteration": s["step"], "rank": rank, "host": hosts.get(rank, ""), "iter_start_s": s["start_s"]}
            if not inside:
                rows.append({**base, "op": "step", "op_index": 0, "collective": "step", "start_s": s["start_s"],
                             "end_s": s["end_s"], "bytes_sent": 0, "bytes_recv": 0, "wait_s": 0.0,
                             "size_bytes": math.nan})
                continue
            seen: dict[str, int] = {}
            for o in inside:
                k = seen.get(o["name"], 0)
                seen[o["name"]] = k + 1
                rows.append({**base, "op": o["name"], "op_index": index[o["name"]] * 1000 + k,
                             "collective": o["collective"], "start_s": o["start_s"], "end_s": o["end_s"],
                             "bytes_sent": o["bytes"], "bytes_recv": o["bytes"], "wait_s": o["wait_s"],
                             "size_bytes": o["bytes"] or math.nan})
    return rows


def _natural(name: str) -> list:
    """bucket2 before bucket10."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]
