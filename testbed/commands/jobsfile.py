"""A jobs file (TOML): several jobs on one fabric, what `testbed jobs` runs. Pure: read, checked and placed here,
nothing built; every refusal is a UsageError of one line naming the file and the entry.

    [fabric]                      # the collective scenario's fabric parameters, or topology_file = "fabric.toml"
    spines = 1
    leaves = 2
    hosts_per_leaf = 3

    [[job]]                       # a collective job: the collective scenario's job parameters (JOB_PARAMS)
    name = "train"
    collective = "allreduce"
    size = "256K"
    hosts = ["h1", "h2", "h4", "h5"]   # or ranks = 4 with placement = "packed" | "spread" | "random"
    iterations = 15
    start_s = 0                   # after every job's agents are connected (the jobs' common t = 0)

    [[checkpoint]]                # periodic writes: every writer sends size bytes to storage, every every_s
    name = "ckpt"
    hosts = ["h3"]
    storage = "h6"
    size = "512K"
    every_s = 1.0
    count = 5

    [[dataset]]                   # steady streaming: storage sends to every reader at rate_mbps (paced)
    name = "data"
    storage = "h6"
    hosts = ["h1", "h2"]
    rate_mbps = 2

    [[inference]]                 # request/response windows: every client sends a request to the server at the
    name = "serve"                # same instant, the server answers each; count windows, every_s apart
    server = "h6"
    hosts = ["h3"]
    request_size = "4K"
    response_size = "256K"
    every_s = 0.5
    count = 8

A job's ranks run on the hosts it names (in rank order), or the placement policy (traffic.placement) places them
on the hosts no other job and no storage host holds, jobs with hosts first, then the rest in file order. Jobs never
share a host; a storage host runs no rank. Relative paths (topology_file, trace_file, schedule_file) are the
jobs file's folder's.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import UsageError
from testbed.params import Param
from testbed.workloads.jobfabric import FILE_REPLACES, leaf_spine
from testbed.workloads.settings import JOB_PARAMS, CollectiveSettings
from traffic.job import JobError, parse_size
from traffic.placement import PlacementError, place

#: the [fabric] table's keys: the collective scenario's fabric parameters
FABRIC_KEYS = (*FILE_REPLACES, "topology_file")
#: job parameters a jobs file does not take: neighbours are entries of their own, not a job's background
JOB_REFUSED = {"background": "give the flows their own [[dataset]] or [[checkpoint]] entry",
               "bg_dscp": "give the flows their own [[dataset]] or [[checkpoint]] entry",
               "bg_rate_mbps": "give the flows their own [[dataset]] or [[checkpoint]] entry",
               "gpus_per_host": "one rank per host in a jobs file (the scale-up domain is not shaped here)"}
#: a job's own keys besides the job parameters
JOB_OWN = ("name", "hosts", "start_s", "dscp", "cc", "sample_interval_ms")
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
MAX_START_S = 600.0


@dataclass(frozen=True)
class JobEntry:
    """One collective job: its settings, the hosts of its ranks (rank order) and their leaves, its start."""
    name: str
    settings: CollectiveSettings
    hosts: tuple[str, ...]
    leaves: tuple[str, ...]
    policy: str
    start_s: float


@dataclass(frozen=True)
class Checkpoint:
    """Periodic checkpoint writes: each of ``hosts`` writes ``size_bytes`` to ``storage`` at the same instant (one
    persistent TCP connection each), ``count`` times, ``every_s`` apart from ``start_s``."""
    name: str
    hosts: tuple[str, ...]
    storage: str
    size_bytes: int
    every_s: float
    count: int
    start_s: float


@dataclass(frozen=True)
class Dataset:
    """Dataset streaming: one TCP flow from ``storage`` to each of ``hosts``, paced at ``rate_mbps``, from
    ``start_s`` for ``duration_s`` (0: until the last collective job ends), packets marked ``dscp``."""
    name: str
    storage: str
    hosts: tuple[str, ...]
    rate_mbps: float
    start_s: float
    duration_s: float
    dscp: int


@dataclass(frozen=True)
class Inference:
    """Inference request/response windows: in each of ``count`` windows, ``every_s`` apart from ``start_s``, every
    client of ``hosts`` sends ``request_bytes`` to ``server`` at the same instant, and once the server holds them
    all it answers each client with ``response_bytes`` (all at once): a window's latency is its first request's
    start to the last response's arrival."""
    name: str
    server: str
    hosts: tuple[str, ...]
    request_bytes: int
    response_bytes: int
    every_s: float
    count: int
    start_s: float

    @property
    def storage(self) -> str:  # the host that runs no rank
        return self.server


@dataclass(frozen=True)
class JobsFile:
    """A jobs file, checked and placed: the fabric's parameters ``fabric`` and its spec, the jobs, the storage
    traffic."""
    path: Path
    fabric: dict
    spec: Any
    jobs: tuple[JobEntry, ...]
    checkpoints: tuple[Checkpoint, ...]
    datasets: tuple[Dataset, ...]
    inference: tuple[Inference, ...] = ()

    @property
    def names(self) -> list[str]:
        return [e.name for e in (*self.jobs, *self.checkpoints, *self.datasets, *self.inference)]


def _typed(q: Param, v: Any, where: str) -> Any:
    """``v`` checked against the parameter ``q`` (type, range, choices); an int for a float becomes a float."""
    if q.kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, q.kind) or (q.kind is not bool and isinstance(v, bool)):
        raise UsageError(f"{where}: {q.name}: not a valid {q.kind.__name__} ({v!r})")
    try:
        q.check(v)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return v


def _number(entry: dict, key: str, where: str, default: float | None, low: float, high: float,
            low_open: bool = False) -> float:
    v = entry.get(key, default)
    if v is None:
        raise UsageError(f"{where}: {key} is required")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UsageError(f"{where}: {key}: a number (got {v!r})")
    if v < low or (low_open and v == low) or v > high:
        raise UsageError(f"{where}: {key}: must be {'>' if low_open else '>='} {low:g} and <= {high:g} (got {v!r})")
    return float(v)


def _host_list(entry: dict, key: str, where: str, known: set[str]) -> tuple[str, ...]:
    v = entry.get(key)
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(h, str) for h in v):
        raise UsageError(f"{where}: {key}: a list of host names, e.g. [\"h1\", \"h2\"] (got {v!r})")
    for h in v:
        if h not in known:
            raise UsageError(f"{where}: {key}: unknown host {h!r} (hosts: {', '.join(sorted(known, key=_order))})")
    if len(set(v)) != len(v):
        raise UsageError(f"{where}: {key}: a host is listed twice ({v!r})")
    return tuple(v)


def _order(h: str) -> tuple:
    m = re.match(r"^([a-z]+)(\d+)$", h)
    return (m.group(1), int(m.group(2))) if m else (h, 0)


def _unknown(entry: dict, allowed, where: str) -> None:
    extra = [k for k in entry if k not in allowed]
    if extra:
        raise UsageError(f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(allowed))})")


def _relative(value: str, base: Path) -> str:
    return value if not value or Path(value).is_absolute() else str((base / value).resolve())


def read(path: str | Path) -> dict:
    """The file's TOML document, or UsageError (one line) when it cannot be read or parsed."""
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"jobs file {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"jobs file {path}: is a folder, not a file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"jobs file {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"jobs file {path}: not valid TOML ({e})") from None


def fabric_of(doc: dict, base: Path, scenario_params, seed: int) -> tuple[dict, Any]:
    """The [fabric] table as the collective scenario's parameters and the leaf-spine they describe."""
    table = doc.get("fabric", {})
    if not isinstance(table, dict):
        raise UsageError("[fabric] must be a table")
    _unknown(table, FABRIC_KEYS, "[fabric]")
    by_name = {q.name: q for q in scenario_params}
    p = {q.name: q.default for q in scenario_params}
    for k, v in table.items():
        p[k] = _typed(by_name[k], v, "[fabric]")
    p["topology_file"] = _relative(p["topology_file"], base)
    p["ranks"] = 2  # checked per job below; the fabric check only needs a leaf-spine
    try:
        spec = leaf_spine(p, seed, scenario_params)
    except UsageError as e:
        raise UsageError(f"[fabric]: {e}") from None
    return {k: p[k] for k in FABRIC_KEYS}, spec


def _job_knobs(entry: dict, where: str, base: Path) -> tuple[dict, dict]:
    """The job's JOB_PARAMS values (defaults, then the entry's) and its run keys (dscp, cc, sample_interval_ms)."""
    by_name = {q.name: q for q in JOB_PARAMS}
    for k in entry:
        if k in JOB_REFUSED:
            raise UsageError(f"{where}: {k} is not taken in a jobs file: {JOB_REFUSED[k]}")
    _unknown(entry, (*by_name, *JOB_OWN), where)
    knobs = {q.name: q.default for q in JOB_PARAMS}
    for k, v in entry.items():
        if k in by_name:
            if k == "size" and isinstance(v, int) and not isinstance(v, bool):
                v = str(v)
            knobs[k] = _typed(by_name[k], v, where)
    for k in ("trace_file", "schedule_file"):
        knobs[k] = _relative(knobs[k], base)
    run = {"dscp": int(_number(entry, "dscp", where, 0, 0, 63)),
           "sample_interval_ms": _number(entry, "sample_interval_ms", where, 10.0, 0, 1000)}
    cc = entry.get("cc", "")
    if cc not in ("", "cubic", "reno", "dctcp", "bbr"):
        raise UsageError(f"{where}: cc: one of cubic, reno, dctcp, bbr (got {cc!r})")
    run["cc"] = cc
    return knobs, run


def _job(entry: dict, where: str, base: Path, known: set[str]) -> tuple[str, dict, dict, tuple, float]:
    name = entry["name"]
    knobs, run = _job_knobs(entry, where, base)
    hosts: tuple[str, ...] = ()
    if "hosts" in entry:
        if "placement" in entry:
            raise UsageError(f"{where}: give hosts or placement, not both")
        hosts = _host_list(entry, "hosts", where, known)
        if "ranks" in entry and entry["ranks"] != len(hosts):
            raise UsageError(f"{where}: ranks = {entry['ranks']} but {len(hosts)} hosts are listed")
        knobs["ranks"] = len(hosts)
        if len(hosts) < 2:
            raise UsageError(f"{where}: hosts: a collective job needs at least 2 hosts")
    start_s = _number(entry, "start_s", where, 0.0, 0.0, MAX_START_S)
    return name, knobs, run, hosts, start_s


def _size(entry: dict, key: str, default: str, where: str) -> int:
    try:
        return parse_size(entry.get(key, default))
    except JobError as e:
        raise UsageError(f"{where}: {key}: {e}") from None


def _count(entry: dict, where: str) -> int:
    count = entry.get("count", 3)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10_000:
        raise UsageError(f"{where}: count: an integer from 1 to 10000 (got {count!r})")
    return count


def _inference(entry: dict, where: str, known: set[str]) -> Inference:
    _unknown(entry, ("name", "server", "hosts", "request_size", "response_size", "every_s", "count", "start_s"),
             where)
    server = entry.get("server")
    if not isinstance(server, str) or server not in known:
        raise UsageError(f"{where}: server: a host of the fabric (got {server!r})")
    hosts = _host_list(entry, "hosts", where, known)
    if server in hosts:
        raise UsageError(f"{where}: hosts: the server {server} cannot also be a client")
    return Inference(entry["name"], server, hosts, _size(entry, "request_size", "4K", where),
                     _size(entry, "response_size", "64K", where), _number(entry, "every_s", where, 0.5, 0, 3600, True),
                     _count(entry, where), _number(entry, "start_s", where, 0.0, 0.0, MAX_START_S))


def _storage(entry: dict, kind: str, where: str, known: set[str]):
    if kind == "inference":
        return _inference(entry, where, known)
    storage = entry.get("storage")
    if not isinstance(storage, str) or storage not in known:
        raise UsageError(f"{where}: storage: a host of the fabric (got {storage!r})")
    hosts = _host_list(entry, "hosts", where, known)
    if storage in hosts:
        raise UsageError(f"{where}: hosts: the storage host {storage} cannot also be one of them")
    start_s = _number(entry, "start_s", where, 0.0, 0.0, MAX_START_S)
    if kind == "checkpoint":
        _unknown(entry, ("name", "hosts", "storage", "size", "every_s", "count", "start_s"), where)
        size, count = _size(entry, "size", "1M", where), _count(entry, where)
        return Checkpoint(entry["name"], hosts, storage, size, _number(entry, "every_s", where, 1.0, 0, 3600, True),
                          count, start_s)
    _unknown(entry, ("name", "hosts", "storage", "rate_mbps", "start_s", "duration_s", "dscp"), where)
    return Dataset(entry["name"], storage, hosts, _number(entry, "rate_mbps", where, None, 0, 100_000, True),
                   start_s, _number(entry, "duration_s", where, 0.0, 0.0, 86_400),
                   int(_number(entry, "dscp", where, 0, 0, 63)))


def _entries(doc: dict) -> list[tuple[str, str, dict]]:
    """(kind, where, entry) of every [[job]], [[checkpoint]] and [[dataset]], names checked."""
    out, seen = [], set()
    for kind in ("job", "checkpoint", "dataset", "inference"):
        items = doc.get(kind, [])
        if not isinstance(items, list) or not all(isinstance(e, dict) for e in items):
            raise UsageError(f"{kind}: write each as a [[{kind}]] table")
        for i, e in enumerate(items):
            name = e.get("name")
            where = f"[[{kind}]] {name}" if isinstance(name, str) else f"[[{kind}]] number {i + 1}"
            if not isinstance(name, str) or not NAME_RE.match(name):
                raise UsageError(f"{where}: name: a letter, then letters, digits, '-' or '_' (up to 40; it names "
                                 f"the job's folder) (got {name!r})")
            if name in seen:
                raise UsageError(f"{where}: the name {name!r} is used twice")
            seen.add(name)
            out.append((kind, where, e))
    return out


def load(path: str | Path, scenario_params, seed: int = 1) -> JobsFile:
    """Read, check and place the jobs file ``path`` (the module docstring); ``scenario_params``: the collective
    scenario's parameters (the fabric's names and defaults). UsageError, one line, on anything wrong."""
    path = Path(path)
    try:
        return _load(path, scenario_params, seed)
    except UsageError as e:
        raise UsageError(f"jobs file {path}: {e}") from None


def _load(path: Path, scenario_params, seed: int) -> JobsFile:
    doc = read(path)
    base = path.resolve().parent
    _unknown(doc, ("fabric", "job", "checkpoint", "dataset", "inference", "description"), "top level")
    fabric, spec = fabric_of(doc, base, scenario_params, seed)
    leaf_of = {h.name: spec.leaf_of(h.name) for h in spec.hosts}
    known = set(leaf_of)
    entries = _entries(doc)
    jobs_raw = [(where, _job(e, where, base, known)) for kind, where, e in entries if kind == "job"]
    storage = [_storage(e, kind, where, known) for kind, where, e in entries if kind != "job"]
    if not jobs_raw:
        raise UsageError("no [[job]]: name at least one collective job")
    if len(entries) < 2:
        raise UsageError("one entry only: a jobs file runs two or more (jobs, checkpoints, datasets) together")
    storage_hosts = {s.storage for s in storage}
    held: dict[str, str] = {}
    for where, (name, _, _, hosts, _) in jobs_raw:
        for h in hosts:
            if h in held:
                raise UsageError(f"{where}: hosts: {h} already runs job {held[h]}")
            if h in storage_hosts:
                raise UsageError(f"{where}: hosts: {h} is a storage host")
            held[h] = name
    jobs = []
    for where, (name, knobs, run, hosts, start_s) in jobs_raw:
        policy = knobs["placement"] if not hosts else "packed"
        if not hosts:
            pool = [(h.name, leaf_of[h.name]) for h in spec.hosts if h.name not in held and h.name not in storage_hosts]
            try:
                hosts = place(knobs["ranks"], pool, policy, knobs["seed"] or seed).hosts
            except PlacementError as e:
                raise UsageError(f"{where}: placement {policy}: {e} (of the hosts no other job or storage "
                                 f"holds)") from None
            held.update({h: name for h in hosts})
        try:
            settings = CollectiveSettings.from_params(knobs, **run)
            settings.plan(spec, seed)  # what the fabric cannot take (schedule sizes, rdma_mtu, ...)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
        jobs.append(JobEntry(name, settings, tuple(hosts), tuple(leaf_of[h] for h in hosts), policy, start_s))
    return JobsFile(path, fabric, spec, tuple(jobs), tuple(s for s in storage if isinstance(s, Checkpoint)),
                    tuple(s for s in storage if isinstance(s, Dataset)),
                    tuple(s for s in storage if isinstance(s, Inference)))


def describe(jf: JobsFile) -> list[str]:
    """One line per entry: what runs where."""
    lines = [f"{j.name}: {j.settings.collective if not (j.settings.parallel or j.settings.trace) else 'model'} "
             f"{j.settings.size} x {len(j.hosts)} ranks on {','.join(j.hosts)} ({j.policy}), "
             f"{j.settings.iterations} iterations, dscp {j.settings.dscp}, start {j.start_s:g} s" for j in jf.jobs]
    lines += [f"{c.name}: checkpoint {','.join(c.hosts)} -> {c.storage}, {c.size_bytes} B each every {c.every_s:g} s "
              f"x {c.count} from {c.start_s:g} s" for c in jf.checkpoints]
    lines += [f"{d.name}: dataset {d.storage} -> {','.join(d.hosts)} at {d.rate_mbps:g} Mbit/s each from "
              f"{d.start_s:g} s" for d in jf.datasets]
    lines += [f"{i.name}: inference {','.join(i.hosts)} -> {i.server} ({i.request_bytes} B requests, "
              f"{i.response_bytes} B responses) every {i.every_s:g} s x {i.count} from {i.start_s:g} s"
              for i in jf.inference]
    return lines


def solo(jf: JobsFile, job: str) -> JobsFile:
    """The same file with only ``job`` (same fabric, same hosts, same seed): the job alone."""
    return dataclasses.replace(jf, jobs=tuple(j for j in jf.jobs if j.name == job), checkpoints=(), datasets=(),
                               inference=())


__all__ = ["Checkpoint", "Dataset", "FABRIC_KEYS", "Inference", "JobEntry", "JobsFile", "describe", "load", "read",
           "solo"]
