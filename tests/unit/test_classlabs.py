"""Classroom labs: every lab in labs/ loads (its scenarios, parameters, faults and statements check out), and the
grading logic (matching run directories to a lab's runs, bands, ratios, exit statuses) on hand-made run folders."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analysis.grading import (DIFFERENT, FAIL, MISSING, NO_VALUE, PASS, UNSURE, Expect, WantedRun, exit_status,
                              grade, match_runs)
from testbed.commands import labs as classlabs
from testbed.errors import UsageError


def test_every_lab_loads_with_a_handout_and_checkable_statements():
    labs = classlabs.catalogue()
    assert len(labs) >= 7
    assert [l.number for l in labs] == sorted({l.number for l in labs})
    for lab in labs:
        text = (lab.path / "README.md").read_text()
        for part in ("**Goal.**", "## Background", "## Predict", "## Steps", "## Questions"):
            assert part in text, (lab.ref, part)
        assert lab.expects and lab.minutes > 0 and lab.repeats >= 1
        for r in lab.runs:
            assert r.command().startswith(f"sudo testbed run {r.scenario}")


def _section(text: str, heading: str) -> str:
    """The text under the first ``## heading...`` up to the next ``## `` heading."""
    m = re.search(rf"^## {heading}[^\n]*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


@pytest.mark.parametrize("lab", classlabs.catalogue(), ids=lambda l: l.ref)
def test_every_lab_has_instructor_notes_with_an_answer_per_question_and_a_rubric(lab):
    notes = lab.path / "INSTRUCTOR.md"
    handout, text = (lab.path / "README.md").read_text(), notes.read_text()
    assert "## Instructor notes" not in handout, "the handout is the student's: answers go in INSTRUCTOR.md"
    questions = re.findall(r"^(\d+)\. ", _section(handout, "Questions"), re.M)
    # an answer: "1. ...", "**Q1.** ...", "### Question 1" (not "**Predict 1.**", which answers the prediction)
    answered = set(re.findall(r"^(?:#+ )?(?:\*\*)?(?:Q|Question )?(\d+)[.:)]", _section(text, "Answers"), re.M))
    assert questions and set(questions) <= answered, (questions, answered)
    assert re.search(r"\d", _section(text, "Reference")), "reference numbers, with their spread"
    rubric = _section(text, "Rubric")
    assert "point" in text[text.index("## Rubric"):].lower() and re.search(r"\| *\d+ *\|", rubric)


def test_labs_are_found_by_number_name_or_folder():
    assert classlabs.find("2").slug == classlabs.find("02-incast-rtomin").slug == "incast-rtomin"
    assert classlabs.find("incast-rtomin").number == 2
    with pytest.raises(UsageError, match="no lab '99'"):
        classlabs.find("99")


def write_lab(tmp: Path, toml: str) -> Path:
    d = tmp / "labs" / "01-x"
    d.mkdir(parents=True)
    (d / "lab.toml").write_text(toml)
    return d


@pytest.mark.parametrize("toml, says", [
    ('title="x"\n[[expect]]\nsays="s"\nmetric="drops"\nrun="a"\nmin=1\n', r"at least one \[\[run\]\]"),
    ('[[run]]\nname="a"\nscenario="incast"\n', r"at least one \[\[expect\]\]"),
    ('[[run]]\nname="a"\nscenario="nope"\n[[expect]]\nsays="s"\nmetric="drops"\nrun="a"\nmin=1\n', "unknown scenario"),
    ('[[run]]\nname="a"\nscenario="incast"\nset={senders=0}\n[[expect]]\nsays="s"\nmetric="drops"\nrun="a"\nmin=1\n',
     "senders"),
    ('[[run]]\nname="a"\nscenario="incast"\n[[expect]]\nsays="s"\nmetric="drops"\nrun="b"\nmin=1\n',
     "no run named 'b'"),
    ('[[run]]\nname="a"\nscenario="incast"\n[[expect]]\nsays="s"\nmetric="drops"\nrun="a"\n', "min and/or max"),
    ('[[run]]\nname="A b"\nscenario="incast"\n', "lower-case"),
    ('[[run]]\nname="a"\nscenario="incast"\n[[expect]]\nsays="s"\nmetric="round_ms_p90"\nrun="a"\nmin=1\n',
     "no metric named 'round_ms_p90'"),
    ('[[run]]\nname="a"\nscenario="incast"\n[[expect]]\nsays="s"\nmetric="drops"\nper="fair_mpbs"\nrun="a"\nmin=1\n',
     "no metric named 'fair_mpbs'"),
    ('repeats=0\n[[run]]\nname="a"\nscenario="incast"\n[[expect]]\nsays="s"\nmetric="drops"\nrun="a"\nmin=1\n',
     "repeats = 0"),
    ('[[run]]\nname="a"\nscenario="collective"\nfault=["link-down leaf9-spine1 at_s=1"]\n'
     '[[expect]]\nsays="s"\nmetric="drops"\nrun="a"\nmin=1\n', "leaf9"),
])
def test_a_broken_lab_fails_with_one_line_naming_its_file(tmp_path, toml, says):
    d = write_lab(tmp_path, toml)
    with pytest.raises(UsageError, match=says) as e:
        classlabs.load(d)
    assert "lab.toml" in str(e.value) and "\n" not in str(e.value)


def run_dir(root: Path, name: str, scenario: str, params: dict, summary: dict, faults=()) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"scenario": scenario, "params": params, "faults": list(faults),
                                                  "complete": True}))
    (d / "summary.json").write_text(json.dumps(summary))
    return d


WANT = [WantedRun("slow", "incast", {"rto_min_ms": 200}), WantedRun("fast", "incast", {"rto_min_ms": 5})]
EXPECT = [Expect("slow tail", "round_ms_p99", "slow", min=200),
          Expect("ratio", "round_ms_p99", "slow", over="fast", min=2),
          Expect("per", "victim_mbps", "slow", per="fair_mbps", max=0.6)]


def test_grading_matches_by_folder_then_by_parameters_and_applies_the_bands(tmp_path):
    run_dir(tmp_path / "lab", "slow", "incast", {"rto_min_ms": 200, "senders": 8},
            {"round_ms_p99": 300.0, "victim_mbps": 1.0, "fair_mbps": 2.0})
    run_dir(tmp_path / "elsewhere", "my-run", "incast", {"rto_min_ms": 5}, {"round_ms_p99": 100.0})
    m = match_runs(WANT, [tmp_path / "lab", tmp_path / "elsewhere" / "my-run"])
    assert m.dirs == {"slow": tmp_path / "lab" / "slow", "fast": tmp_path / "elsewhere" / "my-run"}
    v = grade(EXPECT, m)
    assert [x.status for x in v] == [PASS, PASS, PASS]
    assert v[1].value == pytest.approx(3.0) and v[2].value == pytest.approx(0.5)
    assert exit_status(v) == 0


def test_a_failed_band_fails_and_gives_the_hint(tmp_path):
    run_dir(tmp_path, "slow", "incast", {"rto_min_ms": 200}, {"round_ms_p99": 150.0})
    run_dir(tmp_path, "fast", "incast", {"rto_min_ms": 5}, {"round_ms_p99": 100.0})
    e = [Expect("slow tail", "round_ms_p99", "slow", min=200, hint="look at timeouts"),
         Expect("absent", "nothing_here", "slow", min=1)]
    v = grade(e, match_runs(WANT, [tmp_path]))
    assert (v[0].status, v[0].value, v[0].note) == (FAIL, 150.0, "look at timeouts")
    assert v[1].status == NO_VALUE
    assert exit_status(v) == 1


def test_a_run_made_differently_is_reported_not_graded_and_a_missing_one_too(tmp_path):
    run_dir(tmp_path, "slow", "incast", {"rto_min_ms": 20}, {"round_ms_p99": 50.0})
    v = grade(EXPECT[:2], match_runs(WANT, [tmp_path]))
    assert v[0].status == DIFFERENT and "rto_min_ms=20 (lab: 200)" in v[0].note
    assert v[1].status == DIFFERENT  # its numerator run is the different one
    assert exit_status(v) == 3
    v = grade([Expect("ratio", "round_ms_p99", "fast", min=1)], match_runs(WANT, [tmp_path]))
    assert v[0].status == MISSING and exit_status(v) == 3
    run_dir(tmp_path, "fast", "incast", {"rto_min_ms": 5}, {"round_ms_p99": 10.0}, faults=["link-down x at_s=1"])
    m = match_runs(WANT, [tmp_path])
    assert "1 fault(s) (lab: 0)" in m.different["fast"]


def test_lab_check_is_a_cli_command_with_exit_statuses(tmp_path, capsys):
    from testbed.cli import main

    assert main(["lab", "list"]) == 0
    assert "incast-rtomin" in capsys.readouterr().out
    assert main(["lab", "show", "2"]) == 0
    assert "sudo testbed run incast" in capsys.readouterr().out
    assert main(["lab", "check", "2", str(tmp_path / "nope")]) == 2
    assert main(["lab", "check", "2", str(tmp_path)]) == 3  # nothing to grade: every run missing
    assert main(["lab", "show", "99"]) == 2


# ---- repeats: statements grade distributions (analysis.stats), unfaithful runs are reported, not graded ----------


def repeat_folder(root: Path, name: str, scenario: str, params: dict, values: list[dict],
                  unfaithful: tuple[int, ...] = (), incomplete: tuple[int, ...] = ()) -> Path:
    """RUN/seed-<seed>/ run directories, seeds 1..n (the layout `lab run` and `testbed run --repeat` write)."""
    folder = root / name
    for i, summary in enumerate(values, 1):
        d = run_dir(folder, f"seed-{i}", scenario, params, {**summary, "fidelity_ok": i not in unfaithful})
        if i in incomplete:
            m = json.loads((d / "manifest.json").read_text())
            (d / "manifest.json").write_text(json.dumps({**m, "complete": False}))
    return folder


def test_a_statement_on_one_run_passes_only_when_the_medians_95_percent_bound_clears_it(tmp_path):
    slow = [{"round_ms_p99": v} for v in (210.0, 230.0, 250.0, 220.0, 240.0)]
    repeat_folder(tmp_path, "slow", "incast", {"rto_min_ms": 200}, slow)
    m = match_runs(WANT, [tmp_path])
    assert m.dirs == {"slow": tmp_path / "slow"}
    v = grade([Expect("tail", "round_ms_p99", "slow", min=200), Expect("tail", "round_ms_p99", "slow", min=215),
               Expect("tail", "round_ms_p99", "slow", max=205, hint="h")], m)
    assert [x.status for x in v] == [PASS, UNSURE, FAIL]
    assert (v[0].value, v[0].low, v[0].high, v[0].runs) == (230.0, 210.0, 250.0, "5 runs")
    assert v[1].label == "not enough evidence (5 runs)" and v[2].note == "h"
    assert exit_status(v[:2]) == 3 and exit_status(v) == 1


def test_four_runs_are_not_enough_evidence_for_a_one_sided_95_percent_claim(tmp_path):
    repeat_folder(tmp_path, "slow", "incast", {"rto_min_ms": 200}, [{"round_ms_p99": 300.0}] * 4)
    v = grade([Expect("tail", "round_ms_p99", "slow", min=200)], match_runs(WANT, [tmp_path]))
    assert v[0].label == "not enough evidence (4 runs)" and "5 needed" in v[0].note


def test_unfaithful_and_incomplete_runs_are_reported_and_left_out(tmp_path, capsys):
    vals = [{"round_ms_p99": v} for v in (300.0, 310.0, 320.0, 5.0, 6.0, 330.0, 340.0)]
    repeat_folder(tmp_path, "slow", "incast", {"rto_min_ms": 200}, vals, unfaithful=(4,), incomplete=(5,))
    v = grade([Expect("tail", "round_ms_p99", "slow", min=200)], match_runs(WANT, [tmp_path]))
    assert (v[0].status, v[0].runs, v[0].low) == (PASS, "5 runs", 300.0)  # the 5 and 6 ms runs are not graded
    from testbed.commands.labcheck import grade_folders

    lab = classlabs.find("2")
    want = {w.name: w for w in classlabs.wanted(lab)}
    repeat_folder(tmp_path / "hand-in", "rto200", "incast", want["rto200"].params, vals, unfaithful=(4,),
                  incomplete=(5,))
    _, runs = grade_folders(lab, classlabs.wanted(lab), [tmp_path / "hand-in"])
    assert runs == ["rto200: 7 runs, complete 6/7, fidelity_ok 6/7 (seed-4 unfaithful, seed-5 incomplete: not "
                    "graded)"]


def test_a_ratio_statement_needs_the_rank_test_and_the_ratios_interval(tmp_path):
    repeat_folder(tmp_path, "slow", "incast", {"rto_min_ms": 200}, [{"r": v} for v in (300, 310, 290, 305, 320)])
    repeat_folder(tmp_path, "fast", "incast", {"rto_min_ms": 5}, [{"r": v} for v in (100, 110, 95, 105, 98)])
    m = match_runs(WANT, [tmp_path])
    v = grade([Expect("x", "r", "slow", over="fast", min=2), Expect("x", "r", "slow", over="fast", min=2.9),
               Expect("x", "r", "slow", over="fast", min=4), Expect("x", "r", "slow", over="fast", min=0, max=3.5),
               Expect("x", "r", "fast", over="slow", max=0.5)], m)
    assert [x.status for x in v] == [PASS, UNSURE, FAIL, PASS, PASS]
    assert v[0].value == pytest.approx(305 / 100) and v[0].low < v[0].value < v[0].high and v[0].runs == "5 runs"
    assert "runs a side would tell" in v[1].note


def test_a_ratio_of_two_indistinguishable_sides_is_not_enough_evidence_for_a_difference(tmp_path):
    repeat_folder(tmp_path, "slow", "incast", {"rto_min_ms": 200}, [{"r": v} for v in (100, 130, 90, 120, 110)])
    repeat_folder(tmp_path, "fast", "incast", {"rto_min_ms": 5}, [{"r": v} for v in (105, 125, 95, 115, 100)])
    v = grade([Expect("x", "r", "slow", over="fast", min=1.1), Expect("x", "r", "slow", over="fast", min=0.5)],
              match_runs(WANT, [tmp_path]))
    assert v[0].label == "not enough evidence (5 runs)"
    assert v[1].status == PASS  # "at least half as large" holds with 95% confidence


def test_old_single_run_folders_still_grade_marked_one_run(tmp_path):
    run_dir(tmp_path, "slow", "incast", {"rto_min_ms": 200}, {"round_ms_p99": 300.0})
    run_dir(tmp_path, "fast", "incast", {"rto_min_ms": 5}, {"round_ms_p99": 100.0})
    v = grade(EXPECT[:2], match_runs(WANT, [tmp_path]))
    assert [(x.status, x.runs) for x in v] == [(PASS, "1 run"), (PASS, "1 run")]


def test_a_repeat_folder_made_differently_is_reported(tmp_path):
    repeat_folder(tmp_path, "slow", "incast", {"rto_min_ms": 200}, [{"r": 1}, {"r": 2}])
    run_dir(tmp_path / "slow", "seed-3", "incast", {"rto_min_ms": 20}, {"r": 3})
    m = match_runs(WANT, [tmp_path])
    assert "rto_min_ms=20 (lab: 200)" in m.different["slow"]


def test_repeat_json_has_the_layout_analysis_repeats_reads(tmp_path):
    from analysis.evidence import write_repeat_json

    f = repeat_folder(tmp_path, "slow", "incast", {"rto_min_ms": 200},
                      [{"round_ms_p99": v} for v in (1.0, 2.0, 3.0)], unfaithful=(2,))
    doc = write_repeat_json(f, "incast", [1, 2, 3])
    assert json.loads((f / "repeat.json").read_text()) == doc
    assert (doc["kind"], doc["scenario"], doc["seeds"], doc["runs"]) == ("repeat", "incast", [1, 2, 3],
                                                                         ["seed-1", "seed-2", "seed-3"])
    assert doc["unfaithful"] == ["seed-2"] and doc["incomplete"] == []
    est = doc["metrics"]["round_ms_p99"]
    assert set(est) == {"median", "low", "high", "n", "cv", "coverage"} and (est["median"], est["n"]) == (2.0, 2)


def test_class_grading_gives_one_csv_row_per_student_and_statement(tmp_path, capsys):
    import csv
    import io

    from testbed.cli import main

    lab = classlabs.find("2")
    want = {w.name: w for w in classlabs.wanted(lab)}
    for student, p99 in (("ana", 400.0), ("bo", 150.0)):
        for name in ("rto200", "rto5"):
            value = p99 if name == "rto200" else 100.0
            repeat_folder(tmp_path / "class" / student, name, "incast", want[name].params,
                          [{"round_ms_p99": value + i, "tcp_timeouts": 5, "drops": 50} for i in range(5)])
    (tmp_path / "class" / "cy").mkdir()  # handed in nothing
    capsys.readouterr()
    assert main(["lab", "check", "2", "--class", str(tmp_path / "class"), "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    n = len(lab.expects)
    assert len(rows) == 3 * n and [r["student"] for r in rows[::n]] == ["ana", "bo", "cy"]
    assert {r["status"] for r in rows if r["student"] == "cy"} == {MISSING}
    p99 = [r for r in rows if r["metric"] == "round_ms_p99"] if "metric" in rows[0] else \
        [r for r in rows if "round_ms_p99(rto200)" in r["band"] and "/" not in r["band"]]
    assert [r["status"] for r in p99] == [PASS, FAIL, MISSING] and p99[0]["runs"] == "5 runs"
    assert main(["lab", "check", "2", "--class", str(tmp_path / "nope")]) == 2
    assert main(["lab", "check", "2"]) == 2


def test_lab_show_prints_the_handout_and_only_the_instructor_adds_the_answers(capsys):
    from testbed.cli import main

    assert main(["lab", "show", "1"]) == 0
    student = capsys.readouterr().out
    assert "## Questions" in student or "Questions" in student
    assert "Rubric" not in student and "Answers" not in student
    assert main(["lab", "show", "1", "--instructor"]) == 0
    both = capsys.readouterr().out
    assert "Rubric" in both and "Answers" in both and len(both) > len(student)


def test_every_metric_a_fixture_run_holds_is_a_known_name():
    from analysis.metricnames import known

    for f in Path(__file__).resolve().parents[1].joinpath("fixtures").rglob("summary.json"):
        for k, v in json.loads(f.read_text()).items():
            if isinstance(v, (int, float)):
                assert known(k) or k in {"cct_p99_ms"}, (f, k)
    assert not known("round_ms_p90") and known("comm_ms_tp") and known("wire_roce_naks")


def test_lab_run_makes_one_repeat_folder_per_run_and_never_runs_again(tmp_path, monkeypatch, capsys):
    """The orchestration only (seeds, folders, repeat.json, the check after): the runs themselves are written by a
    stand-in that records what it was asked, as a real run would leave its run directory."""
    from testbed.commands import runner
    from testbed.errors import RunFailed

    lab = classlabs.find("2")
    asked = []

    def fake_run(sc, params, seed, out, quiet=True, faults=None):
        asked.append((out.parent.name, seed))
        if (out.parent.name, seed) == ("rto5", 3):
            raise RunFailed("the fabric did not come up")
        slow = params["rto_min_ms"] == 200
        run_dir(out.parent, out.name, sc.name, params,
                {"round_ms_p99": (250.0 if slow else 20.0) + seed, "tcp_timeouts": 4, "drops": 40 + seed})

    monkeypatch.setattr(runner, "run_scenario", fake_run)
    status = classlabs.run(lab, tmp_path / "out", repeats=5)
    assert asked == [(r, s) for s in range(1, 6) for r in ("rto200", "rto5")]  # each once, in rounds
    assert status == 1  # a run failed: reported, not re-run
    doc = json.loads((tmp_path / "out" / "rto5" / "repeat.json").read_text())
    assert doc["runs"] == ["seed-1", "seed-2", "seed-4", "seed-5"] and doc["seeds"] == [1, 2, 3, 4, 5]
    said = capsys.readouterr()
    assert "rto5 seed 3 failed: the fabric did not come up" in said.err
    assert "rto200: 5 runs, complete 5/5, fidelity_ok 5/5" in said.out and "rto5: 4 runs" in said.out


def test_a_repeat_folder_left_with_one_faithful_run_is_not_graded_as_one_run(tmp_path):
    repeat_folder(tmp_path, "slow", "incast", {"rto_min_ms": 200}, [{"round_ms_p99": 300.0}] * 5,
                  unfaithful=(1, 2, 3, 4))
    v = grade([Expect("tail", "round_ms_p99", "slow", min=200)], match_runs(WANT, [tmp_path]))
    assert v[0].label == "not enough evidence (1 run)"
    repeat_folder(tmp_path / "one", "slow", "incast", {"rto_min_ms": 200}, [{"round_ms_p99": 300.0}])
    v = grade([Expect("tail", "round_ms_p99", "slow", min=200)], match_runs(WANT, [tmp_path / "one"]))
    assert (v[0].status, v[0].runs) == (PASS, "1 run")  # `lab run --repeat 1`


def test_lab_run_refuses_a_repeat_below_one_before_anything_runs(capsys):
    from testbed.cli import main

    assert main(["lab", "run", "1", "--repeat", "0"]) == 2
    assert "--repeat 0" in capsys.readouterr().err
