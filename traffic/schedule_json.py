"""The JSON file format of schedules (``format: "testbed-schedule"``, ``version: 1``); see docs/schedules.md.

:func:`loads` / :func:`load` are strict: unknown or missing keys, wrong types, out-of-range values and any
failure of :meth:`Schedule.validate` raise :class:`ScheduleError` with a one-line message that names the bad
field by its path, e.g. ``programs[2].steps[5].sends[0].peer: must be an integer, got string "1"``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .schedule import ACTIONS, DTYPES, Local, RankProgram, Recv, Region, Schedule, ScheduleError, Send, Step

__all__ = ["FORMAT", "VERSION", "to_dict", "from_dict", "dumps", "loads", "dump", "load"]

FORMAT = "testbed-schedule"
VERSION = 1


def _region(r: Region) -> list[Any]:
    return [r.buffer, r.offset, r.count]


def _step(st: Step) -> dict[str, Any]:
    d: dict[str, Any] = {"deps": list(st.deps)}
    if st.local:
        d["local"] = [{"src": _region(lo.src), "dst": _region(lo.dst), "op": lo.op} for lo in st.local]
    if st.sends:
        d["sends"] = [{"peer": s.peer, "tag": s.tag, "src": _region(s.src)} for s in st.sends]
    if st.recvs:
        d["recvs"] = [{"peer": r.peer, "tag": r.tag, "dst": _region(r.dst), "op": r.op} for r in st.recvs]
    if st.label:
        d["label"] = st.label
    return d


def to_dict(schedule: Schedule) -> dict[str, Any]:
    """The JSON-ready dict of ``schedule`` (see docs/schedules.md for the format)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "collective": schedule.collective,
        "algorithm": schedule.algorithm,
        "ranks": schedule.ranks,
        "count": schedule.count,
        "dtype": schedule.dtype,
        "root": schedule.root,
        "splits": None if schedule.splits is None else [list(r) for r in schedule.splits],
        "params": dict(schedule.params),
        "programs": [
            {"rank": p.rank, "buffers": dict(p.buffers), "steps": [_step(st) for st in p.steps]}
            for p in schedule.programs
        ],
    }


def dumps(schedule: Schedule, indent: int | None = None) -> str:
    """Serialise; with ``indent`` None each step is written on its own line (compact yet diffable)."""
    d = to_dict(schedule)
    if indent is not None:
        return json.dumps(d, indent=indent) + "\n"
    progs = d.pop("programs")
    head = json.dumps(d)[:-1]
    parts = []
    for p in progs:
        steps = ",\n".join("      " + json.dumps(st) for st in p["steps"])
        parts.append(
            f'    {{"rank": {p["rank"]}, "buffers": {json.dumps(p["buffers"])}, "steps": [\n{steps}\n    ]}}'
            if p["steps"]
            else f'    {{"rank": {p["rank"]}, "buffers": {json.dumps(p["buffers"])}, "steps": []}}'
        )
    return head + ', "programs": [\n' + ",\n".join(parts) + "\n]}\n"


def dump(schedule: Schedule, path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(dumps(schedule))


def dump_for_ranks(schedule: Schedule, folder: str | os.PathLike[str], stem: str) -> str:
    """One file per rank, ``<stem>.rank<r>.json`` in ``folder``: the whole schedule's header, rank r's program, and
    every other rank's buffers without steps (what :func:`load` with ``for_rank=r`` builds). An agent then reads
    1/N of the schedule instead of all of it: at 128 ranks the whole file is 8 MB of JSON that every agent would
    parse. Returns the file name pattern, with ``{rank}`` in it."""
    d = to_dict(schedule)
    progs = d.pop("programs")
    os.makedirs(folder, exist_ok=True)
    pattern = stem + ".rank{rank}.json"
    for r in range(schedule.ranks):
        own = [p if i == r else {"rank": i, "buffers": p["buffers"], "steps": []} for i, p in enumerate(progs)]
        with open(os.path.join(folder, pattern.format(rank=r)), "w", encoding="utf-8") as f:
            json.dump({**d, "programs": own}, f)
    return pattern


# ---------------------------------------------------------------------------------------------- loading


def _tname(v: object) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
            type(None): "null"}.get(
        type(v), type(v).__name__
    )


def _fail(path: str, msg: str) -> ScheduleError:
    return ScheduleError(f"{path}: {msg}")


def _obj(v: object, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise _fail(path, f"must be an object, got {_tname(v)}")
    for k in v:
        if k not in required and k not in optional:
            raise _fail(path, f"unknown key {k!r} (allowed: {', '.join(required + optional)})")
    for k in required:
        if k not in v:
            raise _fail(path, f"missing key {k!r}")
    return v


def _int(v: object, path: str, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _fail(path, f"must be an integer, got {_tname(v)} {json.dumps(v)[:40]}")
    if v < minimum:
        raise _fail(path, f"must be >= {minimum}, got {v}")
    return v


def _str(v: object, path: str) -> str:
    if not isinstance(v, str):
        raise _fail(path, f"must be a string, got {_tname(v)}")
    return v


def _list(v: object, path: str) -> list[Any]:
    if not isinstance(v, list):
        raise _fail(path, f"must be an array, got {_tname(v)}")
    return v


def _region_from(v: object, path: str) -> Region:
    if not isinstance(v, list) or len(v) != 3:
        raise _fail(path, "must be a [buffer, offset, count] array")
    buf = _str(v[0], f"{path}[0]")
    off = _int(v[1], f"{path}[1]", 0)
    cnt = _int(v[2], f"{path}[2]", 1)
    try:
        return Region(buf, off, cnt)
    except ScheduleError as e:
        raise _fail(path, str(e)) from None


def _action(v: object, path: str) -> str:
    if v not in ACTIONS:
        raise _fail(path, f"must be one of {', '.join(ACTIONS)}, got {json.dumps(v)[:40]}")
    return v  # type: ignore[return-value]


def _step_from(v: object, path: str) -> Step:
    d = _obj(v, path, (), ("deps", "local", "sends", "recvs", "label"))
    deps = tuple(_int(x, f"{path}.deps[{i}]") for i, x in enumerate(_list(d.get("deps", []), f"{path}.deps")))
    local = []
    for i, x in enumerate(_list(d.get("local", []), f"{path}.local")):
        p = f"{path}.local[{i}]"
        o = _obj(x, p, ("src", "dst"), ("op",))
        src, dst = _region_from(o["src"], f"{p}.src"), _region_from(o["dst"], f"{p}.dst")
        op = _action(o.get("op", "copy"), f"{p}.op")
        try:
            local.append(Local(src, dst, op))
        except ScheduleError as e:
            raise _fail(p, str(e)) from None
    sends = []
    for i, x in enumerate(_list(d.get("sends", []), f"{path}.sends")):
        p = f"{path}.sends[{i}]"
        o = _obj(x, p, ("peer", "tag", "src"))
        sends.append(Send(_int(o["peer"], f"{p}.peer"), _int(o["tag"], f"{p}.tag"), _region_from(o["src"], f"{p}.src")))
    recvs = []
    for i, x in enumerate(_list(d.get("recvs", []), f"{path}.recvs")):
        p = f"{path}.recvs[{i}]"
        o = _obj(x, p, ("peer", "tag", "dst"), ("op",))
        recvs.append(
            Recv(_int(o["peer"], f"{p}.peer"), _int(o["tag"], f"{p}.tag"), _region_from(o["dst"], f"{p}.dst"),
                 _action(o.get("op", "copy"), f"{p}.op"))
        )
    label = _str(d.get("label", ""), f"{path}.label")
    try:
        return Step(deps, tuple(local), tuple(sends), tuple(recvs), label)
    except ScheduleError as e:
        raise _fail(path, str(e)) from None


def _params_from(params: object) -> dict:
    if not isinstance(params, dict):
        raise _fail("params", f"must be an object, got {_tname(params)}")
    for k, v in params.items():
        if not (v is None or isinstance(v, (bool, int, float, str))):
            raise _fail(f"params.{k}", f"must be a number, string, boolean or null, got {_tname(v)}")
    return params


def _program_from(pv: object, r: int, whole: bool) -> RankProgram:
    """Rank ``r``'s program; without ``whole`` its buffers only (the steps are not read)."""
    path = f"programs[{r}]"
    po = _obj(pv, path, ("rank", "buffers", "steps"))
    rank = _int(po["rank"], f"{path}.rank")
    if rank != r:
        raise _fail(f"{path}.rank", f"must be {r} (programs are in rank order), got {rank}")
    bufs = po["buffers"]
    if not isinstance(bufs, dict):
        raise _fail(f"{path}.buffers", f"must be an object, got {_tname(bufs)}")
    buffers = tuple((k, _int(v, f"{path}.buffers.{k}")) for k, v in bufs.items())
    steps = (tuple(_step_from(sv, f"{path}.steps[{i}]") for i, sv in enumerate(_list(po["steps"], f"{path}.steps")))
             if whole else ())
    try:
        return RankProgram(rank, buffers, steps)
    except ScheduleError as e:
        raise _fail(path, str(e)) from None


def from_dict(d: object, for_rank: int | None = None) -> Schedule:
    """Build and validate a schedule from its JSON dict; raise :class:`ScheduleError` naming the bad field.

    ``for_rank``: what one agent needs of a schedule its controller already validated: that rank's program in full,
    every other rank's buffers without steps, no whole-schedule validation (a custom schedule, whose expected
    result is simulated from every program, is still built whole). At 64 ranks this is 30 ms instead of 0.6 s of
    CPU per agent: building every rank's program in every agent is quadratic in the ranks."""
    top = _obj(
        d,
        "schedule",
        ("format", "version", "collective", "ranks", "count", "programs"),
        ("algorithm", "dtype", "root", "splits", "params"),
    )
    if top["format"] != FORMAT:
        raise _fail("format", f"must be {FORMAT!r}, got {json.dumps(top['format'])[:40]}")
    if _int(top["version"], "version") != VERSION:
        raise _fail("version", f"unsupported version {top['version']} (this reader knows {VERSION})")
    collective = _str(top["collective"], "collective")
    algorithm = _str(top.get("algorithm", "custom"), "algorithm")
    ranks = _int(top["ranks"], "ranks", 1)
    count = _int(top["count"], "count", 1)
    dtype = _str(top.get("dtype", "float32"), "dtype")
    if dtype not in DTYPES:
        raise _fail("dtype", f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    root = top.get("root")
    if root is not None:
        root = _int(root, "root")
    splits = top.get("splits")
    if splits is not None:
        splits = tuple(
            tuple(_int(x, f"splits[{i}][{j}]") for j, x in enumerate(_list(row, f"splits[{i}]")))
            for i, row in enumerate(_list(splits, "splits"))
        )
    params = _params_from(top.get("params", {}))
    progs = _list(top["programs"], "programs")
    if len(progs) != ranks:
        raise _fail("programs", f"has {len(progs)} entries, ranks is {ranks}")
    programs = [_program_from(pv, r, for_rank is None or r == for_rank or collective == "custom")
                for r, pv in enumerate(progs)]
    try:
        schedule = Schedule(
            collective=collective,
            ranks=ranks,
            count=count,
            programs=tuple(programs),
            dtype=dtype,
            algorithm=algorithm,
            root=root,
            splits=splits,
            params=tuple(params.items()),
        )
    except ScheduleError as e:
        raise _fail("schedule", str(e)) from None
    if for_rank is not None:
        return schedule
    try:
        return schedule.validate()
    except ScheduleError as e:
        raise _fail("schedule", str(e)) from None


def loads(text: str | bytes, for_rank: int | None = None) -> Schedule:
    """Parse and validate a schedule from JSON text (``for_rank``: see :func:`from_dict`)."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ScheduleError(f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except (UnicodeDecodeError, TypeError) as e:
        raise ScheduleError(f"invalid JSON: {e}") from None
    return from_dict(d, for_rank)


def load(path: str | os.PathLike[str], for_rank: int | None = None) -> Schedule:
    """Read, parse and validate a schedule file (``for_rank``: see :func:`from_dict`); errors name the file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ScheduleError(f"{os.fspath(path)}: cannot read: {e.strerror}") from None
    try:
        return loads(data, for_rank)
    except ScheduleError as e:
        raise ScheduleError(f"{os.fspath(path)}: {e}") from None
