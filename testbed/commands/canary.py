"""`testbed canary`: a transport tuning change tried on a canary slice of the fabric before the whole fabric gets it
(issue 27 item 4; the seed article's "canary jobs after firmware and driver changes, rollback playbooks for
transport-level tuning changes").

One leaf-spine fabric is built with the current settings (``--set``: its shape, rates, downlink buffer and
discipline, the hosts' cc and rto_min_ms, and the job's knobs). The change (``--change KEY=VALUE``,
testbed.commands.canary_change) is applied live to the canary slice (``--canary leaf1``: those leaves' host ports
and their hosts); the control slice is the same number of other leaves, untouched, of the same shape. The job runs
on both slices **at the same time** (one thread per slice, started together): the slices share no port (each
slice's job stays inside its leaves), so they do not load each other's queues, and running them together gives
both sides the same share of the shared machine's CPU noise, which one-after-the-other runs would not. Each of
``--repeats`` runs opens fresh connections. analysis.canary decides: roll out (the change goes on every leaf, the
job runs once more on every slice at once, and is checked against the canary's interval) or roll back (the canary
slice is put back). Everything is torn down after (it is a Lab).

The job (``--job incast``, or a TOML FILE of its knobs): on each slice leaf, every other host of the leaf sends
``block_bytes`` to its first host in ``rounds`` synchronized rounds (traffic.incast); the metric is the job's
completion time, the sum of its rounds.

Files in OUT: canary.md (the decision log, the verdict first), canary.json (with the kernel read-backs and any
mismatch against what each step meant to set), canary.csv (one row per run and side), canary_rounds.csv (one row per
round) and the run directory's manifest and summary.json (analysis.canary.summary_numbers). :func:`on_lab` is the
whole canary on a live Lab: scenarios/canary.py runs it as a scenario (repeats, compare, lab 14). Exit status 0
rolled out, 1 rolled back, 2 bad input (one line, before anything is built).
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
from pathlib import Path

from testbed.errors import RunFailed, UsageError, require_root
from testbed.params import Param, parse_seed, resolve

FABRIC = [
    Param("spines", int, 1, "", "spines", min=1, max=8),
    Param("leaves", int, 2, "", "leaves (at least twice the canary's)", min=2, max=16),
    Param("hosts_per_leaf", int, 4, "", "hosts per leaf (one receiver, the others send)", min=2, max=16),
    Param("host_rate_mbps", float, 20.0, "Mbit/s", "host link rate", min=1, max=1000),
    Param("fabric_rate_mbps", float, 20.0, "Mbit/s", "leaf-spine link rate", min=1, max=1000),
    Param("buffer_bytes", int, 64_000, "bytes", "buffer of each leaf's host ports", min=1600, max=1 << 30),
    Param("discipline", str, "droptail", "", "queue of the leaves' host ports", choices=("droptail", "red", "step")),
    Param("k_bytes", int, 20_000, "bytes", "RED min threshold / step marking K", min=1500, max=1 << 30),
    Param("ecn", bool, False, "", "hosts negotiate ECN"),
    Param("cc", str, "cubic", "", "hosts' congestion control", choices=("cubic", "reno", "dctcp", "bbr")),
    Param("rto_min_ms", int, 200, "ms", "hosts' per-route rto_min", min=1, max=120_000),
    Param("block_bytes", int, 20_000, "bytes", "incast: block each sender sends per round", min=1000,
          max=10_000_000),
    Param("rounds", int, 20, "", "incast: rounds per run", min=1, max=1000),
]
JOB_KEYS = ("block_bytes", "rounds")
MIN_REPEATS = 4  # analysis.stats.MIN_RUNS_FOR_VERDICT: fewer runs a side can never be told apart


def job_sets(job: str) -> list[str]:
    """``--job``: ``incast`` (no extra settings) or a TOML file whose ``[job]`` table sets the incast's knobs."""
    if job == "incast":
        return []
    if job == "allreduce":
        raise UsageError("--job allreduce: not available in canaries yet (incast, or a TOML file of its knobs)")
    path = Path(job)
    if not path.is_file():
        raise UsageError(f"--job: no such job file {job!r} (incast, or a TOML file with a [job] table)")
    import tomllib

    try:
        table = tomllib.loads(path.read_text()).get("job", {})
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"--job {job}: not valid TOML ({e})") from None
    kind = table.pop("kind", "incast")
    if kind != "incast":
        raise UsageError(f"--job {job}: kind {kind!r} is not supported (incast)")
    bad = sorted(set(table) - set(JOB_KEYS))
    if bad:
        raise UsageError(f"--job {job}: unknown key {bad[0]!r} (keys: {', '.join(JOB_KEYS)})")
    return [f"{k}={v}" for k, v in table.items()]


def slices(p: dict, canary_text: str) -> tuple[list[str], list[str]]:
    """The canary leaves and as many untouched control leaves (the first others, in order)."""
    names = [f"leaf{i}" for i in range(1, p["leaves"] + 1)]
    canary = [x.strip() for x in canary_text.split(",") if x.strip()]
    for c in canary:
        if c not in names:
            raise UsageError(f"--canary: no leaf {c!r} (leaves: {', '.join(names)})")
    if not canary or len(set(canary)) != len(canary):
        raise UsageError(f"--canary takes distinct leaf names, e.g. leaf1 (got {canary_text!r})")
    others = [n for n in names if n not in canary]
    if len(others) < len(canary):
        raise UsageError(f"--canary {canary_text}: {p['leaves']} leaves leave no equal control slice "
                         f"(--set leaves={2 * len(canary)})")
    return canary, others[:len(canary)]


def build_spec(p: dict, seed: int):
    from topologies import HostTcpSpec, SpecError, uniform_leaf_spine
    from testbed.workloads.bottleneck import bottleneck_queue, check_marking

    check_marking(p)
    try:
        return uniform_leaf_spine(p["spines"], p["leaves"], p["hosts_per_leaf"], p["host_rate_mbps"],
                                  p["fabric_rate_mbps"], leaf_down_queue=bottleneck_queue(p), seed=seed % 2**32,
                                  tcp=HostTcpSpec(congestion_control=p["cc"], ecn=p["ecn"],
                                                  rto_min_ms=p["rto_min_ms"]))
    except SpecError as e:
        raise UsageError(str(e)) from None


# ---- the job ----

def _incast_on(lab, leaf: str, p: dict, cc: str, port: int) -> dict:
    """One run of the incast on one leaf: its first host receives, the others send."""
    from analysis.metrics import round_times
    import pandas as pd
    from testbed.kernel import netns
    from testbed.measure.tcprecord import TcpCounters
    from traffic.incast import IncastRounds

    hosts = list(lab.net.spec.hosts_of(leaf))
    receiver, senders = hosts[0], hosts[1:]
    tcp = TcpCounters({h: lab.net.ns(h) for h in hosts})
    drops = lab.port_deltas([(leaf, receiver)])
    inc = IncastRounds(senders, receiver, lab.endpoints(hosts), netns.entered, p["block_bytes"], port=port, cc=cc)
    try:
        inc.connect()
        rows = inc.run(p["rounds"])
    finally:
        inc.close()
    rounds = round_times(pd.DataFrame(rows, columns=["round", "sender", "start_s", "end_s", "bytes"]))
    round_ms = [float(x) * 1e3 for x in rounds["round_s"]]
    delta = tcp.stop()
    drops.stop()
    return {"job_ms": sum(round_ms), "round_ms_max": max(round_ms), "rounds": len(round_ms), "round_ms": round_ms,
            "tcp_timeouts": sum(d.get("TcpExtTCPTimeouts", 0) for d in delta.values()),
            "tcp_retrans_segs": sum(d.get("TcpRetransSegs", 0) for d in delta.values()),
            "port_drops": drops.total("drops")}


def run_together(lab, jobs: list[tuple[str, str, list[str], str]], p: dict) -> list[dict]:
    """Run the job on every (side, slice leaves) at the same time; one row per (side, leaf). ``jobs``: (side,
    phase, leaves, cc)."""
    work = [(side, phase, leaf, cc) for side, phase, leaves, cc in jobs for leaf in leaves]
    ports = {w: lab.next_ports(1) for w in work}
    rows: dict[tuple, dict] = {}
    start = threading.Barrier(len(work))

    def one(w):
        side, phase, leaf, cc = w
        try:
            start.wait(timeout=30)
            rows[w] = {"phase": phase, "side": side, "leaf": leaf, "ok": True, "error": "",
                       **_incast_on(lab, leaf, p, cc, ports[w])}
        except Exception as e:  # noqa: BLE001 - a failed run is a result (the rule rolls back on it)
            rows[w] = {"phase": phase, "side": side, "leaf": leaf, "ok": False, "error": str(e)[:200],
                       "job_ms": math.nan}

    threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [rows[w] for w in work]


def side_values(rows: list[dict], side: str, phase: str) -> list[float]:
    """Each run's job time on one side: the slowest of the slice's leaves (a slice's job ends with its last leaf);
    a run with a failed leaf has no value."""
    by_run: dict[int, list] = {}
    for r in rows:
        if r["side"] == side and r["phase"] == phase:
            by_run.setdefault(r["run"], []).append(r["job_ms"] if r["ok"] else math.nan)
    return [max(v) for _, v in sorted(by_run.items()) if all(math.isfinite(x) for x in v)]


# ---- the canary ----

def experiment(lab, p: dict, change, canary: list[str], control: list[str], repeats: int, rule) -> dict:
    """Apply, measure both sides, decide, then roll out (and verify) or roll back. Returns what the log needs."""
    from analysis import canary as decision_rules
    from testbed.commands import canary_change as cc_mod

    fabric = lab.net.fabric
    after = change.after()
    lab.progress(f"applying {change.text()} to the canary slice {','.join(canary)}")
    cc_mod.apply(fabric, canary, change)
    applied = {"canary": cc_mod.read_back(fabric, canary), "control": cc_mod.read_back(fabric, control)}
    rows: list[dict] = []
    for i in range(repeats):
        for r in run_together(lab, [("canary", "canary", canary, after["cc"]),
                                    ("control", "canary", control, p["cc"])], p):
            rows.append({"run": i + 1, **r})
        last = {s: side_values(rows[-len(canary) * 2:], s, "canary") for s in ("canary", "control")}
        lab.progress(f"run {i + 1}/{repeats}: canary {last['canary']} ms, control {last['control']} ms")
    can, ctl = side_values(rows, "canary", "canary"), side_values(rows, "control", "canary")
    failed = repeats - len(can)
    decision = decision_rules.decide(can, ctl, failed, rule)
    verification, final = None, decision.action
    every = [f"leaf{i}" for i in range(1, p["leaves"] + 1)]
    if decision.rolled_out:
        lab.progress("rolling out to every leaf, then one fabric-wide run")
        cc_mod.apply(fabric, [x for x in every if x not in canary], change)
        applied["rolled_out"] = cc_mod.read_back(fabric, every)
        for r in run_together(lab, [("fabric", "verify", every, after["cc"])], p):
            rows.append({"run": 1, **r})
        verification = decision_rules.verify([r["job_ms"] if r["ok"] else math.nan for r in rows
                                              if r["phase"] == "verify"], decision)
        if not verification.ok:
            final = decision_rules.ROLL_BACK
            cc_mod.apply(fabric, every, change, undo=True)
            applied["rolled_back"] = cc_mod.read_back(fabric, every)
    else:
        lab.progress("rolling back the canary slice")
        cc_mod.apply(fabric, canary, change, undo=True)
        applied["rolled_back"] = cc_mod.read_back(fabric, canary)
    return {"rows": rows, "decision": decision, "verification": verification, "final": final, "applied": applied}


def readback_problems(result: dict, change) -> list[str]:
    """Did the kernel hold what each step of the experiment meant it to (canary_change.mismatches)? The canary slice
    the change, the control slice the fabric's settings, and at the end every leaf the change (rolled out) or the
    canary slice the fabric's settings again (rolled back). Empty: every read-back agreed."""
    from testbed.commands import canary_change as cc_mod

    meant = {"canary": change.after(), "control": change.base, "rolled_out": change.after(),
             "rolled_back": change.base}
    return [f"{step}: {m}" for step, found in result["applied"].items()
            for m in cc_mod.mismatches(found, meant[step])]


def on_lab(lab, p: dict, change, canary: list[str], control: list[str], repeats: int, rule, seed: int) -> dict:
    """The whole canary on a live Lab (its fabric built from :func:`build_spec`): :func:`experiment`, the kernel
    read-backs checked, the decision log written into the run directory. Returns the experiment's result with
    ``problems`` (read-back mismatches), ``log`` (canary.md's path) and ``summary`` (analysis.canary's numbers for
    summary.json)."""
    from analysis.canary import summary_numbers

    result = experiment(lab, p, change, canary, control, repeats, rule)
    result["problems"] = readback_problems(result, change)
    for line in result["problems"]:
        lab.progress(f"read-back: {line}")
    result["log"] = write_log(Path(lab.path), result, change, p, canary, control, seed)
    rounds = {side: [x for r in result["rows"] if r["phase"] == "canary" and r["side"] == side and r["ok"]
                     for x in r["round_ms"]] for side in ("canary", "control")}
    counters = {f"{side}_{k}": sum(r.get(k, 0) for r in result["rows"] if r["phase"] == "canary" and
                                   r["side"] == side) for side in ("canary", "control")
                for k in ("tcp_timeouts", "port_drops")}
    result["summary"] = {**summary_numbers(result["decision"], result["verification"], result["final"], rounds,
                                           not result["problems"]),
                         **counters, "decision_log": result["log"].name}
    return result


def readback_text(found: dict) -> str:
    """The distinct values the kernel reported on a slice: its ports' qdisc limits, its hosts' rto_min and ECN."""
    limits = sorted({f"{v['qdisc']} limit {v['limit']}" for v in found.values() if "qdisc" in v})
    rto = sorted({x for v in found.values() for x in v.get("rto_min_ms", [])})
    ecn = sorted({v["tcp_ecn"] for v in found.values() if "tcp_ecn" in v})
    return (f"(ports {', '.join(limits)}; routes rto_min {', '.join(f'{x} ms' for x in rto) or 'default'}; "
            f"tcp_ecn {', '.join(map(str, ecn))})")


def write_log(out: Path, result: dict, change, p: dict, canary: list[str], control: list[str], seed: int) -> Path:
    """canary.md (verdict first), canary.json and canary.csv."""
    import json

    import pandas as pd

    from analysis import canary as decision_rules

    d, v = result["decision"], result["verification"]
    slice_text = "leaves {} ({} hosts each, {} Mbit/s)"
    notes = [f"Job: incast on each slice leaf ({p['hosts_per_leaf'] - 1} senders x {p['block_bytes']} B to the leaf's "
             f"first host, {p['rounds']} rounds a run); the metric is its completion time (the rounds summed). Both "
             f"slices ran at the same time on disjoint leaves, seed {seed}; fabric settings: "
             + ", ".join(f"{k}={p[k]}" for k in ("buffer_bytes", "discipline", "ecn", "cc", "rto_min_ms")) + ".",
             "Read back from the kernel after applying: " + "; ".join(
                 f"{k} {readback_text(v)}" for k, v in result["applied"].items()) + "."]
    md = decision_rules.log_markdown(change.text(), slice_text.format(",".join(canary), p["hosts_per_leaf"],
                                                                      p["host_rate_mbps"]),
                                     slice_text.format(",".join(control), p["hosts_per_leaf"], p["host_rate_mbps"]),
                                     d, v, result["final"], notes)
    (out / "canary.md").write_text(md)
    doc = {"action": result["final"], "change": change.values, "fabric": change.base, "canary": canary,
           "control": control, "seed": seed, "decision": d.as_dict(),
           "verification": v.as_dict() if v else None, "applied": result["applied"],
           "readback_problems": result.get("problems", []), "params": p}
    (out / "canary.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    pd.DataFrame([{k: x for k, x in r.items() if k != "round_ms"} for r in result["rows"]]).to_csv(
        out / "canary.csv", index=False)
    pd.DataFrame([{"run": r["run"], "phase": r["phase"], "side": r["side"], "leaf": r["leaf"], "round": i + 1,
                   "round_ms": x} for r in result["rows"] for i, x in enumerate(r.get("round_ms", []))],
                 columns=["run", "phase", "side", "leaf", "round", "round_ms"]).to_csv(out / "canary_rounds.csv",
                                                                                      index=False)
    return out / "canary.md"


def plan(p: dict, change_texts: list[str], canary_text: str, repeats: int, tolerance: float, ceiling: float) -> tuple:
    """The experiment's plan from resolved fabric settings, checked before anything is built: (change, canary
    leaves, control leaves, rule); UsageError (one line) for a bad change, slice, repeat count or rule."""
    from analysis.canary import Rule
    from testbed.commands import canary_change

    change = canary_change.parse_changes(change_texts, {k: p[k] for k in ("buffer_bytes", "discipline", "k_bytes",
                                                                          "ecn", "cc", "rto_min_ms")})
    canary, control = slices(p, canary_text)
    if repeats < MIN_REPEATS:
        raise UsageError(f"--repeats must be at least {MIN_REPEATS}: fewer runs a side can never tell a difference")
    try:
        rule = Rule(tolerance, ceiling)
    except ValueError as e:
        raise UsageError(f"--tolerance/--ceiling: {e}") from None
    return change, canary, control, rule


def validate(args: argparse.Namespace) -> tuple:
    """Everything checked before anything is built: (params, change, canary, control, rule, spec); UsageError."""
    p = resolve(FABRIC, [*job_sets(args.job), *(args.set or [])])
    change, canary, control, rule = plan(p, args.change, args.canary, args.repeats, args.tolerance, args.ceiling)
    return p, change, canary, control, rule, build_spec(p, args.seed)


def main(args: argparse.Namespace) -> int:
    from testbed.commands import runner
    from testbed.lab import Lab
    from testbed.rundir import check_out_dir, default_out
    from testbed.vm import labvm
    from topologies.mininet_topo import SpecTopo

    p, change, canary, control, rule, spec = validate(args)
    require_root("testbed canary")
    out = check_out_dir(args.out) if args.out else check_out_dir(default_out("canary"), "--out (default)")
    from testbed.workloads.bottleneck import bottleneck_needs

    needs = sorted(set(bottleneck_needs(p)) | set(change.needs()) | {"qdisc:htb", "qdisc:bfifo"})
    if runner.use_vm(args.vm, needs, labvm.in_vm(), missing=runner.missing_capabilities):
        print(f"testbed canary: this kernel lacks what the change needs ({', '.join(needs)}); running in the lab VM",
              file=sys.stderr)
        labvm.vm_kernel()
        return labvm.run([sys.executable, "-m", "testbed.cli", "canary", *sum((["--change", c] for c in args.change),
                                                                               []),
                          *sum((["--set", s] for s in args.set), []), "--job", args.job, "--canary", args.canary,
                          "--repeats", str(args.repeats), "--tolerance", str(args.tolerance), "--ceiling",
                          str(args.ceiling), "--seed", str(args.seed), "--out", str(out), "--vm", "never"])
    params = {**p, "change": change.text(), "canary": canary, "control": control, "repeats": args.repeats}
    try:
        with Lab(SpecTopo(spec), out=out, seed=args.seed, name="canary", params=params, quiet=args.quiet) as lab:
            result = on_lab(lab, p, change, canary, control, args.repeats, rule, args.seed)
            lab.summary.update({"action": result["final"], **result["summary"]})
    except (UsageError, RunFailed):
        raise
    except Exception as e:  # noqa: BLE001 - e.g. the kernel refusing a change (netlink): one line, torn down by now
        raise RunFailed(f"testbed canary: {type(e).__name__}: {e} (the fabric is torn down; {out})") from e
    path = result["log"]
    print(path.read_text().split("\n- change")[0].strip())
    print(path)
    return 0 if result["final"] == "roll out" else 1


def add_parser(sub) -> None:
    from analysis.canary import DEFAULT_CEILING, DEFAULT_TOLERANCE

    c = sub.add_parser("canary", help="try a transport tuning change on a canary slice, then roll out or back",
                       description="Build a leaf-spine fabric with the current settings (--set), apply --change to "
                       "the canary leaves and their hosts, run the job (--repeats times) on the canary and on an "
                       "equal untouched control slice at the same time, and decide with analysis.stats: roll out "
                       "(apply everywhere, run once more fabric-wide, check) or roll back. Writes OUT/canary.md, "
                       "canary.json, canary.csv. Exit 0 rolled out, 1 rolled back, 2 bad input.")
    c.add_argument("--change", action="append", default=[], metavar="KEY=VALUE",
                   help="buffer_bytes, discipline, k_bytes, ecn, rto_min_ms or cc (repeatable: one change)")
    c.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="the fabric's current settings and the job's knobs: " + ", ".join(x.name for x in FABRIC))
    c.add_argument("--job", default="incast", metavar="incast|FILE", help="the job (a TOML FILE: [job] "
                   "block_bytes, rounds)")
    c.add_argument("--canary", default="leaf1", metavar="LEAF[,LEAF]", help="the canary slice (default leaf1)")
    c.add_argument("--repeats", type=int, default=5, metavar="N", help=f"runs a side (default 5, least {MIN_REPEATS})")
    c.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"accepted slowdown, canary / control median (default {DEFAULT_TOLERANCE})")
    c.add_argument("--ceiling", type=float, default=DEFAULT_CEILING,
                   help=f"roll back if the ratio's interval reaches above this (default {DEFAULT_CEILING})")
    c.add_argument("--seed", type=parse_seed, default=1, metavar="N", help="the fabric's seed (default 1)")
    c.add_argument("--out", default=None, metavar="DIR", help="folder (default results/canary-TIME)")
    c.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                   help="run in the lab VM: auto (when this kernel lacks what the change needs), always, never")
    c.add_argument("--quiet", action="store_true", help="no progress lines")
    c.set_defaults(func=main)


__all__ = ["FABRIC", "MIN_REPEATS", "add_parser", "build_spec", "experiment", "job_sets", "main", "on_lab", "plan",
           "readback_problems", "slices", "validate", "write_log"]
