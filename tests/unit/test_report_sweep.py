"""testbed.commands.sweep without a kernel: parameter planning and validation, the combined outputs, progress, failure
handling and the one-VM re-exec (run_scenario and the lab VM are replaced by fakes)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from testbed import cli

from testbed.vm import labvm

from testbed.commands import runner

from testbed.commands import sweep
from testbed.errors import UsageError
from testbed.scenario import get

SMOKE = get("smoke")
INCAST = get("incast")


# ---------------------------------------------------------------------------------------------- planning

def test_plan_splits_swept_and_fixed():
    pl = sweep.plan(INCAST, ["senders=2,4,8", "rounds=3"])
    assert pl.name == "senders"
    assert [p.value for p in pl.points] == [2, 4, 8]
    assert [p.dirname for p in pl.points] == ["senders=2", "senders=4", "senders=8"]
    assert all(p.params["rounds"] == 3 for p in pl.points)
    assert pl.sets == ("rounds=3",)


def test_plan_parses_units_and_keeps_the_text_in_folder_names():
    pl = sweep.plan(SMOKE, ["buffer_bytes=64K,1M"])
    assert [p.value for p in pl.points] == [64_000, 1_000_000]
    assert [p.dirname for p in pl.points] == ["buffer_bytes=64K", "buffer_bytes=1M"]


@pytest.mark.parametrize("sets, words", [
    ([], "comma list"),
    (["rate_mbps=10"], "comma list"),
    (["rate_mbps=10,20", "duration_s=1,2"], "only one parameter"),
    (["rate_mbps=10,,20"], "empty value"),
    (["rate_mbps=10,20,10"], "repeated"),
    (["buffer_bytes=64K,64000"], "same value"),
    (["rate_mbps=10,20", "rate_mbps=30"], "more than once"),
    (["nosuch=1,2"], "unknown parameter"),
    (["rate_mbps=10,20,-5"], "rate_mbps"),       # the third point is bad: refused before the first runs
    (["rate_mbps"], "name=value"),
    (["red_min_bytes=10000,50000"], "red_min_bytes=50000"),  # scenario validation names the point
])
def test_plan_refuses(sets, words):
    with pytest.raises(UsageError) as e:
        sweep.plan(SMOKE, sets)
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_cli_bad_sweep_is_one_line_exit_2(capsys):
    for argv in (["sweep", "smoke", "--set", "rate_mbps=10,20,-1"], ["sweep", "smoke"],
                 ["sweep", "nosuch", "--set", "a=1,2"], ["sweep", "smoke", "--set", "rate_mbps=1,2", "--vm", "x"]):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse's own refusals
            rc = e.code
        assert rc == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, (argv, err)


# ---------------------------------------------------------------------------------------------- running (fake)

def _fake_run_scenario(calls, fail_on=None):
    def fake(scenario, params, seed, out, quiet=False):
        calls.append((scenario.name, dict(params), seed, Path(out)))
        if fail_on is not None and params["rate_mbps"] == fail_on:
            raise RuntimeError("the fake fabric broke")
        out = Path(out)
        out.mkdir(parents=True)
        summary = {"rate_mbps": params["rate_mbps"], "goodput_mbps": params["rate_mbps"] * 0.9,
                   "bottleneck_drops": int(params["rate_mbps"] // 10), "tcp_retrans_segs": 3,
                   "fidelity_ok": True, "note": "text is left out", "nothing": None}
        (out / "manifest.json").write_text(json.dumps({"scenario": scenario.name, "params": params, "seed": seed,
                                                       "complete": True}))
        (out / "summary.json").write_text(json.dumps(summary))
        return summary
    return fake


def test_run_sweep_writes_points_table_markdown_and_plots(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(runner, "run_scenario", _fake_run_scenario(calls))
    pl = sweep.plan(SMOKE, ["rate_mbps=10,20,40", "duration_s=1"])
    df = sweep.run_sweep(pl, tmp_path, seed=7, quiet=True)
    assert [c[1]["rate_mbps"] for c in calls] == [10.0, 20.0, 40.0]
    assert all(c[2] == 7 and c[1]["duration_s"] == 1.0 for c in calls)
    assert [c[3] for c in calls] == [tmp_path / "rate_mbps=10", tmp_path / "rate_mbps=20", tmp_path / "rate_mbps=40"]

    table = pd.read_csv(tmp_path / "sweep.csv")
    assert list(table.columns[:3]) == ["rate_mbps", "run_dir", "complete"]
    assert list(table["rate_mbps"]) == [10.0, 20.0, 40.0]
    assert list(table["goodput_mbps"]) == pytest.approx([9.0, 18.0, 36.0])
    assert list(table["bottleneck_drops"]) == [1, 2, 4]
    assert list(table["fidelity_ok"]) == [1, 1, 1]
    assert "note" not in table.columns and "nothing" not in table.columns
    assert df.shape[0] == 3
    for metric in ("goodput_mbps", "bottleneck_drops", "tcp_retrans_segs"):
        assert (tmp_path / f"sweep_{metric}.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "sweep_round_ms_p99.png").exists()  # not a metric of these points
    md = (tmp_path / "sweep.md").read_text()
    assert "| rate_mbps | run_dir |" in md and "](sweep_goodput_mbps.png)" in md
    err = capsys.readouterr().err
    assert "[1/3] rate_mbps=10" in err and "[3/3] rate_mbps=40" in err and "left" in err


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(runner, "run_scenario", _fake_run_scenario(calls, fail_on=20.0))
    df = sweep.run_sweep(sweep.plan(SMOKE, ["rate_mbps=10,20,40"]), tmp_path, quiet=True)
    assert len(calls) == 3
    assert list(df["complete"]) == [True, False, True]
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert pd.isna(table.loc[1, "goodput_mbps"])
    assert "the fake fabric broke" in capsys.readouterr().err


def test_interrupt_keeps_the_finished_points(tmp_path, monkeypatch):
    calls = []
    fake = _fake_run_scenario(calls)

    def interrupting(scenario, params, seed, out, quiet=False):
        if params["rate_mbps"] == 40.0:
            raise KeyboardInterrupt
        return fake(scenario, params, seed, out, quiet)

    monkeypatch.setattr(runner, "run_scenario", interrupting)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(sweep.plan(SMOKE, ["rate_mbps=10,20,40"]), tmp_path, quiet=True)
    assert list(pd.read_csv(tmp_path / "sweep.csv")["rate_mbps"]) == [10.0, 20.0]


def test_string_parameter_sweep_plots_categories(tmp_path, monkeypatch):
    calls = []
    fake = _fake_run_scenario(calls)
    monkeypatch.setattr(runner, "run_scenario", fake)
    sweep.run_sweep(sweep.plan(SMOKE, ["cc=cubic,reno"]), tmp_path, quiet=True)
    assert list(pd.read_csv(tmp_path / "sweep.csv")["cc"]) == ["cubic", "reno"]
    assert (tmp_path / "sweep_goodput_mbps.png").exists()


# ---------------------------------------------------------------------------------------------- where it runs

def _no_root(monkeypatch):
    monkeypatch.setattr(sweep, "require_root", lambda what: None)


def test_missing_capability_runs_the_whole_sweep_in_one_vm(tmp_path, monkeypatch, capsys):
    _no_root(monkeypatch)
    vm_calls = []
    monkeypatch.setattr(labvm, "in_vm", lambda: False)
    monkeypatch.setattr(labvm, "vm_kernel", lambda: ("7.0", Path("/nonexistent")))
    monkeypatch.setattr(labvm, "run", lambda argv, options=None: vm_calls.append(argv) or 0)
    monkeypatch.setattr(runner, "missing_capabilities", lambda needs: ["qdisc:red+ecn"])
    monkeypatch.setattr(runner, "run_scenario", lambda *a, **k: pytest.fail("ran on the host"))
    rc = cli.main(["sweep", "smoke", "--set", "rate_mbps=10,20,40", "--set", "ecn=false", "--seed", "3",
                   "--out", str(tmp_path / "s")])
    assert rc == 0
    assert len(vm_calls) == 1
    argv = vm_calls[0]
    assert argv[1:4] == ["-m", "testbed.cli", "sweep"]
    assert argv[4] == "smoke"
    assert argv[argv.index("--out") + 1] == str(tmp_path / "s")
    assert argv[argv.index("--vm") + 1] == "never"
    assert argv[argv.index("--seed") + 1] == "3"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--set"] == ["rate_mbps=10,20,40", "ecn=false"]
    assert "one lab VM" in capsys.readouterr().err


def test_vm_never_without_capability_refuses(tmp_path, monkeypatch, capsys):
    _no_root(monkeypatch)
    monkeypatch.setattr(labvm, "in_vm", lambda: False)
    monkeypatch.setattr(runner, "missing_capabilities", lambda needs: ["qdisc:red+ecn"])
    assert cli.main(["sweep", "smoke", "--set", "rate_mbps=10,20", "--vm", "never", "--out", str(tmp_path)]) == 2
    assert "qdisc:red+ecn" in capsys.readouterr().err


def test_in_the_vm_it_runs_the_points_here(tmp_path, monkeypatch, capsys):
    _no_root(monkeypatch)
    calls = []
    monkeypatch.setattr(labvm, "in_vm", lambda: True)
    monkeypatch.setattr(runner, "missing_capabilities", lambda needs: [])
    monkeypatch.setattr(runner, "run_scenario", _fake_run_scenario(calls))
    assert cli.main(["sweep", "smoke", "--set", "rate_mbps=10,20", "--vm", "never", "--out", str(tmp_path),
                     "--quiet"]) == 0
    assert len(calls) == 2
    out = capsys.readouterr().out
    assert "sweep over rate_mbps" in out and str(tmp_path / "sweep.csv") in out


def test_not_root_is_refused_after_validation(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert cli.main(["sweep", "smoke", "--set", "rate_mbps=10,20", "--out", str(tmp_path / "x")]) == 2
    assert "root" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
