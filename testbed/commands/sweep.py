"""`testbed sweep SCENARIO --set name=v1,v2,v3 [--set other=x]`: one run per value of one parameter.

Every point is a normal run directory, ``OUT/<name>=<value>/``; afterwards the sweep writes

* ``OUT/sweep.csv`` — one row per point: the swept value, ``run_dir``, ``complete``, ``error`` (empty, or why
  the point failed) and every numeric metric of the point's ``summary.json`` (bools as 0/1);
* ``OUT/sweep.md`` — the same as a Markdown table;
* ``OUT/sweep_<metric>.png`` — each key metric present (:data:`PLOT_METRICS`) against the parameter.

With ``--repeat N`` every point is a repeat folder (analysis.repeats: ``OUT/<name>=<value>/seed-<s>/`` and its
``repeat.json``); its row holds each metric's median over the complete, faithful runs, ``<metric>_low`` /
``<metric>_high`` (the median's 95% CI) for the plotted metrics, ``repeats_n`` and ``left_out``; the plots draw
the medians with their CI.

A comma that belongs to a value (e.g. the collective scenario's in-run size list) is written ``\\,``:
``--set ranks=2,4 --set 'size=1K\\,1M'`` sweeps ranks and passes size ``1K,1M`` to every point.

Every point's parameters are validated before the first run (one line, exit status 2). When this kernel
lacks what the scenario needs, the *whole* sweep re-executes inside one lab VM (`... --vm never`), not one VM
per point. A point that fails at run time is recorded (``complete`` false, why in ``error`` and in the log)
and the sweep goes on; the exit status is then 1. A scenario fails a run by raising (``testbed.errors.RunFailed``
for a run that started and failed), never by ``SystemExit``.

This module may import ``analysis``; the fabric never does.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from testbed import rundir
from testbed import scenario as scenarios
from testbed.commands import runner
from testbed.errors import RunFailed, UsageError, require_root
from testbed.params import resolve
from testbed.rundir import check_out_dir
from testbed.vm import labvm

#: metrics plotted against the swept parameter when the points have them
PLOT_METRICS = ("goodput_mbps", "round_ms_p99", "incast_loss_rate", "cct_ms_p99", "bottleneck_drops",
                "tcp_retrans_segs")
#: a p99 plot also draws the matching p50 when present
_COMPANIONS = {"round_ms_p99": "round_ms_p50", "cct_ms_p99": "cct_ms_p50"}


@dataclass(frozen=True)
class Point:
    text: str  # the value as given on the command line
    value: Any  # parsed
    params: dict
    dirname: str


@dataclass(frozen=True)
class Plan:
    scenario: Any  # testbed.commands.runner.Scenario
    name: str  # the swept parameter
    points: tuple[Point, ...]
    sets: tuple[str, ...]  # the fixed --set arguments (without the swept one)


def _safe_dirname(name: str, text: str) -> str:
    bad = set('/\\\0')
    t = "".join("_" if c in bad else c for c in text.strip())
    return f"{name}={t}"


def plan(scenario: Any, sets: Sequence[str]) -> Plan:
    """Split ``--set`` arguments into the swept parameter (exactly one with a comma list) and fixed ones,
    resolve and validate every point. UsageError (one line) on any problem, before anything runs."""
    swept: list[tuple[str, list[str]]] = []
    fixed: list[str] = []
    names: list[str] = []
    for s in sets:
        if "=" not in s:
            raise UsageError(f"--set takes name=value (got {s!r})")
        k, v = s.split("=", 1)
        k = k.strip().replace("-", "_")
        if k in names:
            raise UsageError(f"parameter {k!r} is set more than once")
        names.append(k)
        parts = [x.replace("\\,", ",") for x in re.split(r"(?<!\\),", v)]
        if len(parts) > 1:
            vals = [x.strip() for x in parts]
            if any(x == "" for x in vals):
                raise UsageError(f"{k}: empty value in the list {v!r}")
            swept.append((k, vals))
        else:
            fixed.append(f"{k}={parts[0]}")
    if len(swept) != 1:
        if not swept:
            raise UsageError("sweep needs one parameter with a comma list, e.g. --set senders=2,4,8")
        raise UsageError(f"only one parameter may have a comma list (got {', '.join(k for k, _ in swept)}); "
                         "write a comma that belongs to a value as \\,")
    name, texts = swept[0]
    if len(set(texts)) != len(texts):
        raise UsageError(f"{name}: repeated value in the list {','.join(texts)}")
    points = []
    dirs = set()
    for text in texts:
        params = resolve(scenario.params, [*fixed, f"{name}={text}"])
        try:
            scenario.validate(params)
        except UsageError as e:
            raise UsageError(f"{name}={text}: {e}") from None
        d = _safe_dirname(name, text)
        if d in dirs:
            raise UsageError(f"{name}: two values map to the same folder {d}")
        dirs.add(d)
        points.append(Point(text, params[name], params, d))
    values = [p.value for p in points]
    if len(set(map(repr, values))) != len(values):
        raise UsageError(f"{name}: two values in {','.join(texts)} are the same value")
    return Plan(scenario, name, tuple(points), tuple(fixed))


def _numeric(summary: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in summary.items():
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (int, float)):
            out[k] = v
    return out


def _say(msg: str) -> None:
    print(f"testbed sweep: {msg}", file=sys.stderr, flush=True)


def _fmt_eta(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def _one_run(pl: Plan, pt: Point, out: Path, seed: int, quiet: bool) -> tuple[dict, str]:
    """One point, one run: its summary's numeric values and the key metrics' line. Raises when the run failed."""
    from testbed.commands.runner import run_scenario

    summary = run_scenario(pl.scenario, pt.params, seed, out / pt.dirname, quiet=quiet)
    key = ", ".join(f"{k}={summary[k]:.4g}" for k in PLOT_METRICS
                    if isinstance(summary.get(k), (int, float)) and not isinstance(summary.get(k), bool))
    return _numeric(summary), key


def _repeated(pl: Plan, pt: Point, out: Path, seed: int, quiet: bool, repeat: int) -> tuple[dict, str]:
    """One point, ``repeat`` runs into a repeat folder: each metric's median over the complete, faithful runs,
    ``<metric>_low``/``_high`` (its confidence interval) for the plotted metrics, ``repeats_n`` (runs counted) and
    ``left_out`` (unfaithful or incomplete runs). Raises RunFailed when no run counted."""
    from testbed.commands.runner import run_repeats

    res = run_repeats(pl.scenario, pt.params, repeat, out / pt.dirname, seed, quiet=quiet, say=lambda _msg: None)
    metrics = res.summary["metrics"]
    left = res.summary["unfaithful"] + res.summary["incomplete"]
    counted = max((e["n"] for e in metrics.values()), default=0)
    if not counted:
        why = "; ".join(f"{n}: {w}" for n, w in res.failed) or "no run was complete and faithful"
        raise RunFailed(f"no run of {repeat} counted ({why})")
    row: dict[str, Any] = {k: e["median"] for k, e in metrics.items()}
    for k in PLOT_METRICS + tuple(_COMPANIONS.values()):
        if k in metrics:
            row[f"{k}_low"], row[f"{k}_high"] = metrics[k]["low"], metrics[k]["high"]
    row["repeats_n"], row["left_out"] = counted, ", ".join(left)
    key = ", ".join(f"{k}={metrics[k]['median']:.4g} [{metrics[k]['low']:.4g}, {metrics[k]['high']:.4g}]"
                    for k in PLOT_METRICS if k in metrics)
    return row, f"{counted}/{repeat} runs counted" + (f": {key}" if key else "")


def run_sweep(pl: Plan, out: Path, seed: int = 1, quiet: bool = False, repeat: int | None = None) -> "Any":
    """Run every point of ``pl`` in this kernel into ``out/<name>=<value>/`` and write the combined outputs.
    ``repeat``: each point is a repeat folder of that many runs (seeds seed .. seed+repeat-1) and its row holds
    the medians (:func:`_repeated`). Returns the sweep table (a pandas DataFrame). Progress goes to stderr."""
    import pandas as pd

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    n = len(pl.points)
    t_start = time.monotonic()
    failed: list[str] = []
    try:
        for i, pt in enumerate(pl.points, 1):
            done = time.monotonic() - t_start
            eta = f", about {_fmt_eta(done / (i - 1) * (n - i + 1))} left" if i > 1 else ""
            _say(f"[{i}/{n}] {pl.name}={pt.text} -> {out / pt.dirname}{eta}")
            row: dict[str, Any] = {pl.name: pt.value, "run_dir": pt.dirname}
            t0 = time.monotonic()
            try:
                values, key = (_one_run(pl, pt, out, seed, quiet) if repeat is None
                               else _repeated(pl, pt, out, seed, quiet, repeat))
            except (KeyboardInterrupt, UsageError):
                raise
            except Exception as e:  # noqa: BLE001 - record the point, go on with the rest
                failed.append(f"{pl.name}={pt.text}")
                why = str(e) if isinstance(e, RunFailed) else f"{type(e).__name__}: {e}"
                why = " ".join(why.split()) or type(e).__name__  # one line in the log, the csv and the table
                _say(f"[{i}/{n}] {pl.name}={pt.text} failed after {time.monotonic() - t0:.1f} s: {why}")
                row["complete"] = False
                row["error"] = why
                rows.append(row)
                continue
            row["complete"] = True
            row["error"] = ""
            row.update({k: v for k, v in values.items() if k not in row})
            rows.append(row)
            _say(f"[{i}/{n}] {pl.name}={pt.text} done in {time.monotonic() - t0:.1f} s" + (f": {key}" if key else ""))
    finally:
        if rows:
            df = pd.DataFrame(rows)
            write_outputs(df, pl.name, out, pl.scenario.name)
    bad = f"; FAILED: {', '.join(failed)}" if failed else ""
    _say(f"{n - len(failed)}/{n} points in {time.monotonic() - t_start:.1f} s{bad}; table {out / 'sweep.csv'}")
    return df


def write_outputs(df: "Any", name: str, out: Path, scenario: str = "") -> list[Path]:
    """sweep.csv, sweep.md and sweep_<metric>.png (metrics of :data:`PLOT_METRICS` present) in ``out``."""
    from analysis import plots
    from analysis.report import md_table

    out = Path(out)
    paths = [out / "sweep.csv", out / "sweep.md"]
    df.to_csv(paths[0], index=False)
    lines = [f"# Sweep of {scenario or 'a scenario'} over {name}", "",
             f"One row per point; each point's run directory is `{out}/<run_dir>`."
             + (" Each point is a repeat folder: a row holds each metric's median over its complete, faithful runs "
                "(`repeats_n`), `<metric>_low`/`_high` the 95% CI of that median (analysis.stats), `left_out` the "
                "runs not counted." if "repeats_n" in df.columns else ""), "", md_table(df), ""]
    x = list(df[name])
    numeric_x = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)
    if not numeric_x:
        x = [str(v) for v in x]
    for metric in PLOT_METRICS:
        if metric not in df.columns or df[metric].isna().all():
            continue
        series = {metric: list(df[metric])}
        comp = _COMPANIONS.get(metric)
        if comp in df.columns and not df[comp].isna().all():
            series = {comp: list(df[comp]), metric: list(df[metric])}
        if f"{metric}_low" in df.columns:  # repeats: the medians, and the CI of the metric's median as two lines
            series = {f"{k} (median)": v for k, v in series.items()}
            series.update({f"{metric} CI low": list(df[f"{metric}_low"]),
                           f"{metric} CI high": list(df[f"{metric}_high"])})
        logx = numeric_x and min(x) > 0 and max(x) / min(x) >= 16
        p = plots.plot_metric_vs_param(x, series, out / f"sweep_{metric}.png", xlabel=name, ylabel=metric,
                                       title=f"{scenario}: {metric} vs {name}".strip(": "), logx=logx)
        paths.append(p)
        lines += [f"![{metric} vs {name}]({p.name})", ""]
    paths[1].write_text("\n".join(lines), encoding="utf-8")
    return paths


def default_out(scenario: str) -> Path:
    return rundir.default_out(f"sweep-{scenario}")


def print_table(df: "Any", name: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from analysis.report import fmt

    cols = [name, *[c for c in PLOT_METRICS if c in df.columns]]
    if "complete" in df.columns:
        cols.append("complete")
    if "error" in df.columns and df["error"].fillna("").astype(str).str.len().any():
        cols.append("error")  # only when a point failed: why
    t = Table(title=f"sweep over {name}")
    for c in cols:
        t.add_column(c, justify="left" if c == "error" else "right", overflow="fold")
    for _, r in df.iterrows():
        t.add_row(*[fmt(r.get(c)) for c in cols])
    Console(width=None if sys.stdout.isatty() else 200).print(t)  # a pipe or log file: do not cut numbers


def main(args: argparse.Namespace) -> int:
    """The `testbed sweep` command (parsed by testbed.cli)."""
    scenario = scenarios.get(args.scenario)
    pl = plan(scenario, args.set or [])
    if args.repeat is not None:
        from testbed.commands.repeat import check_repeat

        check_repeat(args.repeat, args.seed)
    require_root(f"testbed sweep {scenario.name}")

    # an output folder that cannot be written is refused here: before doctor probes, a VM boot or a fabric
    out = check_out_dir(args.out) if args.out else check_out_dir(default_out(scenario.name), "--out (default)")

    # every point's own needs (a sweep over transport=tcp,rdma needs rxe for one of its points)
    needs = sorted({n for pt in pl.points for n in scenario.needs_of(pt.params)})
    go_vm = runner.use_vm(args.vm, needs, labvm.in_vm(), missing=runner.missing_capabilities)
    if not labvm.in_vm():
        if go_vm:
            argv = ["sweep", scenario.name, *sum((["--set", s] for s in args.set), []), "--seed", str(args.seed),
                    "--out", str(out), "--vm", "never"]
            if args.repeat is not None:
                argv += ["--repeat", str(args.repeat)]
            if args.quiet:
                argv.append("--quiet")
            why = "--vm always" if args.vm == "always" else f"this kernel lacks what {scenario.name} needs"
            _say(f"{why}; running all {len(pl.points)} points in one lab VM")
            labvm.vm_kernel()  # fail early with the install hint
            return labvm.run([sys.executable, "-m", "testbed.cli", *argv])

    df = run_sweep(pl, out, seed=args.seed, quiet=args.quiet, repeat=args.repeat)
    print_table(df, pl.name)
    print(out / "sweep.csv")
    failed = int((~df["complete"].astype(bool)).sum()) if "complete" in df.columns else 0
    return 1 if failed else 0

