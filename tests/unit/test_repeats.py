"""Repeat folders (analysis.repeats, testbed.commands.repeat.repeat) and `compare` of two sides: the layout the lab
grader relies on, unfaithful and incomplete runs left out and named, verdicts, outputs, one-line errors.
The runs here are written by hand (pure logic: no fabric); tests/host/test_compare_repeats.py makes real ones."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import repeats
from analysis.compare import compare_sides
from testbed import cli
from testbed.commands.repeat import repeat
from testbed.errors import UsageError


def write_run(d: Path, seed: int, summary: dict | None, complete: bool = True, rounds_ms=None) -> Path:
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"scenario": "incast", "params": {}, "seed": seed,
                                                 "complete": complete}))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    if rounds_ms:
        rows = [(r, "h2", 10.0 + r, 10.0 + r + ms / 1e3, 1000) for r, ms in enumerate(rounds_ms)]
        pd.DataFrame(rows, columns=["round", "sender", "start_s", "end_s", "bytes"]).to_csv(d / "rounds.csv",
                                                                                           index=False)
    return d


def folder(path: Path, p99s: list[float], first_seed: int = 1, **extra) -> Path:
    """A repeat folder made through the Lab-script helper: one run per value, round_ms_p99 = the value."""
    values = dict(zip(range(first_seed, first_seed + len(p99s)), p99s))

    def one(d: Path, seed: int) -> None:
        write_run(d, seed, {"round_ms_p99": values[seed], "senders": 8, "fidelity_ok": True, **extra})

    repeat(one, len(p99s), path, seed=first_seed, scenario="incast", say=None)
    return path


def test_the_repeat_folder_layout_and_repeat_json(tmp_path):
    def one(d: Path, seed: int) -> None:
        if seed == 3:
            raise RuntimeError("the fabric fell over")
        summary = {"round_ms_p99": 100.0 + seed, "goodput_mbps": 10.0, "ok": True, "bottleneck": "s2:r1",
                   "fidelity_ok": seed != 4, "fidelity_reasons": ["port s1:x at 0.4 of its rate"] if seed == 4 else []}
        write_run(d, seed, summary, complete=seed != 5)
        if seed == 3:
            raise AssertionError("never")

    out = tmp_path / "rep"
    res = repeat(one, 11, out, seed=1, scenario="incast", say=None)
    assert res.failed == [("seed-3", "RuntimeError: the fabric fell over")]
    got = json.loads((out / "repeat.json").read_text())
    assert got == res.summary
    assert got["kind"] == "repeat" and got["scenario"] == "incast"
    # seed order, not name order (seed-10 after seed-9); the run that raised before writing has no folder
    assert got["runs"] == [f"seed-{s}" for s in (1, 2, 4, 5, 6, 7, 8, 9, 10, 11)]
    assert got["seeds"] == [1, 2, 4, 5, 6, 7, 8, 9, 10, 11]
    assert got["unfaithful"] == ["seed-4"] and got["incomplete"] == ["seed-5"]
    p99 = got["metrics"]["round_ms_p99"]
    assert p99["n"] == 8 and p99["median"] == pytest.approx((107 + 108) / 2)
    assert set(p99) == {"median", "low", "high", "n", "cv", "coverage"}
    assert "fidelity_ok" not in got["metrics"] and "bottleneck" not in got["metrics"]
    assert got["metrics"]["ok"]["median"] == 1.0
    assert repeats.is_repeat_folder(out) and not repeats.is_repeat_folder(out / "seed-1")
    assert not repeats.is_repeat_folder(tmp_path / "nothing") and not repeats.is_repeat_folder(tmp_path)
    assert [d.name for d in repeats.run_dirs(out)][-3:] == ["seed-9", "seed-10", "seed-11"]
    assert repeats.values(out, "round_ms_p99") == [101, 102, 106, 107, 108, 109, 110, 111]
    assert repeats.values(out, "missing") == []
    assert res.estimate("round_ms_p99").n == 8 and res.values("goodput_mbps") == [10.0] * 8
    # summarize again from the folder alone: the same file
    assert repeats.summarize(out) == got


def test_repeat_refuses_bad_counts_and_seeds_before_running(tmp_path):
    ran = []
    for runs, seed in ((0, 1), (-2, 1), (True, 1), (2, 2**32 - 1)):
        with pytest.raises(UsageError):
            repeat(lambda d, s: ran.append(s), runs, tmp_path / "x", seed=seed, say=None)
    assert not ran and not (tmp_path / "x").exists()
    with pytest.raises(UsageError):
        repeat(lambda d, s: ran.append(s), 2, "/proc/nope", say=None)
    # Ctrl-C stops the repeats; repeat.json still describes the runs made
    def interrupted(d, s):
        if s == 2:
            raise KeyboardInterrupt
        write_run(d, s, {"x": 1.0})
    with pytest.raises(KeyboardInterrupt):
        repeat(interrupted, 3, tmp_path / "ki", say=None)
    assert json.loads((tmp_path / "ki" / "repeat.json").read_text())["runs"] == ["seed-1"]


def test_compare_sides_tells_a_clear_difference_and_draws_it(tmp_path):
    a = folder(tmp_path / "rto200", [251, 300, 461, 280, 320])
    b = folder(tmp_path / "rto5", [94, 99, 95, 97, 96], first_seed=1)
    df, sa, sb = compare_sides(a, b, out=tmp_path / "cmp")
    r = df[df["metric"] == "round_ms_p99"].iloc[0]
    assert r["verdict"] == "A > B" and r["ratio_low"] > 1 and r["A_n"] == 5 and r["A_median"] == 300
    assert r["ratio"] == pytest.approx(300 / 96) and r["runs_needed"] is None or pd.isna(r["runs_needed"])
    assert df["metric"].iloc[0] == "round_ms_p99"  # headline metrics first
    s = df[df["metric"] == "senders"].iloc[0]
    assert s["verdict"] == "not distinguishable (5 runs)" and s["ratio"] == 1.0
    assert sa.repeat and sa.used == [f"seed-{i}" for i in range(1, 6)] and not sa.unfaithful
    for name in ("compare.csv", "compare.md", "compare_distributions.png"):
        assert (tmp_path / "cmp" / name).stat().st_size > 0
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "![distributions](compare_distributions.png)" in md and f"A = {a}" in md
    csv = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert {"A_median", "A_low", "A_high", "A_cv", "B_n", "ratio_low", "p_value", "verdict"} <= set(csv.columns)


def test_compare_sides_one_distribution_unfaithful_runs_and_a_single_run(tmp_path):
    a = folder(tmp_path / "a", [300, 251, 461, 280, 320])
    b = folder(tmp_path / "b", [320, 290, 270, 410, 305], first_seed=6)
    df, _, _ = compare_sides(a, b)
    r = df[df["metric"] == "round_ms_p99"].iloc[0]
    assert r["verdict"] == "not distinguishable (5 runs)" and r["ratio_low"] < 1 < r["ratio_high"]
    assert r["runs_needed"] >= 4
    # an unfaithful run is named and left out, not averaged in
    bad = write_run(tmp_path / "c" / "seed-9", 9, {"round_ms_p99": 5000.0, "fidelity_ok": False,
                                                   "fidelity_reasons": "sampler 40 ms late"})
    for s, v in zip(range(1, 5), (300, 310, 290, 305)):
        write_run(tmp_path / "c" / f"seed-{s}", s, {"round_ms_p99": float(v)})
    write_run(tmp_path / "c" / "seed-5", 5, None, complete=False)
    df, sc, _ = compare_sides(tmp_path / "c", b)
    assert sc.unfaithful == [("seed-9", "sampler 40 ms late")] and sc.incomplete == ["seed-5"]
    assert df[df["metric"] == "round_ms_p99"].iloc[0]["A_n"] == 4 and "NOT FAITHFUL" in sc.describe()
    assert bad.name in sc.describe() and "INCOMPLETE, left out: seed-5" in sc.describe()
    # a run directory is a side of one run; rounds.csv's recomputed p99 is its value (the report's)
    one = write_run(tmp_path / "one", 1, {"round_ms_p99": 1.0}, rounds_ms=[10, 20, 40])
    df, so, _ = compare_sides(one, b, out=tmp_path / "o1")
    r = df[df["metric"] == "round_ms_p99"].iloc[0]
    assert not so.repeat and r["A_n"] == 1 and r["A_median"] == pytest.approx(40.0)
    assert r["verdict"] == "not distinguishable (1 vs 5 runs)"
    assert (tmp_path / "o1" / "compare_distributions.png").exists()  # B has repeats


def test_cli_compare_of_repeat_folders(tmp_path, capsys):
    a = folder(tmp_path / "rto200", [251, 300, 461, 280, 320])
    b = folder(tmp_path / "rto5", [94, 99, 95, 97, 96])
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "round_ms_p99" in x)
    assert "A > B" in line and "300 [251, 461]" in line and "96 [94, 99]" in line
    assert "the same on every run of both sides: senders" in out
    assert str(tmp_path / "o" / "compare_distributions.png") in out
    same = folder(tmp_path / "again", [300, 251, 461, 280, 320], first_seed=6)
    assert cli.main(["compare", str(a), str(same)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "round_ms_p99" in x)
    assert "not distinguishable (5 runs)" in line
    for argv, words in ((["compare", str(a), str(b), str(same)], "takes two sides"),
                        (["compare", str(a), str(tmp_path / "nope")], "no such run directory"),
                        (["compare", str(a), str(tmp_path)], "nor a repeat folder"),
                        (["compare", str(a), str(b), "--level", "1.5"], "--level")):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and words in err, err


def test_cli_compare_of_two_runs_says_it_has_no_verdict(tmp_path, capsys):
    a = write_run(tmp_path / "a", 1, {"goodput_mbps": 20.0})
    b = write_run(tmp_path / "b", 1, {"goodput_mbps": 5.0})
    assert cli.main(["compare", str(a), str(b)]) == 0
    assert "carry no verdict" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["run", "smoke", "--repeat", "0"], ["run", "smoke", "--repeat", "x"],
                                  ["run", "smoke", "--repeat", "3", "--live"],
                                  ["sweep", "smoke", "--set", "duration_s=1,2", "--repeat", "0"],
                                  ["audit", "--repeat", "-1"]])
def test_bad_repeat_counts_are_one_line_and_exit_2(argv, tmp_path, capsys):
    try:
        status = cli.main([*argv, "--out", str(tmp_path / "never")])
    except SystemExit as e:  # argparse's own error (a count that is no number), one line through OneLineErrorParser
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "repeat" in err, err
    assert not (tmp_path / "never").exists()


# ------------------------------------------------------------------ --repeat on sweep, audit and run (fake runs)

def _fake_runs(calls):
    """runner.run_scenario replaced: a run directory whose goodput depends on the rate and the seed."""
    def fake(scenario, params, seed, out, quiet=False, faults=()):
        calls.append((params.get("rate_mbps"), seed, Path(out).parent.name, Path(out).name))
        summary = {"goodput_mbps": params.get("rate_mbps", 10) * 0.9 + seed % 3, "fidelity_ok": seed != 13,
                   "step_ms_p50": 100.0 * params.get("ranks", 4) ** 0.5 + seed % 2, "step_ms_p99": 500.0}
        write_run(Path(out), seed, summary)
        return summary
    return fake


def test_sweep_with_repeats_makes_a_repeat_folder_per_point(tmp_path, monkeypatch):
    from testbed.commands import runner, sweep
    from testbed.scenario import get

    calls = []
    monkeypatch.setattr(runner, "run_scenario", _fake_runs(calls))
    pl = sweep.plan(get("smoke"), ["rate_mbps=10,20", "duration_s=1"])
    df = sweep.run_sweep(pl, tmp_path, seed=11, quiet=True, repeat=3)
    assert [c[1:] for c in calls] == [(s, f"rate_mbps={r}", f"seed-{s}") for r in (10, 20) for s in (11, 12, 13)]
    for r in (10, 20):
        got = json.loads((tmp_path / f"rate_mbps={r}" / "repeat.json").read_text())
        assert got["runs"] == ["seed-11", "seed-12", "seed-13"] and got["unfaithful"] == ["seed-13"]
    # seed 13 is unfaithful: the medians are over seeds 11 and 12 (goodput 0.9 r + 2 and 0.9 r + 0)
    assert list(df["goodput_mbps"]) == pytest.approx([10.0, 19.0])
    assert list(df["goodput_mbps_low"]) == pytest.approx([9.0, 18.0]) and list(df["repeats_n"]) == [2, 2]
    assert list(df["left_out"]) == ["seed-13", "seed-13"]
    csv = pd.read_csv(tmp_path / "sweep.csv")
    assert {"goodput_mbps_low", "goodput_mbps_high", "repeats_n"} <= set(csv.columns)
    assert "repeat folder" in (tmp_path / "sweep.md").read_text()
    assert (tmp_path / "sweep_goodput_mbps.png").stat().st_size > 0


def test_audit_efficiency_gets_its_interval_from_the_repeats(tmp_path, monkeypatch):
    from testbed.commands import audit, runner, sweep
    from testbed.scenario import get

    monkeypatch.setattr(runner, "run_scenario", _fake_runs([]))
    pl = audit.plan(get("collective"), ["ranks=4"], (1, 4), "weak")
    df = sweep.run_sweep(pl, tmp_path, seed=1, quiet=True, repeat=4)
    df = audit.efficiency_intervals(audit.audit_table(df, (1, 4), "weak"), tmp_path, pl, (1, 4), "weak")
    # step p50 = 100 sqrt(ranks) + (seed odd): 200-201 ms at 4 ranks, 400-401 at 16: efficiency about 0.5
    assert df["efficiency"].iloc[1] == pytest.approx(200.5 / 400.5)
    assert df["efficiency_low"].iloc[1] <= df["efficiency"].iloc[1] <= df["efficiency_high"].iloc[1] < 0.51
    assert list(df["step_vs_base"]) == ["not distinguishable (4 runs)", "A < B"]


def test_run_repeat_goes_to_the_lab_vm_whole(tmp_path, monkeypatch, capsys):
    from testbed.commands import runner
    from testbed.vm import labvm

    vm_calls = []
    monkeypatch.setattr(labvm, "in_vm", lambda: False)
    monkeypatch.setattr(labvm, "vm_kernel", lambda: ("7.0", Path("/nonexistent")))
    monkeypatch.setattr(labvm, "run", lambda argv, options=None: vm_calls.append(argv) or 0)
    monkeypatch.setattr(runner, "missing_capabilities", lambda needs: ["qdisc:red+ecn"])
    monkeypatch.setattr(runner, "require_root", lambda what: None)
    monkeypatch.setattr(runner, "run_scenario", lambda *a, **k: pytest.fail("ran on the host"))
    assert cli.main(["run", "smoke", "--repeat", "4", "--seed", "5", "--out", str(tmp_path / "r")]) == 0
    argv = vm_calls[0]
    assert argv[argv.index("--repeat") + 1] == "4" and argv[argv.index("--seed") + 1] == "5"


def test_run_repeat_in_this_kernel_prints_medians(tmp_path, monkeypatch, capsys):
    from testbed.commands import runner
    from testbed.vm import labvm

    calls = []
    monkeypatch.setattr(labvm, "in_vm", lambda: True)
    monkeypatch.setattr(runner, "use_vm", lambda *a, **k: False)
    monkeypatch.setattr(runner, "require_root", lambda what: None)
    monkeypatch.setattr(runner, "run_scenario", _fake_runs(calls))
    assert cli.main(["run", "smoke", "--repeat", "3", "--seed", "12", "--out", str(tmp_path / "r")]) == 0
    assert [c[1] for c in calls] == [12, 13, 14]
    out = capsys.readouterr().out
    assert "unfaithful (left out of the statistics): seed-13" in out and str(tmp_path / "r" / "repeat.json") in out
    assert repeats.values(tmp_path / "r", "goodput_mbps") == pytest.approx([18.0, 20.0])


def test_sweep_and_audit_repeat_go_to_the_lab_vm_whole(tmp_path, monkeypatch):
    from testbed.commands import audit, runner, sweep
    from testbed.vm import labvm

    vm_calls = []
    monkeypatch.setattr(labvm, "in_vm", lambda: False)
    monkeypatch.setattr(labvm, "vm_kernel", lambda: ("7.0", Path("/nonexistent")))
    monkeypatch.setattr(labvm, "run", lambda argv, options=None: vm_calls.append(argv) or 0)
    monkeypatch.setattr(runner, "use_vm", lambda *a, **k: True)
    monkeypatch.setattr(sweep, "require_root", lambda what: None)
    monkeypatch.setattr(audit, "require_root", lambda what: None)
    assert cli.main(["sweep", "smoke", "--set", "rate_mbps=10,20", "--repeat", "6", "--out", str(tmp_path / "s")]) == 0
    assert cli.main(["audit", "--set", "ranks=2", "--scale", "1,2", "--repeat", "4", "--out", str(tmp_path / "a")]) == 0
    for argv, n in zip(vm_calls, ("6", "4")):
        assert argv[argv.index("--repeat") + 1] == n and argv[argv.index("--vm") + 1] == "never"
