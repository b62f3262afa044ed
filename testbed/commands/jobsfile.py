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

Here: the file, its [fabric] and its entries' names; the [[job]] entries and their placement are
testbed.commands.jobsfile_jobs', the storage traffic entries testbed.commands.jobsfile_storage's, the checks of
single values testbed.commands.jobsfile_values'.
"""


from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.commands.jobsfile_jobs import JobEntry, job_asked, placed, placed_again
from testbed.commands.jobsfile_storage import KINDS, Checkpoint, Dataset, Inference, storage_entry
from testbed.commands.jobsfile_values import relative, typed, unknown
from testbed.errors import UsageError
from testbed.workloads.jobfabric import FILE_REPLACES, leaf_spine

#: the [fabric] table's keys: the collective scenario's fabric parameters
FABRIC_KEYS = (*FILE_REPLACES, "topology_file")
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")


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

    @property
    def storage_hosts(self) -> set[str]:
        """The hosts the storage traffic's storage ends (and inference servers) run on: no rank runs there."""
        return {s.storage for s in (*self.checkpoints, *self.datasets, *self.inference)}


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
    unknown(table, FABRIC_KEYS, "[fabric]")
    by_name = {q.name: q for q in scenario_params}
    p = {q.name: q.default for q in scenario_params}
    for k, v in table.items():
        p[k] = typed(by_name[k], v, "[fabric]")
    p["topology_file"] = relative(p["topology_file"], base)
    p["ranks"] = 2  # checked per job below; the fabric check only needs a leaf-spine
    try:
        spec = leaf_spine(p, seed, scenario_params)
    except UsageError as e:
        raise UsageError(f"[fabric]: {e}") from None
    return {k: p[k] for k in FABRIC_KEYS}, spec


def _entries(doc: dict) -> list[tuple[str, str, dict]]:
    """(kind, where, entry) of every [[job]], [[checkpoint]], [[dataset]] and [[inference]], names checked."""
    out, seen = [], set()
    for kind in ("job", *KINDS):
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


def load(path: str | Path, scenario_params, seed: int = 1, placement: str = "") -> JobsFile:
    """Read, check and place the jobs file ``path`` (the module docstring); ``scenario_params``: the collective
    scenario's parameters (the fabric's names and defaults). ``placement`` (a traffic.placement policy; empty: as
    the file says): once the file is checked as written, every job is placed again by it, in file order, on the
    hosts no earlier job and no storage host holds (a job that lists its hosts is refused with it). UsageError,
    one line, on anything wrong."""
    path = Path(path)
    try:
        jf, listed = _load(path, scenario_params, seed)
    except UsageError as e:
        raise UsageError(f"jobs file {path}: {e}") from None
    if placement:
        jf = dataclasses.replace(jf, jobs=placed_again(jf.jobs, listed, jf.spec, jf.storage_hosts, placement, seed,
                                                       path.name))
    return jf


def _load(path: Path, scenario_params, seed: int) -> tuple[JobsFile, list[str]]:
    """The file checked and placed as written, and the names of the jobs that list their hosts."""
    doc = read(path)
    base = path.resolve().parent
    unknown(doc, ("fabric", "job", *KINDS, "description"), "top level")
    fabric, spec = fabric_of(doc, base, scenario_params, seed)
    known = {h.name for h in spec.hosts}
    entries = _entries(doc)
    asked = [job_asked(e, where, base, known) for kind, where, e in entries if kind == "job"]
    storage = [storage_entry(e, kind, where, known) for kind, where, e in entries if kind != "job"]
    if not asked:
        raise UsageError("no [[job]]: name at least one collective job")
    if len(entries) < 2:
        raise UsageError("one entry only: a jobs file runs two or more (jobs, checkpoints, datasets) together")
    jobs = placed(asked, spec, {s.storage for s in storage}, seed)
    jf = JobsFile(path, fabric, spec, tuple(jobs), tuple(s for s in storage if isinstance(s, Checkpoint)),
                  tuple(s for s in storage if isinstance(s, Dataset)),
                  tuple(s for s in storage if isinstance(s, Inference)))
    return jf, [a.name for a in asked if a.hosts]


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
