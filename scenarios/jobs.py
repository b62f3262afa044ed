#!/usr/bin/env python3
"""Several jobs on one fabric as a run: a jobs file's jobs and storage traffic together (`testbed jobs`' one run),
so that repeats, `compare` and the labs grade it.

    sudo testbed run jobs --set file=labs/13-noisy-neighbours/jobs.toml [--set placement=topo] [--set solo=train]

The jobs file (testbed.commands.jobsfile; docs/operations.md "several jobs") names the fabric, the collective jobs
and the storage traffic; they run together on one Lab (testbed.workloads.multijob), each job in its own folder
``<run>/<job>/``. ``file`` is a path; a relative one is the repository's (``labs/...``, ``examples/jobs/...``).
``placement`` (packed, spread, random, topo; empty: as the file says) places every job again by that policy, in
file order, on the hosts no earlier job and no storage host holds: two runs of one file then differ in placement
only (a job that lists its hosts is refused with it). ``solo`` runs that one job alone on the hosts it gets beside
its neighbours (the others, storage included, are left out): its run without neighbours.

summary.json, per job NAME (the file's job names): ``job_NAME_step_ms_p50``, ``job_NAME_step_ms_p99``,
``job_NAME_cct_ms_p50``, ``job_NAME_cct_ms_p99``, ``job_NAME_overlap`` (the fraction of its run a neighbour ran
beside it, analysis.jobs.overlap), ``job_NAME_leaves`` (leaves its ranks use); for the run, from the kernel's
counters of every switch port over the jobs' common window (port_deltas.csv, analysis.jobs.spine_ports):
``spine_port_bytes`` (every leaf <-> spine port), ``shared_ports`` and ``shared_port_bytes`` (the leaf <-> spine
ports at leaves where two or more entries cross the spine: where their packets meet in one queue),
``shared_port_drops``, ``switch_drops``; ``jobs_n``, ``data_verified`` and ``fidelity_ok`` (every job's).
"""

import sys
from pathlib import Path

from testbed.errors import RunFailed, UsageError
from testbed.params import Param
from testbed.scenario import PROJECT_ROOT, Scenario
from topologies.mininet_topo import SpecTopo
from traffic.placement import POLICIES

P = Param
PARAMS = [
    P("file", str, "examples/jobs/noisy-neighbour.toml", "", "the jobs file (TOML, docs/operations.md#several-jobs); "
      "a relative path is the repository's"),
    P("placement", str, "", "", "place every job again by this policy, in file order, on the hosts no earlier job "
      "or storage host holds (empty: as the file says; a job that lists hosts is refused with it)",
      choices=("", *POLICIES)),
    P("solo", str, "", "", "run only this job of the file, on the hosts it gets beside its neighbours (empty: all)"),
    P("seed", int, 0, "", "placement (random) and the jobs' inputs (0: the run's --seed)", min=0, max=2**31 - 1),
]


def jobs_path(value: str) -> Path:
    """The jobs file ``value`` names: as given when absolute, else the repository's."""
    if not value.strip() or "\x00" in value:
        raise UsageError(f"file: name a jobs file (TOML), e.g. examples/jobs/noisy-neighbour.toml (got {value!r})")
    p = Path(value).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


def jobs_of(p: dict, seed: int):
    """The jobs file of these parameters, read, checked and placed (testbed.commands.jobsfile), with ``placement``
    and ``solo`` applied: a JobsFile, or UsageError (one line)."""
    from testbed import scenario as scenarios
    from testbed.commands import jobsfile

    seed = p["seed"] or seed
    path = jobs_path(p["file"])
    jf = jobsfile.load(path, scenarios.get("collective").params, seed, placement=p["placement"])
    if p["solo"]:
        names = [j.name for j in jf.jobs]
        if p["solo"] not in names:
            raise UsageError(f"solo: {p['solo']!r} is no job of {path.name} (its jobs: {', '.join(names)})")
        jf = jobsfile.solo(jf, p["solo"])
    return jf


def validate(p: dict) -> None:
    jobs_of(p, 1)


def _rdma(p: dict) -> bool:
    return any(j.settings.transport == "rdma" for j in jobs_of(p, 1).jobs)


def needs_for(p: dict) -> tuple:
    """a job with transport = "rdma" adds rxe:netns and pyverbs (SoftRoCE across namespaces, the RDMA agents)."""
    return ("rxe:netns", "pyverbs") if _rdma(p) else ()


def _job_numbers(name: str, s: dict, job_dir: Path, leaves) -> dict:
    from analysis import jobs as aj

    out = {f"job_{name}_{k}": s.get(k) for k in ("step_ms_p50", "step_ms_p99", "cct_ms_p50", "cct_ms_p99",
                                                 "bound_ms")}
    out[f"job_{name}_overlap"] = aj.overlap(job_dir)
    out[f"job_{name}_leaves"] = len(set(leaves))
    return out


def experiment(p: dict, lab) -> dict:
    from analysis import jobs as aj
    from testbed.commands.jobsfile import describe
    from testbed.workloads.multijob import run_together

    jf = jobs_of(p, lab.seed)
    for line in describe(jf):
        lab.progress(line)
    ran = run_together(lab, jf.jobs, jf.checkpoints, jf.datasets, jf.inference)
    summary: dict = {"jobs_n": len(jf.jobs)}
    for j in jf.jobs:
        if j.name in ran.summaries:
            summary.update(_job_numbers(j.name, ran.summaries[j.name], lab.path / j.name, j.leaves))
    where = {j.name: [jf.spec.leaf_of(h) for h in j.hosts] for j in jf.jobs}
    where.update({s.name: [jf.spec.leaf_of(h) for h in (s.storage, *s.hosts)]
                  for s in (*jf.checkpoints, *jf.datasets, *jf.inference)})
    rows = [{"node": n, "port": port, **d} for (n, port), d in ran.ports.items()]
    summary.update(aj.spine_ports(rows, where))
    done = [ran.summaries[j.name] for j in jf.jobs if j.name in ran.summaries]
    summary["data_verified"] = len(done) == len(jf.jobs) and all(bool(s.get("data_verified")) for s in done)
    unfaithful = [f"{j.name}: {ran.summaries[j.name].get('fidelity_reasons') or 'not faithful'}" for j in jf.jobs
                  if j.name in ran.summaries and ran.summaries[j.name].get("fidelity_ok") is False]
    if unfaithful:  # the Lab's own verdict (testbed.measure.verdict) keeps this and adds its own
        summary.update(fidelity_ok=False, fidelity_reasons="; ".join(unfaithful))
    failed = [f"{k}: {v}" for k, v in ran.errors.items()]
    failed += [f"{j.name}: data verification failed" for j in jf.jobs
               if j.name in ran.summaries and not ran.summaries[j.name].get("data_verified")]
    if failed:
        summary["jobs_errors"] = "; ".join(failed)
        lab.rundir.finish(summary)  # keep the evidence, then fail the run (exit status 1; teardown still runs)
        raise RunFailed("jobs: " + "; ".join(failed))
    lab.progress(f"spine ports: {summary['spine_port_bytes']} B sent, {summary['shared_ports']} shared port(s) "
                 f"carrying {summary['shared_port_bytes']} B")
    return summary


SCENARIO = Scenario(
    name="jobs",
    summary="several jobs on one fabric (a jobs file, testbed jobs' one run; placement= re-places every job, solo= "
            "one job alone): each job's step p50/p99, the bytes on leaf <-> spine ports two jobs share",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo"),
    needs_for=needs_for,
    topology=lambda p, seed: SpecTopo(jobs_of(p, seed).spec),
    run=experiment,
    validate=validate,
    agents=True,
    rxe_for=_rdma,
    table=(("jobs_n", "jobs"), ("spine_port_bytes", "bytes on leaf <-> spine ports"),
           ("shared_ports", "leaf <-> spine ports two jobs share"), ("shared_port_bytes", "bytes on shared ports"),
           ("switch_drops", "switch queue drops"), ("data_verified", "data verified"),
           ("fidelity_ok", "fidelity ok")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
