"""Classroom labs: ``labs/NN-name/`` folders, each a handout (README.md), the runs it needs and the outcomes to
expect (lab.toml), and the `testbed lab list | show | run | check` command.

lab.toml::

    title = "Incast and RTOmin"
    goal = "why a retransmission timeout, not bandwidth, sets an incast's tail"
    minutes = 3                       # what its runs take on a 2-CPU machine (the lab VM: about 10x)

    [[run]]
    name = "rto200"                   # the run's folder under the lab's output
    scenario = "incast"
    set = { senders = 8, rto_min_ms = 200 }
    fault = ["slow-port leaf1:spine1 at_s=0 fraction=0.25"]   # optional
    seed = 1                          # optional

    [[expect]]
    says = "the p99 round with RTOmin 200 ms is at least 3x the one with 5 ms"
    metric = "round_ms_p99"
    run = "rto200"
    over = "rto5"                     # optional: the ratio run / over
    per = "other_metric"              # optional: metric / per, of the same run
    min = 3.0                         # and/or max
    hint = "look at tcp_timeouts: ..."

Everything a lab says is checked when it is loaded (scenario, parameters, faults against the topology, the runs an
expectation names): a broken lab fails with one line naming its file. Grading is analysis/grading.py."""

from __future__ import annotations

import argparse
import re
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import RunFailed, UsageError, require_root
from testbed.params import resolve

# `testbed --help` imports this module: the lab's machinery (scenarios and Mininet, the runner, pyroute2, pandas
# through analysis, the lab VM, run directories) is imported inside the functions that use it (testbed.cli).

LABS_DIR = Path(__file__).resolve().parents[2] / "labs"
_DIR_RE = re.compile(r"^(\d\d)-([a-z0-9-]+)$")
_RUN_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class LabRun:
    name: str
    scenario: str
    sets: tuple[str, ...]  # "name=value", as on the command line
    faults: tuple[str, ...] = ()
    seed: int = 1

    def command(self) -> str:
        """The same run as one `testbed run` command (for the handout and the instructor)."""
        parts = ["sudo testbed run", self.scenario, *(f"--set {s}" for s in self.sets),
                 *(f'--fault "{f}"' for f in self.faults)]
        if self.seed != 1:
            parts.append(f"--seed {self.seed}")
        return " ".join(parts)


@dataclass(frozen=True)
class ClassLab:
    number: int
    slug: str
    path: Path
    title: str
    goal: str
    minutes: float
    runs: tuple[LabRun, ...]
    expects: tuple[Any, ...]  # analysis.grading.Expect

    @property
    def ref(self) -> str:
        return f"{self.number:02d}-{self.slug}"


def _fail(path: Path, msg: str) -> UsageError:
    return UsageError(f"{path}: {msg}")


def _runs(path: Path, doc: dict) -> tuple[LabRun, ...]:
    runs = []
    for i, r in enumerate(doc.get("run") or []):
        if not isinstance(r, dict) or not isinstance(r.get("name"), str) or not isinstance(r.get("scenario"), str):
            raise _fail(path, f"run {i + 1} needs a name and a scenario")
        if not _RUN_RE.match(r["name"]):
            raise _fail(path, f"run name {r['name']!r}: lower-case letters, digits, - and _ only")
        sets = r.get("set") or {}
        faults = r.get("fault") or []
        if not isinstance(sets, dict) or not isinstance(faults, list):
            raise _fail(path, f"run {r['name']}: set is a table, fault a list of strings")
        text = tuple(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sets.items())
        runs.append(LabRun(r["name"], r["scenario"], text, tuple(str(f) for f in faults), int(r.get("seed", 1))))
    if not runs:
        raise _fail(path, "a lab needs at least one [[run]]")
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise _fail(path, "two runs have the same name")
    return tuple(runs)


def _expects(path: Path, doc: dict, runs: tuple[LabRun, ...]) -> tuple[Any, ...]:
    from analysis.grading import Expect

    names = {r.name for r in runs}
    out = []
    for i, e in enumerate(doc.get("expect") or []):
        try:
            x = Expect(says=str(e["says"]), metric=str(e["metric"]), run=str(e["run"]),
                       over=str(e["over"]) if e.get("over") is not None else None,
                       per=str(e["per"]) if e.get("per") is not None else None,
                       min=float(e["min"]) if e.get("min") is not None else None,
                       max=float(e["max"]) if e.get("max") is not None else None, hint=str(e.get("hint", "")))
        except (KeyError, TypeError, ValueError) as err:
            raise _fail(path, f"expect {i + 1}: needs says, metric, run and min and/or max ({err})") from None
        if x.min is None and x.max is None:
            raise _fail(path, f"expect {i + 1}: needs min and/or max")
        for r in (x.run, x.over):
            if r is not None and r not in names:
                raise _fail(path, f"expect {i + 1}: no run named {r!r}")
        out.append(x)
    if not out:
        raise _fail(path, "a lab needs at least one [[expect]]")
    return tuple(out)


def load(folder: Path) -> ClassLab:
    """One lab, checked (UsageError naming the file)."""
    m = _DIR_RE.match(folder.name)
    path = folder / "lab.toml"
    if not m or not path.is_file():
        raise UsageError(f"{folder}: not a lab folder (NN-name/ with a lab.toml)")
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise _fail(path, f"unreadable: {e}") from None
    runs = _runs(path, doc)
    lab = ClassLab(int(m.group(1)), m.group(2), folder, str(doc.get("title", m.group(2))), str(doc.get("goal", "")),
                   float(doc.get("minutes", 0)), runs, _expects(path, doc, runs))
    for r in runs:
        try:
            resolve_run(r)
        except UsageError as e:
            raise _fail(path, f"run {r.name}: {e}") from None
    return lab


def resolve_run(r: LabRun) -> tuple[Any, dict, list]:
    """(scenario, parameters, faults) of a lab run, validated as `testbed run` validates them."""
    from testbed import scenario as scenarios
    from testbed.commands.runner import parse_faults

    sc = scenarios.get(r.scenario)
    params = resolve(sc.params, r.sets)
    sc.validate(params)
    return sc, params, parse_faults(sc, params, r.seed, list(r.faults), None)


def catalogue(root: Path = LABS_DIR) -> list[ClassLab]:
    if not root.is_dir():
        raise UsageError(f"no labs folder at {root}")
    return [load(d) for d in sorted(root.iterdir()) if d.is_dir() and _DIR_RE.match(d.name)]


def find(ref: str, root: Path = LABS_DIR) -> ClassLab:
    """A lab by number (``2``, ``02``), name (``incast-rtomin``) or folder (``02-incast-rtomin``)."""
    labs = catalogue(root)
    for lab in labs:
        if ref in (lab.ref, lab.slug) or (ref.isdigit() and int(ref) == lab.number):
            return lab
    raise UsageError(f"no lab {ref!r} (testbed lab list: {', '.join(l.ref for l in labs)})")


def wanted(lab: ClassLab) -> list:
    """What each run must be, for grading: the parameters the lab sets, resolved to their values."""
    from analysis.grading import WantedRun

    out = []
    for r in lab.runs:
        sc, params, faults = resolve_run(r)
        keys = [s.split("=", 1)[0].strip().replace("-", "_") for s in r.sets]
        out.append(WantedRun(r.name, sc.name, {k: params[k] for k in keys}, tuple(str(f) for f in faults)))
    return out


def needs(lab: ClassLab) -> list[str]:
    from testbed.faults import plan as faultplan

    out: list[str] = []
    for r in lab.runs:
        sc, params, faults = resolve_run(r)
        out += [*sc.needs_of(params), *faultplan.needs(faults)]
    return sorted(set(out))


# ---- the command --------------------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(f"testbed lab: {msg}", file=sys.stderr, flush=True)


def print_verdicts(lab: ClassLab, verdicts: list) -> None:
    """A table on a terminal; one line per statement otherwise (a grading script's log, grep-able)."""
    from rich.console import Console
    from rich.table import Table

    from analysis.report import fmt

    if not sys.stdout.isatty():
        print(f"lab {lab.ref}: {lab.title}")
        for v in verdicts:
            value = fmt(v.value) if v.value is not None else "-"
            print(f"{v.status:9} {v.expect.says} | measured {value} | {v.expect.band()}"
                  + (f" | {v.note}" if v.note else ""))
        return

    t = Table(title=f"lab {lab.ref}: {lab.title}")
    for c, j in (("", "left"), ("statement", "left"), ("measured", "right"), ("band", "left"), ("note", "left")):
        t.add_column(c, justify=j, overflow="fold")
    for v in verdicts:
        t.add_row(v.status, v.expect.says, fmt(v.value) if v.value is not None else "-", v.expect.band(), v.note)
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def check(lab: ClassLab, dirs: list[Path]) -> int:
    from analysis.grading import exit_status, grade, match_runs

    for d in dirs:
        if not d.exists():
            raise UsageError(f"no such run directory: {d}")
    verdicts = grade(list(lab.expects), match_runs(wanted(lab), dirs))
    print_verdicts(lab, verdicts)
    return exit_status(verdicts)


def run(lab: ClassLab, out: Path, quiet: bool = True) -> int:
    """Every run of the lab into ``out/<run name>/`` in this kernel, then its check. A failed run is recorded and
    the rest go on (exit status 1)."""
    from testbed.commands.runner import run_scenario

    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    failed = []
    for i, r in enumerate(lab.runs, 1):
        sc, params, faults = resolve_run(r)
        done = time.monotonic() - t_start
        eta = f", about {done / (i - 1) * (len(lab.runs) - i + 1):.0f} s left" if i > 1 else ""
        _say(f"[{i}/{len(lab.runs)}] {r.name}: {r.command()}{eta}")
        t0 = time.monotonic()
        try:
            run_scenario(sc, params, r.seed, out / r.name, quiet=quiet, faults=faults)
        except (KeyboardInterrupt, UsageError):
            raise
        except Exception as e:  # noqa: BLE001 - record it, go on with the other runs
            why = str(e) if isinstance(e, RunFailed) else f"{type(e).__name__}: {e}"
            failed.append(r.name)
            _say(f"[{i}/{len(lab.runs)}] {r.name} failed: {' '.join(why.split())}")
            continue
        _say(f"[{i}/{len(lab.runs)}] {r.name} done in {time.monotonic() - t0:.1f} s")
    _say(f"{len(lab.runs) - len(failed)}/{len(lab.runs)} runs in {time.monotonic() - t_start:.0f} s; "
         f"check them again with: testbed lab check {lab.number} {out}")
    status = check(lab, [out])
    return 1 if failed else status


def _list() -> int:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="classroom labs (testbed lab show N)")
    for c in ("lab", "title", "runs", "minutes", "needs"):
        t.add_column(c)
    for lab in catalogue():
        n = needs(lab)
        vm = [x for x in n if x not in ("qdisc:htb", "qdisc:bfifo", "qdisc:pfifo")]
        t.add_row(lab.ref, lab.title, str(len(lab.runs)), f"{lab.minutes:g}", ", ".join(vm) or "HTB + bfifo")
    Console(width=None if sys.stdout.isatty() else 160).print(t)
    return 0


def main(args: argparse.Namespace) -> int:
    """`testbed lab ...` (parsed by testbed.cli)."""
    if args.action == "list":
        return _list()
    lab = find(args.lab)
    if args.action == "show":
        from rich.console import Console
        from rich.markdown import Markdown

        console = Console(width=None if sys.stdout.isatty() else 120)
        console.print(Markdown((lab.path / "README.md").read_text()))
        console.print(f"\nThe runs ({lab.minutes:g} min on a 2-CPU machine), as commands:")
        for r in lab.runs:
            console.print(f"    {r.command()} --out DIR/{r.name}", markup=False, highlight=False, soft_wrap=True)
        return 0
    if args.action == "check":
        return check(lab, [Path(d) for d in args.run_dirs])
    # run
    from testbed.vm import labvm
    from testbed.commands import runner
    from testbed.rundir import check_out_dir

    require_root(f"testbed lab run {lab.ref}")
    out = check_out_dir(args.out) if args.out else check_out_dir(default_out(lab), "--out (default)")
    if runner.use_vm(args.vm, needs(lab), labvm.in_vm(), missing=runner.missing_capabilities):
        _say(f"this kernel lacks what lab {lab.ref} needs; running all {len(lab.runs)} runs in one lab VM")
        labvm.vm_kernel()
        return labvm.run([sys.executable, "-m", "testbed.cli", "lab", "run", lab.ref, "--out", str(out),
                          "--vm", "never", *(["--live"] if args.live else [])])
    if args.live:
        from testbed.measure import liveview

        liveview.enable()
    return run(lab, out, quiet=not args.verbose)


def default_out(lab: ClassLab) -> Path:
    from testbed import rundir

    return rundir.default_out(f"lab-{lab.ref}")


def add_parser(sub) -> None:
    p = sub.add_parser("lab", help="classroom labs: list, show the handout, run, check a class's runs",
                       description="Classroom labs (labs/NN-name/): `list` them, `show N` prints the handout and "
                       "its runs, `run N` runs them into one folder and checks the outcomes, `check N RUN_DIR...` "
                       "grades run directories against the lab's expected outcomes (exit 0: all pass, 1: one "
                       "failed, 3: some could not be graded: a run is missing or was made with other parameters).")
    lsub = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(p))
    lsub.add_parser("list", help="the labs")
    s = lsub.add_parser("show", help="print a lab's handout and its runs")
    s.add_argument("lab", metavar="N", help="lab number or name")
    r = lsub.add_parser("run", help="run a lab's runs into one folder, then check them")
    r.add_argument("lab", metavar="N", help="lab number or name")
    r.add_argument("--out", default=None, metavar="DIR", help="folder (default results/lab-NN-name-TIME)")
    r.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                   help="run in the lab VM: auto (when this kernel lacks a capability), always, never")
    r.add_argument("--verbose", action="store_true", help="each run's own progress lines")
    r.add_argument("--live", action="store_true", help="show the busiest ports and the collective's progress live")
    c = lsub.add_parser("check", help="grade run directories against the lab's expected outcomes")
    c.add_argument("lab", metavar="N", help="lab number or name")
    c.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, or folders holding them")
    p.set_defaults(func=main)


__all__ = ["ClassLab", "LABS_DIR", "LabRun", "add_parser", "catalogue", "check", "find", "load", "main", "needs",
           "resolve_run", "run", "wanted"]
