"""Classroom labs: every lab in labs/ loads (its scenarios, parameters, faults and statements check out), and the
grading logic (matching run directories to a lab's runs, bands, ratios, exit statuses) on hand-made run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.grading import (DIFFERENT, FAIL, MISSING, NO_VALUE, PASS, Expect, WantedRun, exit_status, grade,
                              match_runs)
from testbed.commands import labs as classlabs
from testbed.errors import UsageError


def test_every_lab_loads_with_a_handout_and_checkable_statements():
    labs = classlabs.catalogue()
    assert len(labs) >= 7
    assert [l.number for l in labs] == sorted({l.number for l in labs})
    for lab in labs:
        text = (lab.path / "README.md").read_text()
        for part in ("**Goal.**", "## Background", "## Predict", "## Steps", "## Questions", "## Instructor notes"):
            assert part in text, (lab.ref, part)
        assert lab.expects and lab.minutes > 0
        for r in lab.runs:
            assert r.command().startswith(f"sudo testbed run {r.scenario}")


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
    ('title="x"\n[[expect]]\nsays="s"\nmetric="m"\nrun="a"\nmin=1\n', r"at least one \[\[run\]\]"),
    ('[[run]]\nname="a"\nscenario="incast"\n', r"at least one \[\[expect\]\]"),
    ('[[run]]\nname="a"\nscenario="nope"\n[[expect]]\nsays="s"\nmetric="m"\nrun="a"\nmin=1\n', "unknown scenario"),
    ('[[run]]\nname="a"\nscenario="incast"\nset={senders=0}\n[[expect]]\nsays="s"\nmetric="m"\nrun="a"\nmin=1\n',
     "senders"),
    ('[[run]]\nname="a"\nscenario="incast"\n[[expect]]\nsays="s"\nmetric="m"\nrun="b"\nmin=1\n', "no run named 'b'"),
    ('[[run]]\nname="a"\nscenario="incast"\n[[expect]]\nsays="s"\nmetric="m"\nrun="a"\n', "min and/or max"),
    ('[[run]]\nname="A b"\nscenario="incast"\n', "lower-case"),
    ('[[run]]\nname="a"\nscenario="collective"\nfault=["link-down leaf9-spine1 at_s=1"]\n'
     '[[expect]]\nsays="s"\nmetric="m"\nrun="a"\nmin=1\n', "leaf9"),
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
