#!/usr/bin/env python3
"""What does the emulated fabric cost a real program? (a benchmark, not a test; needs root, builds fabrics)

    sudo .venv/bin/python benchmarks/ddp_fabric_overhead.py [--rate-mbps 20] [--steps 15] [--repeats 12] [--json]
        [--results FILE]
    .venv/bin/python benchmarks/ddp_fabric_overhead.py --pool results/A.json results/B.json   # batches together

The same DDP job (examples/programs/ddp_train.py: 4 ranks over gloo, one per host, started as ``lab.launch`` and
``testbed run program`` start it: torchrun's environment, the project's interpreter) runs on two networks built in
this process and torn down after each run:

* fabric: a 2x2 leaf-spine (topologies.uniform_leaf_spine, 2 hosts per leaf, h1..h4), every link shaped by HTB to
  --rate-mbps (host links and leaf-spine links alike: 1:1, no oversubscription), ECMP over the two spines;
* bare:   the same 4 hosts on ONE router (a star: h1..h4 -- leaf1), every host link shaped to --rate-mbps.

Both have the same queues as `testbed run program`'s defaults (each host NIC: HTB + a 1.5 MB drop-tail bfifo, a
Linux interface's 1000 packets; each switch port: HTB + a 256 KB drop-tail bfifo), the same addresses scheme, hosts,
ranks, rank placement and program. "Bare" is the simplest network that still gives every host its own shaped link
at the same rate R: a star is what the ranks would see on one top-of-rack switch. Each host's link at R is the
bottleneck on both (the fabric's leaf-spine links also run at R, two uplinks for a leaf's two hosts: 1:1), so an
emulation that cost nothing would give the same step on both; what the fabric adds is the spine tier: two more
routing hops and two more shaped egress ports on every cross-leaf path, three more namespaces (leaf2, two spines)
and their veths for the machine to run, and ECMP hashing (two hosts' cross-leaf traffic may meet on one uplink).
The fabric/bare ratio of step times is that cost as a real program sees it.

Runs alternate between the sides (fabric first in even repeats, bare first in odd ones: the machine may be shared,
and drift then hits both sides alike); repeat i uses ECMP seed i+1 on the fabric. Each run reports its step-time p50
and p99 over its measured steps (ops.csv, the first step left out as the program scenario does), its p99 without
the last step too (the last step overlaps the program's closing broadcast and exit: ranks leave the loop at
different times, and one still in its last all-reduce shares the CPUs and links with the others' broadcast), and its
fidelity verdict (analysis.fidelity via the lab's judge, and the program scenario's CPU check). Over the repeats:
per side the median of the runs' p50s and of their p99s (both kinds) with 95% intervals (analysis.stats.estimate;
below 6 runs the interval is the range, with its real coverage), and fabric/bare as the ratio of medians with its
bootstrap interval, a rank test and the verdict (analysis.stats.compare). The step-time spread is reported twice:
within a run (each run's fastest and slowest measured step and the CV of its steps; per side the median of the runs'
CVs, and fabric/bare of them: does the fabric make steps less even?) and across runs (the CV and range of the runs'
p50s, which sets how many repeats a difference needs). Everything, every run's step times included, with the date,
the command and the machine (CPUs, kernel, load average before and after), goes to a JSON results file (--results;
default results/ddp_fabric_overhead-<UTC time>.json); --pool summarizes several such files' runs together (two
batches run at different times, say) without building anything. Measured numbers are in docs/programs.md ("The fabric's
overhead on a real program"). Exit status 1 when a run failed (the others are still reported), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mininet.topo import Topo  # noqa: E402

from analysis import fidelity  # noqa: E402
from analysis.metrics import cv, step_times  # noqa: E402
from analysis.stats import compare, estimate  # noqa: E402
from analysis.summary import collective_metrics, load_quietly, tcp_metrics  # noqa: E402
from testbed.errors import RunFailed, UsageError, require_root  # noqa: E402
from testbed.lab import Lab  # noqa: E402
from testbed.rundir import check_out_dir  # noqa: E402
from topologies import QueueSpec, uniform_leaf_spine  # noqa: E402
from topologies.mininet_topo import SpecTopo  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ("h1", "h2", "h3", "h4")
SIDES = ("fabric", "bare")
#: `testbed run program`'s defaults (scenarios/program.py): a host NIC keeps Linux's 1000 packets, a switch port 256 KB
NIC_QUEUE = QueueSpec("droptail", buffer_bytes=1_500_000)
SWITCH_QUEUE = QueueSpec("droptail", buffer_bytes=256 * 1024)
WARMUP_STEPS = 1  # the program scenario's default: connection set-up and DDP's first bucket build left out
SAMPLE_EVERY_MS = 10.0  # the program scenario's queue sampling interval
#: per run: step p50 and p99 over the measured steps (as `testbed run program` reports them), and p99 without the
#: last step, which overlaps the program's closing broadcast and exit
KEYS = ("step_ms_p50", "step_ms_p99", "steady_step_ms_p99")
#: per run: how uneven its steps were (sample std / mean of its measured steps), compared fabric/bare like KEYS
SPREAD_KEY = "step_cv"


class OneSwitch(Topo):
    """The bare side: hosts h1..h4 on one router (``leaf1``), each host link shaped to ``rate_mbps`` with the
    fabric's host NIC queue on the host's end and its switch port queue on the router's end."""

    def build(self, rate_mbps: float = 20.0):  # type: ignore[override]
        sw = self.addSwitch("leaf1")
        for h in HOSTS:
            self.addLink(self.addHost(h), sw, intfName1="eth0", intfName2=h, rate_mbps=rate_mbps,
                         queue1=NIC_QUEUE, queue2=SWITCH_QUEUE)


def topology(side: str, rate_mbps: float, seed: int) -> Topo:
    """The Mininet Topo of one side (see the module docstring)."""
    if side == "bare":
        return OneSwitch(rate_mbps=rate_mbps)
    return SpecTopo(uniform_leaf_spine(2, 2, 2, rate_mbps, rate_mbps, host_queue=NIC_QUEUE,
                                       switch_queue=SWITCH_QUEUE, seed=seed % 256))


def one_run(side: str, rate_mbps: float, steps: int, seed: int, out: Path, timeout_s: float) -> dict:
    """One launch of the DDP job on one side: its step p50/p99 (ms) over the measured steps, TCP retransmissions,
    switch drops and the fidelity verdict. RunFailed (one line, the rank named) when the program fails."""
    cmd = f"python3 {ROOT}/examples/programs/ddp_train.py --steps {steps}"
    params = {"side": side, "rate_mbps": rate_mbps, "steps": steps, "cmd": cmd}
    t0 = time.monotonic()
    with Lab(topology(side, rate_mbps, seed), out=out, seed=seed, name=f"ddp-{side}", params=params,
             quiet=True) as lab:
        sampler = lab.sample_queues(every_ms=SAMPLE_EVERY_MS)
        lab.tcp_counters()
        ports = lab.port_deltas()
        prog = lab.launch(cmd, hosts=list(HOSTS), ranks_per_host=1, timeout_s=timeout_s,
                          warmup_steps=WARMUP_STEPS, cwd=str(ROOT))
        res = prog.wait()
        delta = ports.stop()
        sampler.stop(lab.rundir)
        busy = sampler.stats().get("cpu_busy_fraction")
        # the program scenario's own check, before the lab's judge adds the port-rate and timer checks at teardown
        cpu = fidelity.reasons(fidelity.cpu_busy(busy))
        lab.summary.update(fidelity_ok=not cpu, fidelity_reasons="; ".join(cpu), cpu_busy_fraction=busy)
    run = load_quietly(out)
    m = collective_metrics(run.ops)
    # the last step overlaps the program's closing broadcast and exit (ranks leave the loop at different times)
    steady = collective_metrics(run.ops[run.ops["iteration"] < run.ops["iteration"].max()])
    hosts = set(HOSTS)
    drops = sum(v["drops"] for (n, _), v in delta.items() if n not in hosts)
    steps_ms = [float(x) * 1e3 for x in step_times(run.ops)["step_s"]]
    return {"side": side, "seed": seed, "step_ms_p50": m.get("step_ms_p50"), "step_ms_p99": m.get("step_ms_p99"),
            "steady_step_ms_p99": steady.get("step_ms_p99"), **within_run_spread(steps_ms),
            "steps_measured": m.get("step_n", 0), "program_s": round(res.wall_s, 3),
            "run_s": round(time.monotonic() - t0, 1), "switch_drops": int(drops),
            "tcp_retrans_segs": int(tcp_metrics(run.tcp).get("tcp_retrans_segs") or 0),
            "cpu_busy_fraction": busy, "fidelity_ok": bool(lab.summary.get("fidelity_ok")),
            "fidelity_reasons": lab.summary.get("fidelity_reasons", ""), "step_ms": [round(x, 1) for x in steps_ms]}


def within_run_spread(steps_ms: list[float]) -> dict:
    """One run's step-time spread: its fastest and slowest measured step (ms) and the CV of its steps (sample std /
    mean; None below 2 steps)."""
    c = cv(steps_ms) if steps_ms else math.nan
    return {"step_ms_min": min(steps_ms) if steps_ms else None, "step_ms_max": max(steps_ms) if steps_ms else None,
            SPREAD_KEY: None if math.isnan(c) else c}


def across_runs_text(values: list[float]) -> str:
    """The spread of one value over runs, e.g. the runs' step p50s: 'CV 2.1%, 566.0-602.0 (n 12)'."""
    x = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not x:
        return "no runs"
    c = cv(x)
    return (f"CV {'n/a' if math.isnan(c) else f'{100 * c:.1f}%'}, {min(x):.1f}-{max(x):.1f} (n {len(x)})")


def side_summary(rows: list[dict]) -> dict:
    """One side's runs: the median of their step p50s and p99s with intervals, and how many runs were faithful."""
    est = {k: estimate(r[k] for r in rows) for k in KEYS}
    spread = estimate(r[SPREAD_KEY] for r in rows)
    return {"runs": len(rows), **{k: est[k].as_dict() for k in KEYS},
            **{f"{k}_text": est[k].text("{:.1f}") for k in KEYS},
            SPREAD_KEY: spread.as_dict(), f"{SPREAD_KEY}_text": spread.text("{:.3f}"),
            "step_ms_p50_across_runs_text": across_runs_text([r["step_ms_p50"] for r in rows]),
            "step_ms_range": [min((r["step_ms_min"] for r in rows), default=None),
                              max((r["step_ms_max"] for r in rows), default=None)],
            "fidelity_ok_runs": sum(r["fidelity_ok"] for r in rows),
            "fidelity_reasons": sorted({r["fidelity_reasons"] for r in rows if r["fidelity_reasons"]}),
            "tcp_retrans_segs": [r["tcp_retrans_segs"] for r in rows],
            "switch_drops": [r["switch_drops"] for r in rows]}


def ratio_text(d) -> str:
    more = f"; about {d.runs_needed} runs a side would tell a difference this size" if d.runs_needed else ""
    verdict = d.verdict.replace("A ", "fabric ").replace(" B", " bare")
    if math.isnan(d.ratio_low):  # one run on a side: no interval, no test
        return f"{d.ratio:.3f} (no interval below 2 runs a side): {verdict}"
    return (f"{d.ratio:.3f} [{d.ratio_low:.3f}, {d.ratio_high:.3f}] (bootstrap 95%), Mann-Whitney p {d.p_value:.2g}: "
            f"{verdict}{more}")


def summarize(rows: list[dict], a: argparse.Namespace) -> dict:
    """Per side and fabric/bare (step p50, p99, p99 without the last step, and the runs' step CV), over the runs
    that did not fail; every run is kept in ``runs``."""
    ok = {s: [r for r in rows if r["side"] == s and "error" not in r] for s in SIDES}
    out = {"rate_mbps": a.rate_mbps, "steps": a.steps, "steps_measured_per_run": a.steps - WARMUP_STEPS,
           "repeats": a.repeats, "runs": rows, "sides": {s: side_summary(ok[s]) for s in SIDES}}
    for key in (*KEYS, SPREAD_KEY):
        d = compare([r[key] for r in ok["fabric"]], [r[key] for r in ok["bare"]])
        out[f"fabric_over_bare_{key}"] = {**d.as_dict(), "text": ratio_text(d)}
    return out


def _ms(v) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.1f}"


def run_line(r: dict) -> str:
    """One run as a line of the per-run table: its step p50 and p99, fastest and slowest step, CV of its steps."""
    if "error" in r:
        return f"  {r['side']:6s} seed {r['seed']:2d}  failed (left out): {r['error']}"
    c, busy = r[SPREAD_KEY], r["cpu_busy_fraction"]
    return (f"  {r['side']:6s} seed {r['seed']:2d}  p50 {_ms(r['step_ms_p50'])}  p99 {_ms(r['step_ms_p99'])}  "
            f"steps {_ms(r['step_ms_min'])}-{_ms(r['step_ms_max'])} ms, CV {'n/a' if c is None else f'{100 * c:.1f}%'}"
            f"  retrans {r['tcp_retrans_segs']}, drops {r['switch_drops']}, "
            f"CPU {'n/a' if busy is None else f'{100 * busy:.0f}%'}")


def print_report(out: dict) -> None:
    """The summary as text: every run, then per side and fabric/bare."""
    print(f"DDP job, 4 ranks (gloo), {out['steps']} steps ({out['steps_measured_per_run']} measured a run), every "
          f"host link {out['rate_mbps']:g} Mbit/s: 2x2 leaf-spine (fabric) vs the same hosts on one router (bare)")
    print("every run (its measured steps: p50, p99, fastest-slowest, CV):")
    for r in out["runs"]:
        print(run_line(r))
    print("median over runs [95% interval]:")
    for s in SIDES:
        x = out["sides"][s]
        why = ": " + " | ".join(x["fidelity_reasons"]) if x["fidelity_reasons"] else ""
        print(f"  {s:6s}  step p50 (ms) {x['step_ms_p50_text']};  step p99 (ms) {x['step_ms_p99_text']};  "
              f"without the last step {x['steady_step_ms_p99_text']};  "
              f"fidelity ok in {x['fidelity_ok_runs']} of {x['runs']} runs{why}")
        print(f"          spread within a run: step CV {x[f'{SPREAD_KEY}_text']}, steps "
              f"{_ms(x['step_ms_range'][0])}-{_ms(x['step_ms_range'][1])} ms over all runs; across runs: "
              f"step p50 {x['step_ms_p50_across_runs_text']}")
        print(f"          TCP retransmitted segments per run {x['tcp_retrans_segs']}, switch drops {x['switch_drops']}")
    for key, what in (("step_ms_p50", "step p50"), ("step_ms_p99", "step p99"),
                      ("steady_step_ms_p99", "step p99 without the last step"), (SPREAD_KEY, "step CV in a run")):
        print(f"  fabric/bare {what}: {out[f'fabric_over_bare_{key}']['text']}")


def machine() -> dict:
    """What the numbers were measured on (the machine may be shared: the load average says how busy it was)."""
    return {"cpus": os.cpu_count(), "kernel": platform.release(), "loadavg": list(os.getloadavg())}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate-mbps", type=float, default=20.0, help="every host link's rate R (and the fabric's "
                    "leaf-spine links'), Mbit/s (default 20: `testbed run program`'s)")
    ap.add_argument("--steps", type=int, default=15, help="training steps a run (the first is left out)")
    ap.add_argument("--repeats", type=int, default=12, help="runs a side, alternating (default 12: the runs' step "
                    "p50 varied by a CV of 1.4-2.5%% at 20 Mbit/s, which 12 a side bound to about +-3%%; a 4%% "
                    "difference took 12 a side to tell; 6 is the fewest whose median interval reaches 95%%)")
    ap.add_argument("--timeout-s", type=float, default=300.0, help="a run's program must end within this")
    ap.add_argument("--out", default=None, help="keep the run directories here (default: a temporary directory, "
                    "removed)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (every run, both sides, the ratios)")
    ap.add_argument("--pool", nargs="+", metavar="RESULTS", default=None, help="run nothing: summarize the runs of "
                    "these earlier results files together (same rate and steps), e.g. two batches; no root needed")
    ap.add_argument("--results", default=None, help="write that JSON object, with the date, command and machine, "
                    "here (default results/ddp_fabric_overhead-<UTC time>.json)")
    a = ap.parse_args(argv)
    if not 0.1 <= a.rate_mbps <= 10_000:
        ap.error(f"--rate-mbps must be in [0.1, 10000] (got {a.rate_mbps:g})")
    if a.steps < WARMUP_STEPS + 2:
        ap.error(f"--steps must be >= {WARMUP_STEPS + 2} (the first is left out; a p99 needs steps) (got {a.steps})")
    if a.repeats < 1:
        ap.error(f"--repeats must be >= 1 (got {a.repeats})")
    if a.timeout_s <= 0:
        ap.error(f"--timeout-s must be > 0 (got {a.timeout_s:g})")
    return a


def run_all(a: argparse.Namespace, base: Path) -> list[dict]:
    """Every run, alternating sides; a failed run is recorded with its line and the next one goes on."""
    rows = []
    for i in range(a.repeats):
        for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
            try:
                row = one_run(side, a.rate_mbps, a.steps, i + 1, base / f"{side}-{i:02d}", a.timeout_s)
            except RunFailed as e:
                row = {"side": side, "seed": i + 1, "error": str(e)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def results_path(given: str | None, now: float) -> Path:
    """Where the results file goes: ``given``, or results/ddp_fabric_overhead-<UTC time>.json under the checkout.
    UsageError when it cannot be written (a folder there, a kernel filesystem, a read-only place)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    p = Path(given).expanduser() if given else ROOT / "results" / f"ddp_fabric_overhead-{stamp}.json"
    if p.is_dir():
        raise UsageError(f"--results {given}: is a folder; name a file")
    check_out_dir(p.parent, "--results")
    return p


def load_pool(paths: list[str]) -> tuple[list[dict], argparse.Namespace]:
    """Every run of earlier results files, and their common rate and steps (``repeats``: the runs a side). UsageError
    (one line) when a file cannot be read or is not this benchmark's, or when the files differ in rate or steps."""
    rows, seen, batches = [], set(), {}
    for f in paths:
        try:
            d = json.loads(Path(f).read_text())
            if not isinstance(d["runs"], list):
                raise TypeError
            batch = d.get("date_utc") or str(Path(f).resolve())
            if batch in batches:  # the same batch twice would count its runs twice and narrow every interval
                raise UsageError(f"--pool: {f} holds the same batch as {batches[batch]} ({batch})")
            batches[batch] = f
            rows += d["runs"]
            seen.add((d["rate_mbps"], d["steps"]))
        except (OSError, ValueError) as e:
            raise UsageError(f"--pool {f}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
        except (KeyError, TypeError):
            raise UsageError(f"--pool {f}: not a results file of this benchmark (no runs, rate_mbps, steps)") from None
    if len(seen) > 1:
        raise UsageError(f"--pool: the files differ in (rate_mbps, steps): {sorted(seen)}; pool like with like")
    (rate, steps), = seen
    repeats = sum(r.get("side") == SIDES[0] for r in rows)
    return rows, argparse.Namespace(rate_mbps=rate, steps=steps, repeats=repeats)


def pool_main(a: argparse.Namespace) -> int:
    """--pool: the summary over earlier batches' runs, printed (or as JSON); nothing is built or written."""
    try:
        rows, params = load_pool(a.pool)
    except UsageError as e:
        print(f"ddp_fabric_overhead: {e}", file=sys.stderr)
        return 2
    summary = summarize(rows, params)
    if a.json:
        print(json.dumps({"pooled": a.pool, **summary}, indent=1))
    else:
        print(f"pooled: {', '.join(a.pool)}")
        print_report(summary)
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.pool:
        return pool_main(a)
    started = time.time()
    try:
        out = check_out_dir(a.out) if a.out else None
        results = results_path(a.results, started)
        require_root("benchmarks/ddp_fabric_overhead.py (it builds fabrics)")
    except UsageError as e:
        print(f"ddp_fabric_overhead: {e}", file=sys.stderr)
        return 2

    def on_sigterm(signum, frame):  # between runs too: unwind, so the temporary directory goes
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    before = machine()
    try:
        with tempfile.TemporaryDirectory(prefix="ddp-overhead-") as tmp:
            rows = run_all(a, out or Path(tmp))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the lab in progress has torn itself down
        print("ddp_fabric_overhead: interrupted; the fabric in use was torn down", file=sys.stderr)
        return 130
    summary = summarize(rows, a)
    record = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
              "command": " ".join(["benchmarks/ddp_fabric_overhead.py", *(sys.argv[1:] if argv is None else argv)]),
              "duration_s": round(time.time() - started, 1), "machine_before": before, "machine_after": machine(),
              **summary}
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(record, indent=1) + "\n")
    if a.json:
        print(json.dumps(record, indent=1))
    else:
        print_report(summary)
        print(f"results: {results}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
