"""Classroom labs: ``labs/NN-name/`` folders, each a handout (README.md), the runs it needs and the outcomes to
expect (lab.toml), and the `testbed lab list | show | run | check` command.

lab.toml::

    title = "Incast and RTOmin"
    goal = "why a retransmission timeout, not bandwidth, sets an incast's tail"
    minutes = 3                       # what its runs take once on a 2-CPU machine (the lab VM: about 10x)
    repeats = 5                       # runs of each [[run]] (seeds seed..seed+N-1); default 5

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
expectation names, the metric names against what summary.json can hold: analysis.metricnames): a broken lab fails
with one line naming its file. `lab run` makes each run a repeat folder (``OUT/<run>/seed-<seed>/`` and
``OUT/<run>/repeat.json``); grading (analysis/grading.py) judges each statement on the distribution: pass, FAIL or
not enough evidence. The handout (README.md) is the student's; labs/NN/INSTRUCTOR.md (answers, reference numbers,
rubric) is shown by `lab show N --instructor` only."""

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
#: runs of each lab run when lab.toml does not say: the fewest with which a one-sided 95% statement on a median can
#: pass (all 5 beyond the bound: 1 - 2^-5 = 96.9%) and a rank test of two runs reach p < 0.05 with room for one
#: overlap (5 vs 5: p = 0.016); lab.toml's ``repeats`` raises it where the measured spread needs more
DEFAULT_REPEATS = 5


@dataclass(frozen=True)
class LabRun:
    name: str
    scenario: str
    sets: tuple[str, ...]  # "name=value", as on the command line
    faults: tuple[str, ...] = ()
    seed: int = 1

    def command(self, repeats: int = 1) -> str:
        """The same run as one `testbed run` command (for the handout and the instructor)."""
        parts = ["sudo testbed run", self.scenario, *(f"--set {s}" for s in self.sets),
                 *(f'--fault "{f}"' for f in self.faults)]
        if self.seed != 1:
            parts.append(f"--seed {self.seed}")
        if repeats > 1:
            parts.append(f"--repeat {repeats}")
        return " ".join(parts)

    def seeds(self, repeats: int) -> list[int]:
        return list(range(self.seed, self.seed + repeats))


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
    repeats: int = DEFAULT_REPEATS

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
    from analysis.metricnames import known

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
        for m in (x.metric, x.per):
            if m is not None and not known(m):
                raise _fail(path, f"expect {i + 1}: no metric named {m!r} (summary.json's names: "
                            "analysis/metricnames.py)")
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
    repeats = doc.get("repeats", DEFAULT_REPEATS)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or not 1 <= repeats <= 50:
        raise _fail(path, f"repeats = {repeats!r}: a whole number of runs, 1 to 50")
    lab = ClassLab(int(m.group(1)), m.group(2), folder, str(doc.get("title", m.group(2))), str(doc.get("goal", "")),
                   float(doc.get("minutes", 0)), runs, _expects(path, doc, runs), repeats)
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


def run(lab: ClassLab, out: Path, quiet: bool = True, repeats: int | None = None) -> int:
    """Every run of the lab, ``repeats`` times (default: the lab's), into ``out/<run name>/seed-<seed>/`` in this
    kernel, each run's repeat.json, then its check. A failed run is recorded and the rest go on (exit status 1);
    nothing is run again. The runs go in rounds (each lab run's first seed, then each one's second, ...): a burst
    of load from elsewhere on the machine then makes one run of each unfaithful rather than several of one (lab
    04: 4 of its 6 ECMP runs in a row, CPUs 94-100% busy, its statements left without 5 faithful runs), and the
    runs compared see alike conditions."""
    from analysis.evidence import write_repeat_json
    from testbed.commands.runner import run_scenario

    n = repeats or lab.repeats
    todo = [(r, r.seeds(n)[i]) for i in range(n) for r in lab.runs]
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    failed = []
    for i, (r, seed) in enumerate(todo, 1):
        sc, params, faults = resolve_run(r)
        done = time.monotonic() - t_start
        eta = f", about {done / (i - 1) * (len(todo) - i + 1):.0f} s left" if i > 1 else ""
        _say(f"[{i}/{len(todo)}] {r.name} seed {seed}: {r.command()}{eta}")
        t0 = time.monotonic()
        try:
            run_scenario(sc, params, seed, out / r.name / f"seed-{seed}", quiet=quiet, faults=faults)
        except (KeyboardInterrupt, UsageError):
            raise
        except Exception as e:  # noqa: BLE001 - record it, go on with the other runs
            why = str(e) if isinstance(e, RunFailed) else f"{type(e).__name__}: {e}"
            failed.append(f"{r.name}/seed-{seed}")
            _say(f"[{i}/{len(todo)}] {r.name} seed {seed} failed: {' '.join(why.split())}")
        else:
            _say(f"[{i}/{len(todo)}] {r.name} seed {seed} done in {time.monotonic() - t0:.1f} s")
        if seed == r.seeds(n)[-1]:
            write_repeat_json(out / r.name, sc.name, r.seeds(n))
    _say(f"{len(todo) - len(failed)}/{len(todo)} runs in {time.monotonic() - t_start:.0f} s; "
         f"check them again with: testbed lab check {lab.number} {out}")
    status = check(lab, [out])
    return 1 if failed else status


def check(lab: ClassLab, dirs: list[Path]) -> int:
    """Grade run folders (run directories, repeat folders, or folders holding them) and print the verdicts."""
    from testbed.commands import labcheck

    return labcheck.check(lab, wanted(lab), dirs)


def _list() -> int:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="classroom labs (testbed lab show N)")
    for c in ("lab", "title", "runs", "repeats", "minutes", "needs"):
        t.add_column(c)
    for lab in catalogue():
        n = needs(lab)
        vm = [x for x in n if x not in ("qdisc:htb", "qdisc:bfifo", "qdisc:pfifo")]
        t.add_row(lab.ref, lab.title, str(len(lab.runs)), str(lab.repeats), f"{lab.minutes * lab.repeats:g}",
                  ", ".join(vm) or "HTB + bfifo")
    Console(width=None if sys.stdout.isatty() else 160).print(t)
    return 0


def show(lab: ClassLab, instructor: bool = False) -> int:
    """The handout (README.md) and the runs as commands; with ``instructor`` also INSTRUCTOR.md (answers,
    reference numbers, rubric), which a student's `lab show` never prints."""
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console(width=None if sys.stdout.isatty() else 120)
    console.print(Markdown((lab.path / "README.md").read_text()))
    console.print(f"\nThe runs, {lab.repeats} each (about {lab.minutes * lab.repeats:g} min on a 2-CPU machine), "
                  "as commands:")
    for r in lab.runs:
        console.print(f"    {r.command(lab.repeats)} --out DIR/{r.name}", markup=False, highlight=False,
                      soft_wrap=True)
    if instructor:
        notes = lab.path / "INSTRUCTOR.md"
        if not notes.is_file():
            raise UsageError(f"{notes}: no instructor notes for lab {lab.ref}")
        console.print("")
        console.print(Markdown(notes.read_text()))
    return 0


def main(args: argparse.Namespace) -> int:
    """`testbed lab ...` (parsed by testbed.cli)."""
    if args.action == "list":
        return _list()
    lab = find(args.lab)
    if args.action == "show":
        return show(lab, args.instructor)
    if args.action == "check":
        from testbed.commands import labcheck

        return labcheck.main(lab, wanted(lab), args)
    # run
    from testbed.vm import labvm
    from testbed.commands import runner
    from testbed.rundir import check_out_dir

    if args.repeat is not None and args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: at least 1 run")
    require_root(f"testbed lab run {lab.ref}")
    out = check_out_dir(args.out) if args.out else check_out_dir(default_out(lab), "--out (default)")
    repeats = args.repeat or lab.repeats
    if runner.use_vm(args.vm, needs(lab), labvm.in_vm(), missing=runner.missing_capabilities):
        _say(f"this kernel lacks what lab {lab.ref} needs; running all {len(lab.runs)} runs x {repeats} in one "
             "lab VM")
        labvm.vm_kernel()
        return labvm.run([sys.executable, "-m", "testbed.cli", "lab", "run", lab.ref, "--out", str(out),
                          "--vm", "never", "--repeat", str(repeats), *(["--live"] if args.live else [])])
    if args.live:
        from testbed.measure import liveview

        liveview.enable()
    return run(lab, out, quiet=not args.verbose, repeats=repeats)


def default_out(lab: ClassLab) -> Path:
    from testbed import rundir

    return rundir.default_out(f"lab-{lab.ref}")


def add_parser(sub) -> None:
    p = sub.add_parser("lab", help="classroom labs: list, show the handout, run, check a class's runs",
                       description="Classroom labs (labs/NN-name/): `list` them, `show N` prints the handout and "
                       "its runs (--instructor adds the answers and rubric), `run N` runs each of them the lab's "
                       "repeats times into one folder and checks the outcomes, `check N RUN_DIR...` grades run "
                       "folders against the lab's statements (exit 0: all pass, 1: one failed, 3: some could not "
                       "be graded: a run missing, made with other parameters, or not enough evidence); "
                       "`check N --class DIR --csv` grades every student's folder DIR/<student>/.")
    lsub = p.add_subparsers(dest="action", metavar="ACTION", required=True, parser_class=type(p))
    lsub.add_parser("list", help="the labs")
    s = lsub.add_parser("show", help="print a lab's handout and its runs")
    s.add_argument("lab", metavar="N", help="lab number or name")
    s.add_argument("--instructor", action="store_true",
                   help="also the instructor's notes (INSTRUCTOR.md: answers, reference numbers, rubric)")
    r = lsub.add_parser("run", help="run a lab's runs into one folder, then check them")
    r.add_argument("lab", metavar="N", help="lab number or name")
    r.add_argument("--out", default=None, metavar="DIR", help="folder (default results/lab-NN-name-TIME)")
    r.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="runs of each lab run, seeds seed..seed+N-1 (default: the lab's `repeats`)")
    r.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                   help="run in the lab VM: auto (when this kernel lacks a capability), always, never")
    r.add_argument("--verbose", action="store_true", help="each run's own progress lines")
    r.add_argument("--live", action="store_true", help="show the busiest ports and the collective's progress live")
    c = lsub.add_parser("check", help="grade run folders against the lab's expected outcomes")
    c.add_argument("lab", metavar="N", help="lab number or name")
    c.add_argument("run_dirs", nargs="*", metavar="RUN_DIR",
                   help="run directories or repeat folders, or folders holding them")
    c.add_argument("--class", dest="class_dir", default=None, metavar="DIR",
                   help="grade each student's folder DIR/<student>/ (one row per student and statement)")
    c.add_argument("--csv", action="store_true", help="print the verdicts as CSV")
    p.set_defaults(func=main)
