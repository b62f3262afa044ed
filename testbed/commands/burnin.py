"""`testbed burnin`: the operator's burn-in battery, run on a fabric before jobs may use it (issue 27, item 1).

    sudo testbed burnin                                        # 2 spines x 2 leaves x 2 hosts at 10 Mbit/s
    sudo testbed burnin --set leaves=3 --out results/bi        # any leaf-spine from parameters
    sudo testbed burnin --topo examples/topology-files/slow-spine-port.toml
    sudo testbed burnin --fault "slow-port spine1:leaf2 fraction=0.25"    # rehearse: is the fault found?

Every host's NIC rate to a peer, its retransmissions, latency, CPU speed and configuration; every fabric link by
pinned leaf -> spine -> leaf paths; a ring all-reduce per leaf and one across the fabric (the measurements:
testbed.commands.burnin_battery). Each point is judged against its peers with median and MAD, rates also against
the configured rate, settings against the majority (analysis.burnin). Written to the run folder: ``burnin.csv``
(one row per check), ``burnin.md`` (the verdict first) and ``health.json`` (per host and link, docs/operations.md),
beside the Lab's manifest and raw files. Exit status 0 healthy, 1 something flagged, 2 bad input (one line, before
anything is built). The fabric is torn down whatever happens (the Lab).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from testbed.errors import UsageError, require_root
from testbed.params import Param, parse_seed, resolve

# `testbed --help` imports this module: Mininet, pyroute2, the Lab and analysis are imported inside functions.

PARAMS = (
    Param("spines", int, 2, "", "spine switches", 1, 16),
    Param("leaves", int, 2, "", "leaf switches", 1, 32),
    Param("hosts_per_leaf", int, 2, "", "hosts under each leaf", 1, 32),
    Param("host_rate_mbps", float, 10.0, "Mbit/s", "host <-> leaf link rate", 0.5, 1000),
    Param("fabric_rate_mbps", float, 10.0, "Mbit/s", "leaf <-> spine link rate", 0.5, 1000),
    Param("buffer_bytes", int, 256000, "bytes", "drop-tail buffer of every switch port", 2000, 64 * 2**20),
    Param("duration_s", float, 1.5, "s", "how long each rate measurement runs (after a 0.4 s warm-up)", 0.5, 30),
    Param("size", str, "64K", "bytes", "per-rank message of the all-reduces (e.g. 64K, 256K)"),
    Param("iterations", int, 4, "", "measured all-reduces per job", 2, 100),
)
BATTERY_KEYS = ("duration_s", "size", "iterations")


def add_parser(sub) -> None:
    p = sub.add_parser("burnin", help="burn-in battery: every host, link and leaf checked, outliers named",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter: " + ", ".join(x.name for x in PARAMS))
    p.add_argument("--topo", metavar="FILE", help="a leaf-spine topology file (.toml/.yaml) instead of the fabric "
                   "--set parameters (the battery's own duration_s, size, iterations still apply)")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC",
                   help="a fault to rehearse (docs/faults.md), e.g. \"slow-host h2 at_s=0 cpu_fraction=0.2\"")
    p.add_argument("--faults", metavar="FILE", help="faults, one per line")
    p.add_argument("--out", default=None, metavar="DIR", help="run folder (default results/burnin-TIME)")
    p.add_argument("--seed", type=parse_seed, default=1, metavar="N", help="seed (ECMP hash, schedules)")
    p.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                   help="run in the lab VM: auto (when this kernel lacks what the faults need), always, never")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=main)


def fabric_spec(p: dict):
    """The uniform leaf-spine of the fabric parameters: every port drop-tail with ``buffer_bytes``."""
    from topologies import QueueSpec, uniform_leaf_spine

    q = QueueSpec(buffer_bytes=p["buffer_bytes"])
    return uniform_leaf_spine(p["spines"], p["leaves"], p["hosts_per_leaf"], p["host_rate_mbps"],
                              p["fabric_rate_mbps"], host_queue=q, switch_queue=q)


def check_battery(p: dict) -> None:
    """The battery's own settings (UsageError, one line)."""
    from testbed.params import parse_number

    try:
        parse_number(p["size"], True)
    except ValueError:
        raise UsageError(f"size: not a size in bytes ({p['size']!r}; e.g. 64K)") from None


def plan(args: argparse.Namespace):
    """(topology spec, battery settings, faults) from the arguments; UsageError (one line) on any problem."""
    from testbed.faults import plan as faultplan
    from topologies import LeafSpineSpec, SpecError, load_topology

    p = resolve(PARAMS, args.set)
    try:
        if args.topo:
            fabric_keys = [s.split("=", 1)[0].strip() for s in args.set if s.split("=", 1)[0].strip()
                           not in BATTERY_KEYS]
            if fabric_keys:
                raise UsageError(f"--topo and --set {fabric_keys[0]} exclude each other (put it in the file)")
            spec = load_topology(args.topo)
        else:
            spec = fabric_spec(p)
    except SpecError as e:
        raise UsageError(str(e)) from None
    if not isinstance(spec, LeafSpineSpec):
        raise UsageError(f"--topo: burn-in walks a leaf-spine fabric (kind \"leafspine\"), not a {spec.kind}")
    if len(spec.hosts) < 2:
        raise UsageError("burn-in needs at least 2 hosts (each host's rate is measured to a peer)")
    check_battery(p)
    faults = [faultplan.parse(t) for t in args.fault] + (faultplan.parse_file(args.faults) if args.faults else [])
    faultplan.check(faults, spec, iterations=0)  # targets exist; no at_iteration (the battery has no iterations)
    bad = [f for f in faults if f.kind == "pause-storm"]
    if bad:
        raise UsageError(f"fault {bad[0]}: burn-in runs no lossless class for a pause storm to hold")
    return spec, {k: p[k] for k in BATTERY_KEYS}, faults


def main(args: argparse.Namespace) -> int:
    from testbed.commands import runner
    from testbed.faults import plan as faultplan
    from testbed.rundir import check_out_dir, default_out
    from testbed.vm import labvm
    from testbed.vm.needs import fabric_needs

    spec, battery, faults = plan(args)
    out = check_out_dir(args.out) if args.out else default_out("burnin")
    require_root("testbed burnin")
    needs = list(dict.fromkeys([*fabric_needs(spec), *faultplan.needs(faults)]))
    if runner.use_vm(args.vm, needs, labvm.in_vm()):
        argv = ["burnin", *sum((["--set", s] for s in args.set), []), "--vm", "never", "--out", str(out),
                "--seed", str(args.seed), *sum((["--fault", f] for f in args.fault), []),
                *(["--topo", str(Path(args.topo).resolve())] if args.topo else []),
                *(["--faults", str(Path(args.faults).resolve())] if args.faults else []),
                *(["--quiet"] if args.quiet else [])]
        print("testbed burnin: this kernel lacks what the faults need; running it in the lab VM", file=sys.stderr)
        labvm.vm_kernel()
        return labvm.run([sys.executable, "-m", "testbed.cli", *argv])
    result = run(spec, battery, faults, out, args.seed, args.quiet)
    print(result["verdict"])
    print(out / "burnin.md")
    return 0 if result["healthy"] else 1


def run(spec, battery: dict, faults: list, out: Path, seed: int = 1, quiet: bool = False) -> dict:
    """Build the fabric, rehearse ``faults``, run the battery, judge it and write burnin.csv, burnin.md and
    health.json into ``out``. Returns {healthy, verdict, checks, health, wall_s}."""
    from testbed.lab import Lab
    from topologies.mininet_topo import SpecTopo

    t0 = time.monotonic()
    params = {"topology": spec.describe(), **battery, "faults": [str(f) for f in faults]}
    with Lab(SpecTopo(spec), out=out, seed=seed, name="burnin", params=params, quiet=quiet, agents=True) as lab:
        result = on_lab(lab, battery, faults, t0)
        lab.summary.update(result["summary"])
    write_outputs(out, result["checks"], result["health"], result["facts"])
    return result


def on_lab(lab, battery: dict, faults: list = (), t0: float | None = None) -> dict:
    """The battery on a live Lab (its fabric a leaf-spine): ``faults`` added to the Lab's timeline, every host,
    path and job measured and judged. Returns {healthy, verdict, checks, health, facts, summary, wall_s}: the
    summary's numbers are what a run directory's summary.json holds (the burn-in scenario's)."""
    from analysis import burnin as judge
    from testbed.commands.burnin_battery import shape_of

    t0 = time.monotonic() if t0 is None else t0
    shape = shape_of(lab.net.fabric.topology, {(p.node, p.ifname): p.rate_mbps for p in lab.net.fabric.port_plans})
    b = Battery(lab, shape, battery)
    b.start(faults)
    checks, paths, facts = b.judged(b.measure_all())
    doc = judge.health(checks, shape.hosts, shape.links, paths)
    doc["run"] = str(lab.rundir.path)
    wall_s = time.monotonic() - t0
    facts.append(f"battery wall time {wall_s:.0f} s (fabric build included)")
    named = judge.culprits(checks, doc)
    verdict = "burn-in: healthy" if not named else "burn-in: " + " | ".join(named)
    return {"healthy": doc["healthy"], "verdict": verdict, "checks": checks, "health": doc, "facts": facts,
            "wall_s": wall_s, "summary": judge.summary_numbers(checks, doc) | {"burnin_wall_s": round(wall_s, 1)}}


class Battery:
    """The battery on one live Lab: :meth:`start` (workers, then the fault timeline), :meth:`measure_all`, then
    :meth:`judged` (analysis.burnin's checks, the pinned paths' evidence, one line per fact measured)."""

    def __init__(self, lab, shape, settings: dict):
        self.lab, self.shape, self.s = lab, shape, settings
        self.topology = lab.net.fabric.topology

    def start(self, faults: list) -> None:
        from testbed.commands.burnin_battery import CpuWorkers

        for f in faults:
            self.lab.at(f.at_s, f)
        self.workers = CpuWorkers(self.lab, self.shape.hosts)  # before t = 0: a slow-host fault holds them
        self.lab.start_workload()
        time.sleep(0.3)  # the timeline's t = 0 steps (a throttle, an MTU) take effect

    def _nic_rate(self, host: str) -> float:
        return self.shape.rate[(host, self.topology.address_plan.attachments[host][1])]

    def _down_rate(self, host: str) -> float:
        router, _, port = self.topology.address_plan.attachments[host]
        return self.shape.rate[(router, port)]

    def measure_all(self) -> dict:
        from testbed.commands import burnin_battery as bb
        from testbed.commands.burnin_retry import repinged

        lab, shape, dur = self.lab, self.shape, float(self.s["duration_s"])
        m: dict = {}
        pairs = bb.host_pairs(shape)
        m["host_expected"] = {a: min(self._nic_rate(a), self._down_rate(b)) for a, b in pairs}
        lab.progress(f"burn-in: host NICs ({len(pairs)} flows, {dur:g} s a round)")
        pace = bb.PACE * min(m["host_expected"].values())
        m["hosts"] = [(rnd, bb.measure_flows(lab, rnd, pace, dur, [], read_cc=True)) for rnd in bb.host_rounds(pairs)]
        m["pairs"] = pairs
        lab.progress("burn-in: latency, CPU")
        m["rtt"], m["rtt_again"] = repinged(lambda ps: bb.ping_rtts(lab, ps), pairs)
        m["cpu"], m["cpu_retimed"] = self.workers.times_ms(shape.hosts)
        m["cpu_loops"] = self.workers.loops
        m["paths"] = []
        pins = bb.PinnedRoutes(lab)
        for rnd in bb.path_rounds(shape):
            lab.progress("burn-in: pinned paths " + ", ".join(p.name for p in rnd))
            for p in rnd:
                pins.pin_path(shape, p)
            rates = {p.name: bb.path_rate(shape, self.topology, p) for p in rnd}
            pace = bb.PACE * min(rates[p.name] / len(p.pairs) for p in rnd)
            ports = [pt for p in rnd for pt in bb.path_ports(shape, p)]
            res = bb.measure_flows(lab, [pr for p in rnd for pr in p.pairs], pace, dur, ports)
            pins.restore()
            m["paths"].append((rnd, rates, res))
        m["config"] = {h: bb.host_config(lab, h) for h in shape.hosts}
        m["jobs"] = self._jobs()
        return m

    def _jobs(self) -> dict:
        from testbed.commands.burnin_battery import allreduce

        out, size, iters = {}, str(self.s["size"]), int(self.s["iterations"])
        for lf in self.shape.leaves:
            hosts = self.shape.hosts_of[lf]
            if len(hosts) > 1:
                self.lab.progress(f"burn-in: ring all-reduce on {lf}")
                out[f"allreduce {lf}"] = allreduce(self.lab, hosts, [lf] * len(hosts), size, iters)
        if len(self.shape.leaves) > 1:
            self.lab.progress("burn-in: ring all-reduce across the fabric")
            hosts = self.shape.hosts
            leaf_of = {h: lf for lf in self.shape.leaves for h in self.shape.hosts_of[lf]}
            out["allreduce fabric"] = allreduce(self.lab, hosts, [leaf_of[h] for h in hosts], size, iters)
        return out

    def judged(self, m: dict) -> tuple[list, dict, list[str]]:
        from analysis import burnin as judge
        from testbed.commands import burnin_battery as bb

        sent, tcp, cc = {}, {}, {}
        for rnd, res in m["hosts"]:
            sent.update({a: g for (a, _), g in zip(rnd, res.goodput_mbps)})
            tcp.update(res.tcp)
            cc.update(res.cc)
        sent = {a: sent[a] for a, _ in m["pairs"]}
        checks = judge.judge("tx_mbps", sent, m["host_expected"])
        checks += judge.judge("retrans_pct", {h: bb.retrans_pct(d) for h, d in tcp.items()})
        checks += judge.judge("rtt_ms_p50", {h: bb.median_or_nan(v) for h, v in m["rtt"].items()})
        checks += judge.judge("rtt_ms_p99", {h: bb.p99_or_nan(v) for h, v in m["rtt"].items()})
        checks += judge.judge("cpu_task_ms", m["cpu"])
        for key in ("mtu_bytes", "tcp_ecn"):
            checks += judge.drift(key, {h: c[key] for h, c in m["config"].items()})
        checks += judge.drift("congestion_control", {h: cc.get(h) or m["config"][h]["default_cc"]
                                                     for h in self.shape.hosts})
        path_checks, paths = self._paths(m["paths"])
        checks += path_checks
        jobs = m["jobs"]
        checks += judge.judge("cct_vs_bound", {k: float(v["cct_vs_bound"] or float("nan")) for k, v in jobs.items()},
                              kind="job")
        for name, v in jobs.items():
            if not v["verified"]:
                checks.append(judge.Check(name, "data_verified", "false", verdict=judge.VERDICT_OUTLIER,
                                          reason="the all-reduce's result was wrong", kind="job"))
        facts = [f"{len(self.shape.hosts)} hosts, {len(paths)} pinned leaf>spine>leaf paths, {len(jobs)} ring "
                 f"all-reduce(s) of {self.s['size']}", "host flows: " + ", ".join(f"{a}>{b}" for a, b in m["pairs"]),
                 *[f"{k}: CCT p50 {v['cct_ms_p50']:.0f} ms, bound {v['bound_ms']:.0f} ms" for k, v in jobs.items()
                   if v.get("cct_ms_p50") is not None],
                 f"CPU task: {m['cpu_loops']} loops of a Python loop (sized to about {bb.CPU_TASK_MS:g} ms here, "
                 f"at most {bb.CPU_LOOP})",
                 *[f"{h}: CPU task timed {len(ts)} times ({', '.join(f'{t:.0f}' for t in ts)} ms; the lowest is judged)"
                   for h, ts in m.get("cpu_retimed", {}).items()],
                 *[f"{h}: echoes sent {len(rs)} times (p99 {', '.join(f'{bb.p99_or_nan(r):.2f}' for r in rs)} ms; the "
                   "lowest is judged)" for h, rs in m.get("rtt_again", {}).items()]]
        return checks, paths, facts

    def _paths(self, rounds: list) -> tuple[list, dict]:
        from analysis import burnin as judge
        from testbed.commands import burnin_battery as bb

        rate, expected, loss, paths = {}, {}, {}, {}
        for rnd, rates, res in rounds:
            flows = [pr for p in rnd for pr in p.pairs]
            good = dict(zip(range(len(flows)), res.goodput_mbps))
            i = 0
            for p in rnd:
                rate[p.name] = sum(good[i + j] for j in range(len(p.pairs)))
                i += len(p.pairs)
                expected[p.name] = rates[p.name]
                d = [res.tcp[a] for a, _ in p.pairs]
                loss[p.name] = bb.retrans_pct({k: sum(x.get(k, 0) for x in d) for k in ("TcpRetransSegs",
                                                                                         "TcpOutSegs")})
                ports = bb.path_ports(self.shape, p)
                paths[p.name] = judge.PathInfo(
                    tuple(self.shape.link[(a, b)] for a, b in ((p.src_leaf, p.spine), (p.spine, p.dst_leaf))),
                    {f"{n}:{pt}": res.port_deltas[(n, pt)]["drops"] for n, pt in ports},
                    {f"{n}:{pt}": self.shape.link[(n, peer)] for (n, pt), peer in zip(ports, (p.spine, p.dst_leaf))},
                    {f"{n}:{pt}": res.backlog_bytes.get((n, pt), 0.0) for n, pt in ports})
        checks = judge.judge("path_mbps", rate, expected, kind="path")
        checks += judge.judge("path_retrans_pct", loss, kind="path")
        return checks, paths


def write_outputs(out: Path, checks: list, doc: dict, facts: list[str]) -> None:
    from analysis import burnin as judge

    with open(out / "burnin.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(judge.COLUMNS))
        w.writeheader()
        for c in checks:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in c.row().items()})
    (out / "burnin.md").write_text(judge.verdict_md(checks, doc, facts))
    (out / "health.json").write_text(json.dumps(doc, indent=1) + "\n")


__all__ = ["PARAMS", "add_parser", "check_battery", "fabric_spec", "main", "on_lab", "plan", "run", "write_outputs"]
