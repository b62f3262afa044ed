"""Several jobs on one fabric, read back: each job's step and CCT samples from its own run directory, and with its
solo runs (the job alone on the same fabric, same hosts, same seed) its slowdown from its neighbours.

The slowdown of a percentile is together / solo, with its interval and verdict from :func:`analysis.stats.compare`.
The p50 ratio compares the per-run p50s when each side has at least 4 runs (``--repeats``; fewer cannot give a rank
test's verdict), else the job's per-iteration samples (every run's iterations pooled, both sides). Iterations of one
run are not independent samples of a job's behaviour (a slow phase of a neighbour, or of this machine, spans several
of them), so a pooled interval is narrower than the run-to-run spread: measured on 2 CPUs, two jobs on disjoint
leaves had per-run p50 ratios of 0.89-1.17 and three runs' pooled iterations gave "A < B" [0.89, 0.97] for one of
them. The verdict says what it rests on (iterations or runs). The p99 ratio compares the per-run p99s when each side
has at least 2 runs, else it is the two p99s' ratio with no interval.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import pandas as pd

from analysis import stats
from analysis.load import load_csv
from analysis.metrics import op_table, percentiles, step_times
from analysis.summary import headline_ops

METRICS = (("step", "step_ms"), ("cct", "cct_ms"))


def samples(job_dir: str | Path) -> dict[str, list[float]]:
    """A job's per-iteration step times and headline-op CCTs (ms) from its ops.csv."""
    ops = load_csv(Path(job_dir) / "ops.csv", "ops")
    if ops.empty:
        return {"step_ms": [], "cct_ms": []}
    return {"step_ms": [float(x) * 1e3 for x in step_times(ops)["step_s"]],
            "cct_ms": [float(x) * 1e3 for x in op_table(headline_ops(ops))["cct_s"]]}


def _window(job_dir: Path) -> tuple[float, float] | None:
    ops = load_csv(job_dir / "ops.csv", "ops")
    return None if ops.empty else (float(ops["start_s"].min()), float(ops["end_s"].max()))


def _union_within(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` inside [lo, hi]."""
    total, end = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def overlap(job_dir: str | Path) -> float:
    """The fraction of the job's measured window (its first op's start to its last op's end) during which a
    neighbour ran: another job of the same run between its first op and its last, a checkpoint write, a dataset
    flow (storage.csv). 1.0: beside its neighbours throughout; a job that outlasts them has its last iterations
    alone, and its slowdown is diluted by them."""
    job_dir = Path(job_dir)
    mine = _window(job_dir)
    if mine is None or mine[1] <= mine[0]:
        return math.nan
    run = job_dir.parent
    others = [w for d in run.iterdir() if d.is_dir() and d != job_dir and (d / "ops.csv").is_file()
              for w in [_window(d)] if w is not None]
    if (run / "storage.csv").is_file():
        st = pd.read_csv(run / "storage.csv")
        others += [(float(a), float(b)) for a, b in zip(st["start_s"], st["end_s"])]
    return _union_within(others, *mine) / (mine[1] - mine[0])


def summary(job_dir: str | Path) -> dict:
    p = Path(job_dir) / "summary.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def _p99(values: Sequence[float]) -> float:
    return percentiles(values).p99


def slowdown(together: Sequence[dict], solo: Sequence[dict], key: str) -> dict:
    """p50 and p99 ratios together / solo of ``key`` (step_ms or cct_ms) over the runs' samples (module docstring):
    {p50_ratio, p50_low, p50_high, p50_verdict, p50_n, p99_ratio, p99_low, p99_high, p99_verdict}."""
    if min(len(together), len(solo)) >= stats.MIN_RUNS_FOR_VERDICT:  # runs are independent, iterations are not
        d = stats.compare([percentiles(s[key]).p50 for s in together if s[key]],
                          [percentiles(s[key]).p50 for s in solo if s[key]])
        n = f"{len(together)} vs {len(solo)} runs"
    else:
        pooled_t = [v for s in together for v in s[key]]
        pooled_s = [v for s in solo for v in s[key]]
        d = stats.compare(pooled_t, pooled_s)
        n = f"{len(pooled_t)} vs {len(pooled_s)} iterations"
    out = {"p50_ratio": d.ratio, "p50_low": d.ratio_low, "p50_high": d.ratio_high, "p50_verdict": d.verdict,
           "p50_n": n}
    p99_t, p99_s = [_p99(s[key]) for s in together if s[key]], [_p99(s[key]) for s in solo if s[key]]
    if len(p99_t) >= 2 and len(p99_s) >= 2:
        d99 = stats.compare(p99_t, p99_s)
        out.update(p99_ratio=d99.ratio, p99_low=d99.ratio_low, p99_high=d99.ratio_high, p99_verdict=d99.verdict)
    else:
        t, s = stats.estimate(p99_t).median, stats.estimate(p99_s).median
        out.update(p99_ratio=t / s if s and s > 0 else math.nan, p99_low=math.nan, p99_high=math.nan,
                   p99_verdict="one run a side: no interval (use --repeats)")
    return out


def job_row(name: str, hosts: str, neighbours: str, together_dirs: Sequence[Path],
            solo_dirs: Sequence[Path]) -> dict:
    """One row of jobs.csv: the job's numbers together (median over runs of each run's summary numbers) and, with
    solo runs, alone and the slowdowns."""
    t_samples = [samples(d) for d in together_dirs]
    t_sum = [summary(d) for d in together_dirs]
    row: dict = {"job": name, "hosts": hosts, "beside": neighbours, "runs": len(together_dirs),
                 "overlap_min": min((overlap(d) for d in together_dirs), default=math.nan)}
    for _, key in METRICS:
        pooled = [v for s in t_samples for v in s[key]]
        row[f"{key}_p50"] = percentiles(pooled).p50
        row[f"{key}_p99"] = stats.estimate([_p99(s[key]) for s in t_samples if s[key]]).median
    row["bound_ms"] = stats.estimate([s.get("bound_ms") for s in t_sum]).median
    row["verified"] = all(bool(s.get("data_verified")) for s in t_sum) and bool(t_sum)
    row["switch_drops"] = sum(int(s.get("switch_drops") or 0) for s in t_sum)
    row["fidelity_ok"] = all(bool(s.get("fidelity_ok")) for s in t_sum) and bool(t_sum)
    if solo_dirs:
        s_samples = [samples(d) for d in solo_dirs]
        for short, key in METRICS:
            pooled = [v for s in s_samples for v in s[key]]
            row[f"{key}_p50_solo"] = percentiles(pooled).p50
            row[f"{key}_p99_solo"] = stats.estimate([_p99(s[key]) for s in s_samples if s[key]]).median
            for k, v in slowdown(t_samples, s_samples, key).items():
                row[f"{short}_{k}"] = v
        s_sum = [summary(d) for d in solo_dirs]
        row["verified"] = row["verified"] and all(bool(s.get("data_verified")) for s in s_sum)
        row["switch_drops_solo"] = sum(int(s.get("switch_drops") or 0) for s in s_sum)
    return row


def _interval(low: float, high: float) -> str:
    return "" if math.isnan(low) or math.isnan(high) else f" [{low:.2f}, {high:.2f}]"


def verdict_line(row: dict) -> str:
    """``train: 1.62x slower beside ckpt, moe [1.31, 1.90] (step p50, A > B, 20 vs 20 samples); p99 2.1x``."""
    if "step_p50_ratio" not in row:
        return (f"{row['job']}: step p50 {row['step_ms_p50']:.1f} ms, p99 {row['step_ms_p99']:.1f} ms beside "
                f"{row['beside'] or 'nothing'} (no solo runs: give --solo for its slowdown)")
    r, verdict = row["step_p50_ratio"], row["step_p50_verdict"]
    iv = _interval(row["step_p50_low"], row["step_p50_high"])
    if verdict == "A > B":
        head = f"{r:.2f}x slower beside {row['beside']}{iv}"
    elif verdict == "A < B":
        head = f"{r:.2f}x faster (!) beside {row['beside']}{iv}"
    else:
        head = f"no slowdown told beside {row['beside']}: {r:.2f}x{iv}, {verdict}"
    p99 = row["step_p99_ratio"]
    tail = (f"; step p99 {p99:.2f}x{_interval(row['step_p99_low'], row['step_p99_high'])}"
            if not math.isnan(p99) else "")
    ov = row.get("overlap_min", math.nan)
    alone = (f"; beside them {ov:.0%} of its run at least: its other iterations ran alone and dilute this"
             if ov == ov and ov < 0.95 else "")
    return f"{row['job']}: {head} (step p50, {row['step_p50_n']}){tail}{alone}"


def storage_lines(rows: Sequence[dict]) -> list[str]:
    """One line per storage or inference entry: checkpoint write times, dataset goodput, inference latency."""
    out = []
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name]
        if mine[0]["kind"] == "checkpoint":
            p = percentiles([float(r["seconds"]) * 1e3 for r in mine])
            out.append(f"{name} (checkpoint): {len(mine)} writes, write time p50 {p.p50:.0f} ms, max {p.max:.0f} ms")
        elif mine[0]["kind"] == "inference":
            p = percentiles([float(r["seconds"]) * 1e3 for r in mine])
            out.append(f"{name} (inference): {len(mine)} request/response pairs, latency p50 {p.p50:.0f} ms, "
                       f"p99 {p.p99:.0f} ms")
        else:
            g = [float(r["goodput_mbps"]) for r in mine]
            out.append(f"{name} (dataset): {len(mine)} flows, goodput {sum(g) / len(g):.2f} Mbit/s each (mean)")
    return out


def _fabric_leaf(node: str, port: str) -> str | None:
    """The leaf a leaf <-> spine port serves: a leaf's uplink (node leafN, port spineM) or a spine's downlink (node
    spineM, port leafN), named as topologies.leafspine names them; None for a host's or a leaf's host port."""
    if node.startswith("leaf") and port.startswith("spine"):
        return node
    if node.startswith("spine") and port.startswith("leaf"):
        return port
    return None


def spine_ports(ports: Sequence[dict], leaves_of: dict[str, Sequence[str]]) -> dict:
    """What the leaf <-> spine ports carried, from the kernel's counters (port_deltas.csv rows: node, port,
    sent_bytes, drops) and where each entry ran (``leaves_of``: a job's or a storage stream's name -> the leaves of
    its hosts). An entry crosses the spine at leaf L when it has hosts on L and on another leaf: its traffic may then
    use L's uplinks and the spines' downlinks to L (every spine's: ECMP picks one per flow). A port is *shared* when
    two or more entries cross at its leaf: there their packets meet in one queue. Returns spine_port_bytes (every
    leaf <-> spine port), shared_ports, shared_port_bytes, shared_port_drops and switch_drops (every leaf's and
    spine's port: the emulated switches' tail drops)."""
    crossing: dict[str, int] = {}
    for leaves in leaves_of.values():
        used = set(leaves)
        if len(used) > 1:
            for leaf in used:
                crossing[leaf] = crossing.get(leaf, 0) + 1
    out = {"spine_port_bytes": 0, "shared_ports": 0, "shared_port_bytes": 0, "shared_port_drops": 0,
           "switch_drops": 0}
    for r in ports:
        node, port = str(r["node"]), str(r["port"])
        if node.startswith(("leaf", "spine")):
            out["switch_drops"] += int(r.get("drops") or 0)
        leaf = _fabric_leaf(node, port)
        if leaf is None:
            continue
        out["spine_port_bytes"] += int(r.get("sent_bytes") or 0)
        if crossing.get(leaf, 0) >= 2:
            out["shared_ports"] += 1
            out["shared_port_bytes"] += int(r.get("sent_bytes") or 0)
            out["shared_port_drops"] += int(r.get("drops") or 0)
    return out


__all__ = ["METRICS", "job_row", "samples", "slowdown", "spine_ports", "storage_lines", "summary", "verdict_line"]
