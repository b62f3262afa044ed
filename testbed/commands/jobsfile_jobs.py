"""A jobs file's [[job]] entries (testbed.commands.jobsfile): each collective job's settings checked, then its ranks
placed on the fabric's hosts, as a cluster scheduler hands each job its own nodes. Pure: nothing built; every
refusal is a UsageError of one line naming the entry.

A job's ranks run on the hosts it names (in rank order), or the placement policy (traffic.placement) places them on
the hosts no other job and no storage host holds: jobs with hosts first, then the rest in file order. Placed again
(``placed_again``), every job gets its hosts from one policy, in file order."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from testbed.commands.jobsfile_values import MAX_START_S, host_list, number, relative, typed, unknown
from testbed.errors import UsageError
from testbed.workloads.settings import JOB_PARAMS, CollectiveSettings
from traffic.placement import Placement, PlacementError, place

#: job parameters a jobs file does not take: neighbours are entries of their own, not a job's background
JOB_REFUSED = {"background": "give the flows their own [[dataset]] or [[checkpoint]] entry",
               "bg_dscp": "give the flows their own [[dataset]] or [[checkpoint]] entry",
               "bg_rate_mbps": "give the flows their own [[dataset]] or [[checkpoint]] entry",
               "gpus_per_host": "one rank per host in a jobs file (the scale-up domain is not shaped here)"}
#: a job's own keys besides the job parameters
JOB_OWN = ("name", "hosts", "start_s", "dscp", "cc", "sample_interval_ms")


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
class JobAsked:
    """A [[job]] entry checked, not yet placed: ``knobs`` (its JOB_PARAMS values), ``run`` (dscp, cc,
    sample_interval_ms), the ``hosts`` it lists (empty: placed by its placement policy)."""
    where: str
    name: str
    knobs: dict
    run: dict
    hosts: tuple[str, ...]
    start_s: float


def _job_knobs(entry: dict, where: str, base: Path) -> tuple[dict, dict]:
    """The job's JOB_PARAMS values (defaults, then the entry's) and its run keys (dscp, cc, sample_interval_ms)."""
    by_name = {q.name: q for q in JOB_PARAMS}
    for k in entry:
        if k in JOB_REFUSED:
            raise UsageError(f"{where}: {k} is not taken in a jobs file: {JOB_REFUSED[k]}")
    unknown(entry, (*by_name, *JOB_OWN), where)
    knobs = {q.name: q.default for q in JOB_PARAMS}
    for k, v in entry.items():
        if k in by_name:
            if k == "size" and isinstance(v, int) and not isinstance(v, bool):
                v = str(v)
            knobs[k] = typed(by_name[k], v, where)
    for k in ("trace_file", "schedule_file"):
        knobs[k] = relative(knobs[k], base)
    run = {"dscp": int(number(entry, "dscp", where, 0, 0, 63)),
           "sample_interval_ms": number(entry, "sample_interval_ms", where, 10.0, 0, 1000)}
    cc = entry.get("cc", "")
    if cc not in ("", "cubic", "reno", "dctcp", "bbr"):
        raise UsageError(f"{where}: cc: one of cubic, reno, dctcp, bbr (got {cc!r})")
    run["cc"] = cc
    return knobs, run


def job_asked(entry: dict, where: str, base: Path, known: set[str]) -> JobAsked:
    """The [[job]] ``entry`` checked against the job parameters and the fabric's hosts ``known``; relative paths
    are ``base``'s."""
    knobs, run = _job_knobs(entry, where, base)
    hosts: tuple[str, ...] = ()
    if "hosts" in entry:
        if "placement" in entry:
            raise UsageError(f"{where}: give hosts or placement, not both")
        hosts = host_list(entry, "hosts", where, known)
        if "ranks" in entry and entry["ranks"] != len(hosts):
            raise UsageError(f"{where}: ranks = {entry['ranks']} but {len(hosts)} hosts are listed")
        knobs["ranks"] = len(hosts)
        if len(hosts) < 2:
            raise UsageError(f"{where}: hosts: a collective job needs at least 2 hosts")
    start_s = number(entry, "start_s", where, 0.0, 0.0, MAX_START_S)
    return JobAsked(where, entry["name"], knobs, run, hosts, start_s)


def _take(ranks: int, policy: str, seed: int, spec, held: dict[str, str], name: str) -> Placement:
    """``ranks`` placed by ``policy`` on the hosts of ``spec`` not in ``held`` (fabric order), which ``name`` then
    holds."""
    pool = [(h.name, spec.leaf_of(h.name)) for h in spec.hosts if h.name not in held]
    pl = place(ranks, pool, policy, seed)
    held.update(dict.fromkeys(pl.hosts, name))
    return pl


def placed(asked: list[JobAsked], spec, storage_hosts: set[str], seed: int) -> list[JobEntry]:
    """Every job of ``asked`` on its hosts (the module docstring), its settings checked against the fabric
    ``spec``; ``seed``: a job's placement and plan seed unless it sets its own."""
    held: dict[str, str] = {}
    for a in asked:
        for h in a.hosts:
            if h in held:
                raise UsageError(f"{a.where}: hosts: {h} already runs job {held[h]}")
            if h in storage_hosts:
                raise UsageError(f"{a.where}: hosts: {h} is a storage host")
            held[h] = a.name
    held.update(dict.fromkeys(storage_hosts, ""))
    jobs = []
    for a in asked:
        hosts, policy = a.hosts, (a.knobs["placement"] if not a.hosts else "packed")
        if not hosts:
            try:
                hosts = _take(a.knobs["ranks"], policy, a.knobs["seed"] or seed, spec, held, a.name).hosts
            except PlacementError as e:
                raise UsageError(f"{a.where}: placement {policy}: {e} (of the hosts no other job or storage "
                                 f"holds)") from None
        try:
            settings = CollectiveSettings.from_params(a.knobs, **a.run)
            settings.plan(spec, seed)  # what the fabric cannot take (schedule sizes, rdma_mtu, ...)
        except UsageError as e:
            raise UsageError(f"{a.where}: {e}") from None
        jobs.append(JobEntry(a.name, settings, tuple(hosts), tuple(spec.leaf_of(h) for h in hosts), policy,
                             a.start_s))
    return jobs


def placed_again(jobs: tuple[JobEntry, ...], listed: list[str], spec, storage_hosts: set[str], policy: str,
                 seed: int, file_name: str) -> tuple[JobEntry, ...]:
    """``jobs`` (placed as their file says) each placed again by ``policy``, in file order, on the hosts no earlier
    job and no storage host holds; refused when a job lists its hosts (``listed``: their names)."""
    if listed:
        raise UsageError(f"placement={policy}: job {listed[0]} lists its hosts in {file_name}; give it ranks "
                         f"instead, or leave placement empty")
    held = dict.fromkeys(storage_hosts, "")
    out = []
    for j in jobs:
        try:
            pl = _take(len(j.hosts), policy, j.settings.seed or seed, spec, held, j.name)
        except PlacementError as e:
            raise UsageError(f"placement={policy}: job {j.name}: {e} (of the hosts no earlier job or storage "
                             f"holds)") from None
        out.append(dataclasses.replace(j, hosts=tuple(pl.hosts), leaves=tuple(pl.leaves), policy=policy))
    return tuple(out)
