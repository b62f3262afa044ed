"""A sweep with one failing point completes every point, records the failed one (complete false, its error) in
sweep.csv, in the printed table and in its progress line, and the command exits non-zero at the end.

The scenario is a fake (a testbed.scenario.Scenario whose run raises RunFailed for one value, on the smallest fabric:
h1 - s1 - h2, no traffic): this is sweep logic, not network behaviour. Everything else is real and runs as root on
this host: the Lab's run state, fabric, run directories and teardown, the sweep's outputs, and the CLI's exit status.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from mininet.topo import Topo

from testbed import cli
from testbed import scenario as scenarios
from testbed.commands import sweep
from testbed.errors import RunFailed
from testbed.params import Param

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="host tests run as root")

FAIL_AT = 2
MESSAGE = "fake: data verification failed: rank 1 got 7 expected 8"


class _Pair(Topo):
    """h1 - s1 - h2: the fabric the fake's Lab builds (nothing is sent over it)."""

    def build(self) -> None:
        s1 = self.addSwitch("s1")
        self.addLink(self.addHost("h1"), s1)
        self.addLink(self.addHost("h2"), s1)


def _run(params: dict, lab) -> dict:
    lab.progress(f"fake point rate={params['rate']}")
    torn = lab.rundir.path / "torn_down"
    lab.on_teardown(lambda: torn.write_text("yes\n"))
    if params["rate"] == FAIL_AT:
        lab.rundir.finish({"mismatches": 1})  # like collective: keep the evidence, then fail the run
        raise RunFailed(MESSAGE)
    return {"goodput_mbps": params["rate"] * 10.0, "bottleneck_drops": 0, "fidelity_ok": True}


FAKE = scenarios.Scenario(name="fake-sweep", summary="a scenario that fails at rate=2", params=[
    Param("rate", int, 1, "Mbit/s", "the swept value", min=1, max=100)], needs=[], run=_run,
    table=[("goodput_mbps", "goodput")], topology=lambda params, seed: _Pair())


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    from testbed.kernel import state

    d = tmp_path / "state"
    monkeypatch.setattr(state, "STATE_DIR", d)
    return d


def test_a_failing_point_is_recorded_and_the_sweep_completes(tmp_path, state_dir, capsys):
    out = tmp_path / "sweep"
    df = sweep.run_sweep(sweep.plan(FAKE, ["rate=1,2,3"]), out, seed=5, quiet=True)
    sweep.print_table(df, "rate")
    cap = capsys.readouterr()

    assert list(df["rate"]) == [1, 2, 3]  # every point ran, the one after the failure too
    for r in (1, 2, 3):
        assert (out / f"rate={r}" / "torn_down").read_text() == "yes\n"  # teardown ran for each, failed or not
    assert not list(state_dir.glob("*.json"))  # every run's state was dropped

    table = pd.read_csv(out / "sweep.csv")
    assert list(table["rate"]) == [1, 2, 3]
    assert [str(v) for v in table["complete"]] == ["True", "False", "True"]
    assert table.loc[1, "error"] == MESSAGE
    assert table["error"].isna()[[0, 2]].all()  # written empty for the points that finished
    assert list(table["goodput_mbps"].fillna(-1)) == [10.0, -1, 30.0]
    md = (out / "sweep.md").read_text()
    assert "false" in md and MESSAGE in md

    # the printed table: the failed point is marked, with why
    rows = {line.split("│")[1].strip(): line for line in cap.out.splitlines() if line.count("│") > 2}
    assert "false" in rows["2"] and "true" in rows["1"] and "true" in rows["3"], cap.out
    assert "complete" in cap.out and "error" in cap.out and "verification failed" in cap.out

    # the progress lines name the failed point and the reason, and the final line names it again
    failed_lines = [line for line in cap.err.splitlines() if "failed" in line]
    assert any("[2/3] rate=2 failed" in line and MESSAGE in line for line in failed_lines), cap.err
    assert "2/3 points" in cap.err and "FAILED: rate=2" in cap.err
    # the failed run's own folder keeps its evidence
    assert json.loads((out / "rate=2" / "summary.json").read_text()) == {"mismatches": 1}


def test_the_sweep_command_exits_1_after_running_every_point(tmp_path, state_dir, monkeypatch, capsys):
    monkeypatch.setattr(scenarios, "get", lambda name: FAKE)
    monkeypatch.delenv("TESTBED_IN_VM", raising=False)
    out = tmp_path / "cmd"
    rc = cli.main(["sweep", "fake-sweep", "--set", "rate=1,2,3", "--vm", "never", "--quiet", "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 1, cap.err
    assert [str(v) for v in pd.read_csv(out / "sweep.csv")["complete"]] == ["True", "False", "True"]
    assert "sweep over rate" in cap.out and str(out / "sweep.csv") in cap.out
    assert "rate=2 failed" in cap.err


def test_the_sweep_command_exits_0_when_every_point_completes(tmp_path, state_dir, monkeypatch, capsys):
    monkeypatch.setattr(scenarios, "get", lambda name: FAKE)
    monkeypatch.delenv("TESTBED_IN_VM", raising=False)
    rc = cli.main(["sweep", "fake-sweep", "--set", "rate=1,3", "--vm", "never", "--quiet", "--out",
                   str(tmp_path / "ok")])
    assert rc == 0, capsys.readouterr().err
    assert "error" not in capsys.readouterr().out  # no error column when nothing failed


def test_a_failed_run_is_one_line_and_exit_1(tmp_path, state_dir, monkeypatch, capsys):
    monkeypatch.setattr(scenarios, "get", lambda name: FAKE)
    monkeypatch.delenv("TESTBED_IN_VM", raising=False)
    rc = cli.main(["run", "fake-sweep", "--set", "rate=2", "--vm", "never", "--quiet", "--out",
                   str(tmp_path / "one")])
    err = capsys.readouterr().err
    assert rc == 1
    lines = [line for line in err.splitlines() if line.startswith("testbed:")]
    assert lines == [f"testbed: {MESSAGE}"], err
    assert "Traceback" not in err
