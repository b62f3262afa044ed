"""`testbed budget`: the failure budget for jitter (the seed article, section 04 part 1). One collective job run
without compute variance (the base), then with each ``--jitter`` value (each rank's compute uniform in
``[1-j, 1+j] x compute_ms``, drawn per iteration) and each ``--straggler-prob`` value (the ``stragglers`` ranks
slowed ``straggler_factor`` times in an iteration with that probability), each point repeated (``--repeat``, 3 by
default: a budget is a claim, and one run a side is a coin flip). Then OUT/budget.csv, budget.md and budget.png:
each point's efficiency (the base's mean step over the point's, with its 95% interval), what the model of a job
that waits for its slowest rank expects (analysis.budget), a verdict against ``--bar`` (0.75, the article's bar),
and the knee of each axis: how much variance the job absorbs before its throughput falls below the bar.

Every point is a repeat folder of normal run directories (``OUT/base/``, ``OUT/jitter=0.2/``, ...) run through the
sweep machinery: validated before the first run, progress shown, a failed point recorded (exit status 1)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from testbed.errors import UsageError, require_root
from testbed.params import parse_seed, resolve

# `testbed --help` imports this module: the sweep and the runner (Mininet, pyroute2), pandas and matplotlib through
# analysis, the lab VM and run directories are imported inside the functions that use them (as testbed.commands.audit).

DEFAULT_JITTER = "0.1,0.2,0.4,0.6"
MIN_REPEAT = 3


def parse_values(text: str, flag: str, high: float, high_ok: bool) -> tuple[float, ...]:
    """A comma list of increasing values in (0, high] (``high_ok``) or (0, high)."""
    if not text:
        return ()
    try:
        vals = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"{flag} takes a comma list of numbers, e.g. 0.1,0.2,0.4 (got {text!r})") from None
    if any(not (0 < v < high or (high_ok and v == high)) for v in vals):
        raise UsageError(f"{flag}: every value must be in (0, {high:g}{']' if high_ok else ')'} (got {text!r})")
    if any(b <= a for a, b in zip(vals, vals[1:])):
        raise UsageError(f"{flag}: values must increase (got {text!r})")
    return vals


def plan(scenario: Any, sets: list[str], jitters: tuple[float, ...], probs: tuple[float, ...]):
    """The sweep plan: the base (no jitter; stragglers that never straggle), then one point per jitter value and
    one per straggler probability, each varying that one thing. UsageError (one line) before anything runs."""
    from testbed.commands.sweep import Plan, Point

    if scenario.name != "collective":
        raise UsageError("testbed budget runs the collective scenario (its steps are what jitter stretches)")
    names = {s.split("=", 1)[0].strip().replace("-", "_") for s in sets}
    for own in ("jitter", "straggler_prob"):
        if own in names:
            raise UsageError(f"--set {own}: the budget sweeps it itself (--jitter, --straggler-prob)")
    base = resolve(scenario.params, sets)
    if float(base["compute_ms"]) <= 0:
        raise UsageError("testbed budget needs --set compute_ms=... > 0: jitter and stragglers stretch compute")
    if probs and (not str(base["stragglers"]).strip() or float(base["straggler_factor"]) <= 1):
        raise UsageError("--straggler-prob needs --set stragglers=RANKS and --set straggler_factor=F (> 1)")
    if not jitters and not probs:
        raise UsageError("give --jitter or --straggler-prob values to sweep")
    points = []
    for dirname, changes in [("base", {"jitter": 0.0, "straggler_prob": 0.0}),
                             *((f"jitter={j:g}", {"jitter": j, "straggler_prob": 0.0}) for j in jitters),
                             *((f"straggler_prob={p:g}", {"jitter": 0.0, "straggler_prob": p}) for p in probs)]:
        p = dict(base, **changes)
        try:
            scenario.validate(p)
        except UsageError as e:
            raise UsageError(f"{dirname}: {e}") from None
        points.append(Point(dirname, dirname, p, dirname))
    return Plan(scenario, "point", tuple(points), tuple(sets))


def points_of(out: Path, pl: Any, bar: float) -> list:
    """Each swept point measured against the base (analysis.budget.measure), with the model's expectation."""
    from analysis import budget, repeats, stats

    base_dir = out / pl.points[0].dirname
    base_steps = repeats.values(base_dir, "step_ms_mean")
    if not base_steps:
        return []
    base_ms = stats.estimate(base_steps).median
    p0 = pl.points[0].params
    stragglers = len([x for x in str(p0["stragglers"]).split(",") if x.strip()])
    result = []
    for pt in pl.points[1:]:
        steps = repeats.values(out / pt.dirname, "step_ms_mean")
        if not steps:
            continue
        q = pt.params
        if q["jitter"] > 0:
            axis, value = "jitter", q["jitter"]
            exp = budget.expected_step_jitter_ms(base_ms, q["compute_ms"], int(q["ranks"]), value)
        else:
            axis, value = "straggler_prob", q["straggler_prob"]
            exp = budget.expected_step_straggler_ms(base_ms, q["compute_ms"], value, q["straggler_factor"],
                                                    stragglers)
        result.append(budget.measure(axis, value, base_steps, steps, exp, bar))
    return result


def write_outputs(points: list, out: Path, bar: float, base_ms: float | None) -> list[Path]:
    """budget.csv, budget.md (the knees first) and budget.png."""
    import pandas as pd

    from analysis import budget
    from analysis.report import md_table

    paths = [out / "budget.csv", out / "budget.md", out / "budget.png"]
    df = pd.DataFrame([p.__dict__ for p in points])
    df.to_csv(paths[0], index=False)
    what = {"jitter": "compute jitter", "straggler_prob": "straggler probability"}
    knees = [budget.describe(budget.budget([p for p in points if p.axis == a]), points, bar, what[a])
             for a in ("jitter", "straggler_prob") if any(p.axis == a for p in points)]
    head = (f"Failure budget against an efficiency bar of {bar:.2f} (throughput against the same job without "
            f"compute variance" + (f", whose mean step took {base_ms:.1f} ms" if base_ms else "") + ").")
    budget.plot(points, bar, paths[2])
    paths[1].write_text("\n\n".join(["# Failure budget for jitter", head, *knees, md_table(df.round(3)),
                                     "![efficiency against variance](budget.png)"]) + "\n")
    return paths


def main(args: argparse.Namespace) -> int:
    from testbed import scenario as scenarios
    from testbed.commands import runner
    from testbed.commands.repeat import check_repeat
    from testbed.commands.sweep import run_sweep
    from testbed.rundir import check_out_dir, default_out
    from testbed.vm import labvm

    sc = scenarios.get("collective")
    if not 0 < args.bar < 1:
        raise UsageError(f"--bar must be in (0, 1) (got {args.bar:g})")
    if args.repeat < MIN_REPEAT:
        raise UsageError(f"--repeat must be at least {MIN_REPEAT}: a budget rests on repeated runs")
    pl = plan(sc, args.set or [], parse_values(args.jitter, "--jitter", 1.0, False),
              parse_values(args.straggler_prob or "", "--straggler-prob", 1.0, True))
    check_repeat(args.repeat, args.seed)
    require_root("testbed budget")
    out = check_out_dir(args.out) if args.out else check_out_dir(default_out("budget"), "--out (default)")
    needs = sorted({x for pt in pl.points for x in sc.needs_of(pt.params)})
    if runner.use_vm(args.vm, needs, labvm.in_vm(), missing=runner.missing_capabilities):
        print("testbed budget: this kernel lacks what the job needs; running it in one lab VM", file=sys.stderr)
        labvm.vm_kernel()
        return labvm.run([sys.executable, "-m", "testbed.cli", "budget", *sum((["--set", s] for s in args.set), []),
                          "--jitter", args.jitter, *(["--straggler-prob", args.straggler_prob]
                                                     if args.straggler_prob else []),
                          "--bar", str(args.bar), "--repeat", str(args.repeat), "--seed", str(args.seed),
                          "--out", str(out), "--vm", "never"])
    df = run_sweep(pl, out, seed=args.seed, quiet=True, repeat=args.repeat)
    points = points_of(out, pl, args.bar)
    base = df.iloc[0].get("step_ms_mean") if len(df) and "step_ms_mean" in df.columns else None
    paths = write_outputs(points, out, args.bar, float(base) if base is not None else None)
    print(paths[1].read_text().split("\n\n| ")[0])
    print(paths[1])
    failed = int((~df["complete"].astype(bool)).sum()) if "complete" in df.columns else 0
    return 1 if failed or not points else 0


def add_parser(sub) -> None:
    p = sub.add_parser("budget", help="failure budget: how much compute jitter and straggling a job absorbs",
                       description="Run the collective job without compute variance, then at each --jitter and "
                       "--straggler-prob value (--repeat runs each), and write OUT/budget.csv, budget.md and "
                       "budget.png: each point's efficiency (mean step without variance / with it) with its 95%% "
                       "interval, the model of a job that waits for its slowest rank, a verdict against --bar, and "
                       "how much variance the job absorbs before falling below it. --set takes any collective "
                       "parameter (compute_ms > 0; stragglers and straggler_factor for --straggler-prob).")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a collective parameter")
    p.add_argument("--jitter", default=DEFAULT_JITTER, metavar="J,...",
                   help=f"compute jitter values to sweep, in (0, 1) (default {DEFAULT_JITTER}; '' for none)")
    p.add_argument("--straggler-prob", default=None, metavar="P,...",
                   help="straggler probabilities to sweep, in (0, 1] (needs --set stragglers and straggler_factor)")
    p.add_argument("--bar", type=float, default=0.75, help="the efficiency bar (default 0.75, the seed article's)")
    p.add_argument("--repeat", type=int, default=MIN_REPEAT, metavar="N",
                   help=f"runs per point (seeds --seed .. --seed+N-1; default and least {MIN_REPEAT})")
    p.add_argument("--seed", type=parse_seed, default=1, metavar="N", help="seed of every point (default 1)")
    p.add_argument("--out", default=None, metavar="DIR", help="folder (default results/budget-TIME)")
    p.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                   help="run in the lab VM: auto (when this kernel lacks a capability), always, never")
    p.set_defaults(func=main)


__all__ = ["add_parser", "main", "parse_values", "plan", "points_of", "write_outputs"]
