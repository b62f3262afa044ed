"""Grade a classroom lab from a host test, as `testbed lab run N` / `lab check N` grade it (analysis.grading).

tests/host/test_labs_host.py grades the host labs; a lab whose runs are the very configuration another host test
makes anyway is graded there instead, on that test's runs (one set of runs serves both: CI's host layer is over its
time budget). Both use these checks, so a lab graded elsewhere is held to the same assertions:

* :func:`assert_passes_on_its_repeats` — a hand-in made at the lab's repeats: every statement passes (exit 0) and
  every lab run's evidence lists all its runs complete;
* :func:`run_once` — the lab driver (`lab run N --repeat 1`), then :func:`assert_complete_once`: each run completed
  and every statement got its metric (none missing, made differently or without a value). A one-run grade is not
  asserted (one run a side is a coin flip; test_labs_host.py's docstring).
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.grading import DIFFERENT, MISSING, NO_VALUE, PASS
from testbed.commands import labcheck
from testbed.commands import labs as classlabs
from testbed.kernel import doctor


def host_lab(ref: str):
    """Lab ``ref``, after checking that this kernel has everything its runs need."""
    lab = classlabs.find(ref)
    missing = doctor.missing(classlabs.needs(lab))
    assert not missing, f"lab {lab.ref} should run on the host kernel; it lacks {', '.join(missing)}"
    return lab


def runs_once(ref: str, out: Path) -> tuple[object, dict[str, tuple[dict, Path]]]:
    """Lab ``ref`` run once by the lab driver (`lab run N --repeat 1`) into ``out/<run>/seed-1/``, after checking
    that this kernel has everything its runs need: the lab and, by run name, each run's summary (None when it has
    none) and folder, for a test that grades the lab (:func:`assert_complete_once`) and reads the same runs for its
    own claims."""
    lab = classlabs.find(ref)
    missing = doctor.missing(classlabs.needs(lab))
    assert not missing, f"lab {lab.ref} needs {', '.join(missing)}, which this kernel lacks"
    classlabs.run(lab, out, repeats=1)
    runs = {}
    for r in lab.runs:
        path = out / r.name / "seed-1"
        summary = path / "summary.json"   # none for a run that failed: assert_complete_once says which
        runs[r.name] = (json.loads(summary.read_text()) if summary.exists() else None, path)
    return lab, runs


def assert_passes_on_its_repeats(lab, handin: Path, capsys) -> str:
    """`lab check` of ``handin`` (OUT/<run>/seed-N/ at the lab's repeats): exit 0 and every lab run's evidence
    complete at the lab's repeats. Returns what the check printed."""
    capsys.readouterr()
    status = classlabs.check(lab, [handin])
    said = capsys.readouterr().out
    assert status == 0, said
    n = lab.repeats
    for r in lab.runs:  # every run's evidence is listed
        assert f"{r.name}: {n} runs, complete {n}/{n}" in said, said
    return said


def run_once(lab, out: Path) -> None:
    """The lab driver, every lab run once (seed 1) into ``out/<run>/seed-1/``, then :func:`assert_complete_once`."""
    classlabs.run(lab, out, repeats=1)
    assert_complete_once(lab, out)


def assert_complete_once(lab, out: Path) -> None:
    verdicts, runs = labcheck.grade_folders(lab, classlabs.wanted(lab), [out])
    assert len(runs) == len(lab.runs) and all("complete 1/1" in r for r in runs), runs
    broken = [(v.expect.says, v.status, v.note) for v in verdicts if v.status in (NO_VALUE, MISSING, DIFFERENT)]
    assert not broken, broken
    assert all(v.runs == "1 run" for v in verdicts if v.status == PASS)
