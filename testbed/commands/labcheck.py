"""`testbed lab check`: grade run folders against a lab's statements (analysis.grading), for one hand-in or a whole
class (``--class DIR``: every ``DIR/<student>/`` folder, one row per student and statement, ``--csv`` for a
spreadsheet). Each lab run's evidence is listed with the verdicts: how many runs, how many complete and faithful;
an incomplete or unfaithful run is named there and left out of the grading."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from testbed.errors import UsageError

CSV_COLUMNS = ["student", "lab", "statement", "status", "value", "low", "high", "runs", "band", "note"]


def grade_folders(lab, wanted: list, dirs: list[Path]) -> tuple[list, list[str]]:
    """(verdicts, one line per lab run found: its runs, complete and fidelity_ok counts). ``wanted``: what each of
    the lab's runs must be (analysis.grading.WantedRun, testbed.commands.labs.wanted)."""
    from analysis.evidence import evidence_of
    from analysis.grading import grade, match_runs

    matched = match_runs(wanted, dirs)
    runs = [evidence_of(matched.dirs[r.name]).describe().replace(matched.dirs[r.name].name, r.name, 1)
            for r in lab.runs if r.name in matched.dirs]
    return grade(list(lab.expects), matched), runs


def _num(x: float | None) -> str:
    from analysis.report import fmt

    return fmt(x) if x is not None else "-"


def _measured(v) -> str:
    if v.value is None:
        return "-"
    bounds = f" [{_num(v.low)}, {_num(v.high)}]" if v.low is not None and v.high is not None else ""
    return f"{_num(v.value)}{bounds} ({v.runs})" if v.runs else _num(v.value)


def print_verdicts(lab, verdicts: list, runs: list[str]) -> None:
    """A table on a terminal; one line per statement otherwise (a grading script's log, grep-able); then each lab
    run's evidence."""
    if not sys.stdout.isatty():
        print(f"lab {lab.ref}: {lab.title}")
        for v in verdicts:
            print(f"{v.label:9} {v.expect.says} | measured {_measured(v)} | {v.expect.band()}"
                  + (f" | {v.note}" if v.note else ""))
        for line in runs:
            print(f"run       {line}")
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"lab {lab.ref}: {lab.title}")
    for c, j in (("", "left"), ("statement", "left"), ("measured: median [95% bounds] (runs)", "right"),
                 ("band", "left"), ("note", "left")):
        t.add_column(c, justify=j, overflow="fold")
    for v in verdicts:
        t.add_row(v.label, v.expect.says, _measured(v), v.expect.band(), v.note)
    console = Console()
    console.print(t)
    for line in runs:
        console.print(f"run {line}", markup=False, highlight=False)


def check(lab, wanted: list, dirs: list[Path]) -> int:
    from analysis.grading import exit_status

    for d in dirs:
        if not d.exists():
            raise UsageError(f"no such run directory: {d}")
    verdicts, runs = grade_folders(lab, wanted, dirs)
    print_verdicts(lab, verdicts, runs)
    return exit_status(verdicts)


def _row(student: str, lab, v) -> dict:
    return {"student": student, "lab": lab.ref, "statement": v.expect.says, "status": v.label,
            "value": "" if v.value is None else f"{v.value:.6g}", "low": "" if v.low is None else f"{v.low:.6g}",
            "high": "" if v.high is None else f"{v.high:.6g}", "runs": v.runs, "band": v.expect.band(),
            "note": v.note}


def students(class_dir: Path) -> list[Path]:
    if not class_dir.is_dir():
        raise UsageError(f"--class {class_dir}: not a folder")
    found = sorted(p for p in class_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise UsageError(f"--class {class_dir}: no student folders in it (DIR/<student>/...)")
    return found


def check_class(lab, wanted: list, class_dir: Path, as_csv: bool) -> int:
    """Grade each student's folder; one row per student and statement. Exit 0 once every folder was graded (the
    verdicts are the students', in the rows)."""
    folders = students(class_dir)
    rows = []
    for s in folders:
        verdicts, _ = grade_folders(lab, wanted, [s])
        rows += [_row(s.name, lab, v) for v in verdicts]
    if as_csv:
        w = csv.DictWriter(sys.stdout, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    else:
        for r in rows:
            print(f"{r['student']:16} {r['status']:9} {r['statement']} | {r['value'] or '-'} ({r['runs'] or '-'})"
                  + (f" | {r['note']}" if r["note"] else ""))
    return 0


def main(lab, wanted: list, args: argparse.Namespace) -> int:
    if args.class_dir and args.run_dirs:
        raise UsageError("lab check: either RUN_DIR... or --class DIR, not both")
    if args.class_dir:
        return check_class(lab, wanted, Path(args.class_dir), args.csv)
    if not args.run_dirs:
        raise UsageError("lab check: give RUN_DIR... (a hand-in) or --class DIR (every student's folder)")
    if args.csv:
        from analysis.grading import exit_status

        for d in args.run_dirs:
            if not Path(d).exists():
                raise UsageError(f"no such run directory: {d}")
        verdicts, _ = grade_folders(lab, wanted, [Path(d) for d in args.run_dirs])
        w = csv.DictWriter(sys.stdout, fieldnames=CSV_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(_row("", lab, v) for v in verdicts)
        return exit_status(verdicts)
    return check(lab, wanted, [Path(d) for d in args.run_dirs])
