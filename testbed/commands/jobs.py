"""`testbed jobs FILE.toml`: several jobs on one fabric at the same time (issue 27 item 2; the seed article's
section 03: noisy neighbour jobs, checkpointing, dataset streaming). The jobs file (testbed.commands.jobsfile)
names the fabric, two or more collective jobs and storage traffic; they all run together on one Lab
(testbed.workloads.multijob), each job in its own run directory. ``--solo`` also runs each collective job alone on
the same fabric (same hosts, same seed), and the report states each job's slowdown from its neighbours: the step
and CCT p50/p99 ratios together / solo with their intervals (analysis.jobs over analysis.stats).

    OUT/together/seed-S/            the lab's run directory (manifest, storage.csv, port_deltas.csv, summary.json)
    OUT/together/seed-S/<job>/      each job's run directory (ops.csv, sweep.csv, tcp.csv, queues.csv, summary.json)
    OUT/solo-<job>/seed-S/<job>/    the job alone (--solo)
    OUT/jobs.md, OUT/jobs.csv       verdicts first, then one row per job

Bad input: one line and exit status 2 before anything is built; a job that fails or returns wrong data: exit 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from testbed.errors import RunFailed, UsageError, require_root
from testbed.params import parse_seed

# `testbed --help` imports this module: the Lab (Mininet, pyroute2), the lab VM and analysis (pandas) are imported
# inside the functions that use them.

MAX_REPEATS = 50
#: the columns of jobs.md's table (jobs.csv has them all)
MD_COLUMNS = ("job", "hosts", "overlap_min", "step_ms_p50", "step_ms_p50_solo", "step_p50_ratio", "step_p50_low",
              "step_p50_high", "step_ms_p99", "step_ms_p99_solo", "step_p99_ratio", "cct_p50_ratio", "bound_ms",
              "verified", "switch_drops", "fidelity_ok")


def run_once(jf, out: Path, seed: int, quiet: bool) -> dict:
    """One run of ``jf``'s entries together on a fresh fabric into ``out`` (a Lab run directory): its Ran."""
    from testbed.lab import Lab
    from testbed.workloads.multijob import run_together
    from topologies.mininet_topo import SpecTopo

    from testbed.commands.jobsfile import describe

    params = {"jobs_file": str(jf.path), "fabric": jf.fabric, "entries": describe(jf)}
    rxe = any(j.settings.transport == "rdma" for j in jf.jobs)
    with Lab(SpecTopo(jf.spec), out=out, seed=seed, name="jobs", params=params, quiet=quiet, rxe=rxe,
             agents=True) as lab:
        ran = run_together(lab, jf.jobs, jf.checkpoints, jf.datasets, jf.inference)
        for name, s in ran.summaries.items():
            lab.summary.update({f"{name}_{k}": s.get(k) for k in ("step_ms_p50", "step_ms_p99", "cct_ms_p50",
                                                                  "cct_ms_p99", "bound_ms", "data_verified")})
        lab.summary["jobs_errors"] = "; ".join(f"{k}: {v}" for k, v in ran.errors.items())
    return {"errors": ran.errors, "summaries": ran.summaries}


def _vm_argv(args: argparse.Namespace, out: Path) -> list[str]:
    return ["jobs", str(Path(args.file).resolve()), "--repeats", str(args.repeats), "--seed", str(args.seed),
            "--out", str(out), "--vm", "never", *(["--solo"] if args.solo else []),
            *(["--quiet"] if args.quiet else [])]


def main(args: argparse.Namespace) -> int:
    from testbed import scenario as scenarios
    from testbed.commands import jobsfile, runner
    from testbed.commands.repeat import check_repeat
    from testbed.rundir import check_out_dir, default_out
    from testbed.vm import labvm
    from testbed.vm.needs import fabric_needs

    jf = jobsfile.load(args.file, scenarios.get("collective").params, args.seed)
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise UsageError(f"--repeats: from 1 to {MAX_REPEATS} runs (got {args.repeats})")
    check_repeat(args.repeats, args.seed)
    out = check_out_dir(args.out) if args.out else check_out_dir(default_out("jobs"), "--out (default)")
    require_root("testbed jobs")
    needs = fabric_needs(jf.spec) + (["rxe:netns", "pyverbs"] if any(j.settings.transport == "rdma"
                                                                       for j in jf.jobs) else [])
    if runner.use_vm(args.vm, needs, labvm.in_vm()):
        print("testbed jobs: this kernel lacks what the fabric needs; running it in the lab VM", file=sys.stderr)
        labvm.vm_kernel()
        return labvm.run([sys.executable, "-m", "testbed.cli", *_vm_argv(args, out)])
    for line in jobsfile.describe(jf):
        print(f"testbed jobs: {line}", file=sys.stderr)
    t0 = time.monotonic()
    failed = run_all(jf, out, args)
    paths = write_outputs(jf, out, args.solo, args.repeats, args.seed)
    print(paths[0].read_text().split("\n\n| ")[0].strip())
    print(f"({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    for p in paths:
        print(p)
    if failed:
        raise RunFailed("jobs: " + "; ".join(failed))
    return 0


def run_all(jf, out: Path, args: argparse.Namespace) -> list[str]:
    """Every run: together, then (``--solo``) each job alone, each ``--repeats`` times. Returns what failed."""
    from testbed.commands.jobsfile import solo

    failed = []
    seeds = range(args.seed, args.seed + args.repeats)
    plan = [("together", jf)] + ([(f"solo-{j.name}", solo(jf, j.name)) for j in jf.jobs] if args.solo else [])
    for seed in seeds:
        for label, what in plan:
            print(f"testbed jobs: {label}, seed {seed}", file=sys.stderr, flush=True)
            res = run_once(what, out / label / f"seed-{seed}", seed, args.quiet)
            failed += [f"{label} seed {seed} {k}: {v}" for k, v in res["errors"].items()]
            failed += [f"{label} seed {seed} {k}: data verification failed" for k, s in res["summaries"].items()
                       if not s.get("data_verified")]
    return failed


def write_outputs(jf, out: Path, with_solo: bool, repeats: int, seed: int) -> list[Path]:
    """jobs.md (the verdicts first, then the table and the storage traffic) and jobs.csv (one row per job)."""
    import pandas as pd

    from analysis import jobs as aj
    from analysis.render import md_table

    seeds = range(seed, seed + repeats)
    rows = []
    names = jf.names
    for j in jf.jobs:
        together = [out / "together" / f"seed-{s}" / j.name for s in seeds]
        together = [d for d in together if (d / "ops.csv").is_file()]
        solo_dirs = [out / f"solo-{j.name}" / f"seed-{s}" / j.name for s in seeds] if with_solo else []
        solo_dirs = [d for d in solo_dirs if (d / "ops.csv").is_file()]
        if together:
            rows.append(aj.job_row(j.name, ",".join(j.hosts), ", ".join(n for n in names if n != j.name), together,
                                   solo_dirs))
    storage = []
    for s in seeds:
        p = out / "together" / f"seed-{s}" / "storage.csv"
        if p.is_file():
            storage += _plain(p)
    df = pd.DataFrame(rows)
    paths = [out / "jobs.md", out / "jobs.csv"]
    df.to_csv(paths[1], index=False)
    head = [aj.verdict_line(r) for r in rows] or ["no job finished"]
    sp = jf.spec
    where = (f"{len(jf.jobs)} job(s) and {len(jf.checkpoints) + len(jf.datasets) + len(jf.inference)} storage or "
             f"inference stream(s) from "
             f"{jf.path.name} on {sp.spines} spine(s) x {sp.leaves} leaves x {sp.hosts_per_leaf} hosts (hosts at "
             f"{sp.host_link.rate_mbps:g} Mbit/s, fabric links at {sp.fabric_link.rate_mbps:g} Mbit/s), "
             f"{repeats} run(s) together" + (" and as many of each job alone" if with_solo else "") + ".")
    body = ["# Several jobs on one fabric", "\n".join(f"- {h}" for h in head), where]
    if storage:
        body.append("\n".join(f"- {x}" for x in aj.storage_lines(storage)))
    if len(df):
        body.append(md_table(df[[c for c in MD_COLUMNS if c in df.columns]].round(2)))
        body.append("Every column (CCT ratios, p99 intervals, verdicts): jobs.csv.")
    paths[0].write_text("\n\n".join(body) + "\n")
    return paths


def _plain(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def add_parser(sub) -> None:
    p = sub.add_parser("jobs", help="several jobs on one fabric at once; --solo: each job's slowdown from its "
                       "neighbours", description="Run the collective jobs, checkpoint writes and dataset streams "
                       "of a jobs file (TOML, docs/operations.md#several-jobs) together on one fabric, each job in "
                       "its own run directory (OUT/together/seed-S/JOB/). --solo also runs each job alone on the same "
                       "fabric (same hosts, same seed) and states its slowdown beside the others: step and CCT "
                       "p50/p99 together / alone with 95%% intervals. Writes OUT/jobs.md (verdicts first) and "
                       "OUT/jobs.csv.")
    p.add_argument("file", metavar="FILE.toml", help="the jobs file (examples/jobs/noisy-neighbour.toml)")
    p.add_argument("--solo", action="store_true", help="also run each job alone (its slowdown from its neighbours)")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="runs of each (seeds --seed .. --seed+N-1; p99 ratios get an interval from 2 runs a side)")
    p.add_argument("--seed", type=parse_seed, default=1, metavar="N", help="seed of the first run (default 1)")
    p.add_argument("--out", default=None, metavar="DIR", help="folder (default results/jobs-TIME)")
    p.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                   help="run in the lab VM: auto (when this kernel lacks a capability), always, never")
    p.add_argument("--quiet", action="store_true", help="only the command's own progress lines")
    p.set_defaults(func=main)


__all__ = ["add_parser", "main", "run_all", "run_once", "write_outputs"]
