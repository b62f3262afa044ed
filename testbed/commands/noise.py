"""`testbed doctor --noise`: this machine's noise floor. A short reference battery (a small incast and a small ring
all-reduce, the two shapes every lab and test is built from) run several times on one kernel, and the spread of its
key metrics recorded: the incast's round p99, round p50 against the ideal and bottleneck queue median, the
all-reduce's CCT p99 and its CCT against the alpha-beta bound. The same configuration run again differs only by
what the machine adds (scheduling, timer slack, the emulated VM's clock), so this spread is the smallest difference
a comparison of runs can ever tell.

Written to ``results/noise/<host|lab-vm>.json`` (or ``--out``): per metric the median with its distribution-free
95% interval, n and the coefficient of variation (analysis.stats.estimate), and how many runs per side
analysis.stats.compare needs to tell a difference of 1.2x, 1.5x or 2x at this spread (analysis.stats.runs_needed).
Tests and labs read it with :func:`load` and :func:`repeats_for`; docs/analysis.md says how to choose repeats.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from analysis import stats
from testbed.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
NOISE_DIR = ROOT / "results" / "noise"
EFFECTS = (1.2, 1.5, 2.0)
#: the reference battery: (name, scenario, parameters); small enough that 5 repeats of both take ~1 min on the
#: host. The incast overflows its buffer (8 x 32 kB into 32 kB, drop-tail), so some rounds wait for a retransmission
#: timeout: the noise that matters most to the tests lives in such tails, which a loss-free run never shows.
BATTERY = (
    ("incast", "incast", dict(topology="dumbbell", senders=8, block_bytes=32_000, rounds=20, host_rate_mbps=20.0,
                              fabric_rate_mbps=40.0, buffer_bytes=32_000, sample_interval_ms=2.0)),
    # no queue sampling in the all-reduce: the queue median comes from the incast's bottleneck. (Sampled collective
    # runs crashed pandas in the lab VM under QEMU's AVX2 emulation, 4 times in 6; with the guest's Nehalem CPU the
    # whole battery ran there, 5 of 5, on 2026-12-04.)
    ("allreduce", "collective", dict(collective="allreduce", size="256K", ranks=4, iterations=6, warmup=1,
                                     host_rate_mbps=20.0, fabric_rate_mbps=20.0, sample_interval_ms=0.0)),
)
#: metric -> (the battery run it comes from, unit)
METRICS = {
    "incast_round_ms_p99": ("incast", "ms"),
    "incast_round_p50_vs_ideal": ("incast", "x"),
    "incast_queue_median_bytes": ("incast", "bytes"),
    "allreduce_cct_ms_p99": ("allreduce", "ms"),
    "allreduce_cct_vs_bound": ("allreduce", "x"),
}


def where() -> str:
    """``lab-vm`` inside the lab VM, ``host`` on the host kernel: the two have different noise floors."""
    from testbed.vm.labvm import in_vm

    return "lab-vm" if in_vm() else "host"


def default_path(place: str | None = None) -> Path:
    return NOISE_DIR / f"{place or where()}.json"


def _busiest_queue_median(run_dir: Path, node_port: str | None) -> float:
    """The median backlog (bytes, over the run's samples) of ``node:port``, or with None of the port with the
    largest median: the queue a comparison of these runs would look at."""
    from analysis import summary as asum

    run = asum.load_quietly(run_dir)
    q = run.queues
    if q.empty:
        return float("nan")
    ports = [tuple(node_port.split(":", 1))] if node_port else sorted(set(zip(q["node"], q["port"])))
    return max(asum.port_backlog(q, n, p)["bytes_median"] for n, p in ports)


def _metrics(name: str, summary: dict, run_dir: Path) -> dict[str, float]:
    if name == "incast":
        ideal = summary.get("round_ms_ideal") or float("nan")
        return {"incast_round_ms_p99": summary.get("round_ms_p99"),
                "incast_round_p50_vs_ideal": (summary.get("round_ms_p50") or float("nan")) / ideal,
                "incast_queue_median_bytes": _busiest_queue_median(run_dir, summary.get("bottleneck"))}
    return {"allreduce_cct_ms_p99": summary.get("cct_ms_p99"),
            "allreduce_cct_vs_bound": summary.get("cct_vs_bound")}


def run_battery(repeats: int, out: Path, progress=print, after_seed=None) -> dict[str, list[float]]:
    """Each reference run ``repeats`` times (seeds 1..repeats), in this kernel; metric -> one value per run.
    ``after_seed(values)`` is called after each seed's runs (the record so far is kept if a later run dies)."""
    from testbed.commands.runner import run_scenario
    from testbed.scenario import get

    values: dict[str, list[float]] = {m: [] for m in METRICS}
    for seed in range(1, repeats + 1):
        for name, scen, overrides in BATTERY:
            sc = get(scen)
            p = {x.name: x.default for x in sc.params}
            p.update(overrides)
            sc.validate(p)
            t0 = time.monotonic()
            d = out / f"{name}-{seed}"
            s = run_scenario(sc, p, seed, d, quiet=True)
            got = _metrics(name, s, d)
            for k, v in got.items():
                values[k].append(float(v) if v is not None else float("nan"))
            progress(f"noise: {name} run {seed}/{repeats} ({time.monotonic() - t0:.0f} s): "
                     + ", ".join(f"{k} {v:.4g}" for k, v in got.items() if v is not None))
        if after_seed is not None:
            after_seed(values)
    return values


def floor(values: dict[str, list[float]]) -> dict:
    """Per metric: the estimate over the runs and the runs per side compare needs for each effect in EFFECTS."""
    out = {}
    for metric, vals in values.items():
        arr = np.asarray([v for v in vals if v == v], dtype=float)
        e = stats.estimate(arr)
        need = {}
        for effect in EFFECTS:  # the measured runs against themselves scaled: same spread, medians `effect` apart
            n = stats.runs_needed(arr * effect, arr) if arr.size >= 2 else None
            need[f"{effect:g}x"] = n
        out[metric] = {**e.as_dict(), "unit": METRICS[metric][1], "values": [round(v, 4) for v in vals],
                       "runs_needed": need}
    return out


def load(place: str | None = None, path: Path | None = None) -> dict | None:
    """The recorded noise floor of ``place`` (``host`` / ``lab-vm``; default: where this runs), or None."""
    p = path or default_path(place)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def repeats_for(metric: str, effect: float, place: str | None = None, default: int = 5) -> int:
    """Runs per side to tell ``effect`` (a ratio of medians, e.g. 1.5) in ``metric`` at this machine's recorded
    spread; ``default`` when no floor is recorded. Never below the fewest runs a verdict can have."""
    rec = load(place)
    if not rec or metric not in rec.get("metrics", {}):
        return default
    vals = np.asarray([v for v in rec["metrics"][metric]["values"] if v == v], dtype=float)
    n = stats.runs_needed(vals * effect, vals) if vals.size >= 2 else None
    return max(stats.MIN_RUNS_FOR_VERDICT, n or default)


def _print(rec: dict) -> None:
    print(f"noise floor: {rec['where']} (kernel {rec['kernel_release']}), {rec['repeats']} runs of each reference "
          f"run, {rec['wall_s']:.0f} s")
    print(f"{'metric':<30} {'median [95% CI]':<30} {'CV':>6}   runs per side to tell 1.2x / 1.5x / 2x")
    for m, r in rec["metrics"].items():
        ci = f"{r['median']:.4g} [{r['low']:.4g}, {r['high']:.4g}] {r['unit']}"
        cv = f"{r['cv']:.1%}" if r["cv"] is not None else "-"
        need = " / ".join(str(r["runs_needed"][f"{e:g}x"] or "-") for e in EFFECTS)
        print(f"{m:<30} {ci:<30} {cv:>6}   {need}")
    print(f"written to {rec['path']}")


def main(repeats: int = 5, out: str | None = None, as_json: bool = False) -> int:
    from testbed.errors import require_root
    from testbed.rundir import check_out_dir

    if not 2 <= repeats <= 50:
        raise UsageError(f"--repeat must be 2..50 for a spread (got {repeats})")
    path = Path(out) if out else default_path()
    check_out_dir(path.parent, "--out")
    require_root("testbed doctor --noise")
    runs_dir = path.parent / f"{path.stem}-runs"
    t0 = time.monotonic()

    def record(values: dict[str, list[float]]) -> dict:
        done = min(len(v) for v in values.values())
        rec = {"where": where(), "kernel_release": os.uname().release, "repeats": done, "repeats_asked": repeats,
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": time.monotonic() - t0,
               "battery": {name: {"scenario": scen, **p} for name, scen, p in BATTERY},
               "metrics": floor(values), "path": str(path)}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rec, indent=1) + "\n")
        return rec

    values = run_battery(repeats, runs_dir, progress=lambda msg: print(msg, file=sys.stderr, flush=True),
                         after_seed=lambda v: record(v) if min(len(x) for x in v.values()) >= 2 else None)
    rec = record(values)
    if as_json:
        json.dump(rec, sys.stdout, indent=1)
        print()
    else:
        _print(rec)
    return 0
