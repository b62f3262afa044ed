"""A jobs file's storage traffic entries (testbed.commands.jobsfile): [[checkpoint]], [[dataset]] and
[[inference]], each read and checked into the entry testbed.workloads.multijob runs beside the collective jobs.
Pure: nothing built; every refusal is a UsageError of one line naming the entry."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.commands.jobsfile_values import MAX_START_S, host_list, number, unknown
from testbed.errors import UsageError
from traffic.job import JobError, parse_size

#: the entry kinds of this module, in the order the jobs file's entries are read
KINDS = ("checkpoint", "dataset", "inference")


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
    unknown(entry, ("name", "server", "hosts", "request_size", "response_size", "every_s", "count", "start_s"),
            where)
    server = entry.get("server")
    if not isinstance(server, str) or server not in known:
        raise UsageError(f"{where}: server: a host of the fabric (got {server!r})")
    hosts = host_list(entry, "hosts", where, known)
    if server in hosts:
        raise UsageError(f"{where}: hosts: the server {server} cannot also be a client")
    return Inference(entry["name"], server, hosts, _size(entry, "request_size", "4K", where),
                     _size(entry, "response_size", "64K", where), number(entry, "every_s", where, 0.5, 0, 3600, True),
                     _count(entry, where), number(entry, "start_s", where, 0.0, 0.0, MAX_START_S))


def storage_entry(entry: dict, kind: str, where: str, known: set[str]) -> Checkpoint | Dataset | Inference:
    """The entry ``entry`` of ``kind`` (one of KINDS) checked against the fabric's hosts ``known``."""
    if kind == "inference":
        return _inference(entry, where, known)
    storage = entry.get("storage")
    if not isinstance(storage, str) or storage not in known:
        raise UsageError(f"{where}: storage: a host of the fabric (got {storage!r})")
    hosts = host_list(entry, "hosts", where, known)
    if storage in hosts:
        raise UsageError(f"{where}: hosts: the storage host {storage} cannot also be one of them")
    start_s = number(entry, "start_s", where, 0.0, 0.0, MAX_START_S)
    if kind == "checkpoint":
        unknown(entry, ("name", "hosts", "storage", "size", "every_s", "count", "start_s"), where)
        size, count = _size(entry, "size", "1M", where), _count(entry, where)
        return Checkpoint(entry["name"], hosts, storage, size, number(entry, "every_s", where, 1.0, 0, 3600, True),
                          count, start_s)
    unknown(entry, ("name", "hosts", "storage", "rate_mbps", "start_s", "duration_s", "dscp"), where)
    return Dataset(entry["name"], storage, hosts, number(entry, "rate_mbps", where, None, 0, 100_000, True),
                   start_s, number(entry, "duration_s", where, 0.0, 0.0, 86_400),
                   int(number(entry, "dscp", where, 0, 0, 63)))
