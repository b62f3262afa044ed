"""`testbed audit`: the seed article's scaling audit. One collective job at N, 2N and 4N ranks (``--scale``) on a
leaf-spine grown the way a cluster grows (more leaves of the same shape: hosts per leaf, spines and link rates
fixed, so the oversubscription stays the same), then one table and one HTML page:

* step time p50/p95/p99 and its CV, the collective's latency (CCT p50/p99), the fraction of time ranks waited on
  communication (``comm_wait_fraction``: the "GPU idle attributable to communication");
* scaling efficiency from N to each kN with a verdict against the 75-80% bar (analysis.metrics.scaling_efficiency:
  **weak** scaling keeps the work per rank, ``eff = T_N / T_kN``; **strong** keeps the total work, so each rank's
  compute shrinks by k, ``eff = T_N / (k T_kN)``), on the median step and on the p99 step;
* what grew with scale: switch drops, TCP retransmissions and timeouts, ECN marks, PFC pauses;
* for the largest point, the correlation's explanation of its slowest op (what the fabric did meanwhile).

With ``--repeat N`` every point is a repeat folder of N runs (analysis.repeats); the table holds medians and the
efficiency gets its confidence interval (:func:`efficiency_intervals`). Every point is a normal run directory
(``OUT/ranks=<n>/``), run through the sweep machinery: validated before the
first run, progress shown, a failed point recorded and the audit goes on (exit status 1), the whole audit in one
lab VM when this kernel lacks something. This module may import ``analysis``; the fabric never does."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from testbed.errors import UsageError, require_root
from testbed.params import parse_seed, resolve

# `testbed --help` imports this module: the sweep and the runner (Mininet, pyroute2), pandas through analysis, the
# lab VM and run directories are imported inside the functions that use them (testbed.cli).

#: the audit table's columns, when the points have them
COLUMNS = ("ranks", "leaves", "repeats_n", "step_ms_p50", "step_ms_p95", "step_ms_p99", "step_cv", "cct_ms_p50",
           "cct_ms_p99", "comm_wait_fraction", "busbw_gbps", "efficiency", "efficiency_low", "efficiency_high",
           "efficiency_p99", "verdict", "step_vs_base", "switch_drops", "tcp_retrans_segs", "tcp_timeouts", "ecn_marks",
           "pfc_pause_events", "fidelity_ok", "left_out")
GROWN = ("switch_drops", "tcp_retrans_segs", "tcp_timeouts", "ecn_marks", "pfc_pause_events")


def parse_scale(text: str) -> tuple[int, ...]:
    try:
        f = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--scale takes a comma list of whole factors, e.g. 1,2,4 (got {text!r})") from None
    if not f or f[0] != 1 or any(b <= a for a, b in zip(f, f[1:])):
        raise UsageError(f"--scale must start at 1 and grow, e.g. 1,2,4 (got {text!r})")
    return f


def plan(scenario: Any, sets: list[str], factors: tuple[int, ...], scaling: str):
    """The sweep plan: one point per factor k, with k x the ranks, the leaves to hold them, and (strong scaling)
    each rank's compute divided by k. UsageError (one line) on any problem, before anything runs."""
    from testbed.commands.sweep import Plan, Point

    if scenario.name != "collective":
        raise UsageError("testbed audit runs the collective scenario (its steps are what scale)")
    base = resolve(scenario.params, sets)
    if any(s.split("=", 1)[0].strip().replace("-", "_") == "leaves" for s in sets):
        raise UsageError("--set leaves: the audit grows the leaves itself (set hosts_per_leaf and spines)")
    if base.get("topology_file"):
        raise UsageError("--set topology_file: the audit grows a leaf-spine itself; give its shape with --set")
    n, hpl = int(base["ranks"]), int(base["hosts_per_leaf"])
    points = []
    for k in factors:
        p = dict(base, ranks=n * k, leaves=max(1, math.ceil(n * k / hpl)))
        if scaling == "strong":
            p["compute_ms"] = base["compute_ms"] / k
        try:
            scenario.validate(p)
        except UsageError as e:
            raise UsageError(f"{k}x ({n * k} ranks, {p['leaves']} leaves): {e}") from None
        points.append(Point(f"{n * k}", n * k, p, f"ranks={n * k}"))
    return Plan(scenario, "ranks", tuple(points), tuple(sets))


def audit_table(df: Any, factors: tuple[int, ...], scaling: str) -> Any:
    """The sweep's table with efficiency (median step, p99 step) and verdict against the first point."""
    from analysis.metrics import scaling_efficiency

    df = df.copy()
    base = df.iloc[0] if len(df) and bool(df.iloc[0].get("complete", True)) else None
    eff, eff99, verdict = [], [], []
    for (_, r), k in zip(df.iterrows(), factors):
        if base is None or not bool(r.get("complete", True)) or "step_ms_p50" not in df:
            eff.append(math.nan)
            eff99.append(math.nan)
            verdict.append("n/a")
            continue
        e = scaling_efficiency(float(base["step_ms_p50"]), float(r["step_ms_p50"]), k, scaling)
        e99 = scaling_efficiency(float(base["step_ms_p99"]), float(r["step_ms_p99"]), k, scaling)
        eff.append(e.efficiency)
        eff99.append(e99.efficiency)
        verdict.append(e.verdict)
    df["efficiency"], df["efficiency_p99"], df["verdict"] = eff, eff99, verdict
    return df


def efficiency_intervals(df: Any, out: Path, pl: Any, factors: tuple[int, ...], scaling: str) -> Any:
    """With repeats: each point's efficiency on the median step with its confidence interval,
    ``efficiency_low``/``efficiency_high``: the bootstrap interval of median T_N / median T_kN over the runs
    (analysis.stats.compare; strong scaling divides by k), and ``efficiency_verdict``: whether the point's median
    step differs from the base's at all (``A > B`` etc., A the base)."""
    from analysis import repeats, stats

    df = df.copy()
    base = repeats.values(out / pl.points[0].dirname, "step_ms_p50")
    low, high, told = [], [], []
    for pt, k in zip(pl.points[:len(df)], factors):
        d = stats.compare(base, repeats.values(out / pt.dirname, "step_ms_p50"))
        div = k if scaling == "strong" else 1
        low.append(d.ratio_low / div)
        high.append(d.ratio_high / div)
        told.append(d.verdict)
    df["efficiency_low"], df["efficiency_high"], df["step_vs_base"] = low, high, told
    return df


def write_outputs(df: Any, out: Path, scaling: str, suspect: str) -> list[Path]:
    """audit.csv, audit.md and audit.html."""
    from analysis.report import Block, md_table, render_html

    cols = [c for c in COLUMNS if c in df.columns]
    table = df[cols]
    paths = [out / "audit.csv", out / "audit.md", out / "audit.html"]
    df.to_csv(paths[0], index=False)
    last = df.iloc[-1]
    head = (f"{scaling} scaling from {int(df.iloc[0]['ranks'])} to {int(last['ranks'])} ranks: efficiency "
            f"{last['efficiency']:.2f} on the median step ({last['verdict']}), {last['efficiency_p99']:.2f} on the p99 "
            "step, against the seed article's 75-80% bar" if last.get("verdict", "n/a") != "n/a"
            else "the audit could not compute an efficiency (a point failed)")
    grown = []
    for g in GROWN:
        if g in df.columns and df[g].notna().any():
            vals = [int(v) for v in df[g].fillna(0)]
            if max(vals[1:], default=0) > vals[0]:
                grown.append(f"{g}: " + " -> ".join(map(str, vals)))
    unfaithful = [f"{int(r['ranks'])} ranks: {r.get('fidelity_reasons') or 'see its fidelity.csv'}"
                  for _, r in df.iterrows() if "fidelity_ok" in df.columns and r.get("fidelity_ok") in (0, False)]
    unfaithful += [f"{int(r['ranks'])} ranks, left out of the medians: {r['left_out']}" for _, r in df.iterrows()
                   if isinstance(r.get("left_out"), str) and r["left_out"]]
    blocks = [Block("h1", "Scaling audit"), Block("p", head + "."),
              Block("table", table, "one row per scale; efficiency against the first row (weak: T_N/T_kN, strong: "
                    "T_N/(k T_kN)); verdict: poor < 0.75 <= marginal <= 0.80 < good"),
              Block("h2", "What grew with scale"),
              Block("p", "; ".join(grown) if grown else "no drops, retransmissions, marks or pauses grew."),
              Block("h2", "The largest run's slowest op"), Block("p", suspect or "no ops recorded."),
              Block("h2", "Fidelity"),
              Block("p", "every point reports itself faithful." if not unfaithful else
                    "not faithful (their numbers say more about this machine than about the fabric): "
                    + "; ".join(unfaithful))]
    paths[1].write_text("\n\n".join(["# Scaling audit", head + ".", md_table(table),
                                     "## What grew with scale", blocks[4].content,
                                     "## The largest run's slowest op", blocks[6].content,
                                     "## Fidelity", blocks[8].content]) + "\n")
    paths[2].write_text(render_html(blocks, "scaling audit"))
    return paths


def print_audit(df: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from analysis.report import fmt

    cols = [c for c in ("ranks", "leaves", "repeats_n", "step_ms_p50", "step_ms_p99", "cct_ms_p99",
                        "comm_wait_fraction", "efficiency", "efficiency_low", "efficiency_high", "efficiency_p99",
                        "verdict", "step_vs_base", "switch_drops", "tcp_retrans_segs", "fidelity_ok", "left_out",
                        "error") if c in df.columns]
    t = Table(title="scaling audit")
    for c in cols:
        t.add_column(c, justify="left" if c in ("verdict", "error") else "right", overflow="fold")
    for _, r in df.iterrows():
        t.add_row(*[fmt(r.get(c)) for c in cols])
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def _reasons(run_dir: Path) -> str:
    import json

    try:
        r = json.loads((run_dir / "summary.json").read_text()).get("fidelity_reasons") or ""
    except (OSError, ValueError):
        return ""
    return "; ".join(r) if isinstance(r, list) else str(r)


def _suspect(run_dir: Path) -> str:
    from analysis.correlate import explain_slowest
    from analysis.repeats import is_repeat_folder, run_infos
    from analysis.summary import load_quietly

    if is_repeat_folder(run_dir):  # the first run that counts (complete and faithful) stands for the point
        counting = [i.path for i in run_infos(run_dir) if i.counts]
        if not counting:
            return "(no explanation: no run of the largest point counted)"
        run_dir = counting[0]
    try:
        return explain_slowest(load_quietly(run_dir))
    except Exception as e:  # noqa: BLE001 - the audit's table stands without it
        return f"(no explanation: {e})"


def main(args: argparse.Namespace) -> int:
    from testbed.vm import labvm
    from testbed.commands import runner
    from testbed import scenario as scenarios
    from testbed.rundir import check_out_dir
    from testbed.commands.sweep import run_sweep

    sc = scenarios.get("collective")
    factors = parse_scale(args.scale)
    pl = plan(sc, args.set or [], factors, args.scaling)
    if args.repeat is not None:
        from testbed.commands.repeat import check_repeat

        check_repeat(args.repeat, args.seed)
    require_root("testbed audit")
    out = check_out_dir(args.out) if args.out else check_out_dir(default_out(), "--out (default)")
    needs = sorted({x for pt in pl.points for x in sc.needs_of(pt.params)})
    if runner.use_vm(args.vm, needs, labvm.in_vm(), missing=runner.missing_capabilities):
        print("testbed audit: this kernel lacks what the audit needs; running it in one lab VM", file=sys.stderr)
        labvm.vm_kernel()
        return labvm.run([sys.executable, "-m", "testbed.cli", "audit", *sum((["--set", s] for s in args.set), []),
                          "--scale", args.scale, "--scaling", args.scaling, "--seed", str(args.seed),
                          "--out", str(out), "--vm", "never",
                          *(["--repeat", str(args.repeat)] if args.repeat is not None else [])])
    df = run_sweep(pl, out, seed=args.seed, quiet=True, repeat=args.repeat)
    df["leaves"] = [pt.params["leaves"] for pt in pl.points][:len(df)]
    df["fidelity_reasons"] = [_reasons(out / pt.dirname) for pt in pl.points][:len(df)]
    df = audit_table(df, factors, args.scaling)
    if args.repeat is not None:
        df = efficiency_intervals(df, out, pl, factors, args.scaling)
    largest = out / pl.points[len(df) - 1].dirname
    paths = write_outputs(df, out, args.scaling, _suspect(largest) if largest.exists() else "")
    print_audit(df)
    print(paths[1].read_text().split("\n\n")[1])
    print(paths[2])
    failed = int((~df["complete"].astype(bool)).sum()) if "complete" in df.columns else 0
    return 1 if failed else 0


def default_out() -> Path:
    from testbed import rundir

    return rundir.default_out("audit")


def add_parser(sub) -> None:
    p = sub.add_parser("audit", help="scaling audit: a collective job at N, 2N, 4N ranks, efficiency and verdict",
                       description="Run the collective job at N x each --scale factor ranks (N = --set ranks) on a "
                       "leaf-spine grown by leaves of the same shape, then write OUT/audit.csv, audit.md and "
                       "audit.html: step-time tails, collective latency, comm-wait fraction, scaling efficiency "
                       "with a verdict against 75-80%, what grew with scale, and the largest run's slowest op "
                       "explained. --set takes any collective parameter except leaves.")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a collective parameter")
    p.add_argument("--scale", default="1,2,4", help="rank multiples, starting at 1 (default 1,2,4)")
    p.add_argument("--scaling", default="weak", choices=["weak", "strong"],
                   help="weak: same work per rank; strong: same total work, each rank's compute_ms / k")
    p.add_argument("--seed", type=parse_seed, default=1, metavar="N", help="seed of every point (default 1)")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="N runs a scale (seeds --seed .. --seed+N-1): medians, and the efficiency with its 95%% CI")
    p.add_argument("--out", default=None, metavar="DIR", help="folder (default results/audit-TIME)")
    p.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                   help="run in the lab VM: auto (when this kernel lacks a capability), always, never")
    p.set_defaults(func=main)


__all__ = ["COLUMNS", "add_parser", "audit_table", "efficiency_intervals", "main", "parse_scale", "plan",
           "write_outputs"]
