"""The `canary` scenario's pure parts (scenarios/canary.py, lab 14): its settings are checked before anything is
built (a bad change is one line, exit status 2, no run directory), its summary numbers (analysis.canary
.summary_numbers) say the decision as 1/0 with the ratio's interval, each name is one a lab may grade, and the
kernel read-back check (canary_change.mismatches) names what differs."""

import importlib.util
import math

import pytest

from analysis import canary as rules
from analysis.metricnames import known
from testbed import scenario as scenarios
from testbed.cli import main
from testbed.commands import canary_change, runner
from testbed.errors import UsageError
from testbed.params import resolve

SCENARIO = scenarios.get("canary")
FAST = [500.0, 510.0, 495.0, 505.0, 502.0]


def _script():
    """scenarios/canary.py as a module (testbed.scenario loads scripts by path, without registering them)."""
    spec = importlib.util.spec_from_file_location("canary_script", scenarios.SCRIPT_DIR / "canary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _p(*sets: str) -> dict:
    return resolve(SCENARIO.params, list(sets))


def test_the_default_run_is_the_harmful_change_on_a_three_packet_fabric():
    p = _p()
    assert (p["change"], p["canary"], p["buffer_bytes"], p["rto_min_ms"]) == ("rto_min_ms=200", "leaf1", 4500, 1)
    SCENARIO.validate(p)
    assert SCENARIO.needs_of(p) == ["qdisc:htb", "qdisc:bfifo"]  # the host kernel runs it


def test_a_change_of_several_keys_and_what_it_needs():
    p = _p("buffer_bytes=16000", "change=discipline=step, k_bytes=6000,ecn=1,cc=dctcp")
    change, canary, control, rule = _script().plan(p)
    assert change.values == {"discipline": "step", "k_bytes": 6000, "ecn": True, "cc": "dctcp"}
    assert (canary, control, rule.tolerance) == (["leaf1"], ["leaf2"], 1.10)
    assert "tcp:dctcp" in SCENARIO.needs_of(p)  # so `testbed run` takes it to the lab VM


@pytest.mark.parametrize("sets, says", [
    (["change=bogus=1"], "unknown key 'bogus'"),
    (["change=rto_min_ms=1"], "already has it"),
    (["change="], "give KEY=VALUE"),
    (["change=rto_min_ms"], "KEY=VALUE"),
    (["change=rto_min_ms=5,rto_min_ms=6"], "twice"),
    (["change=load_balancing=spray"], "not supported"),
    (["change=k_bytes=3000"], "no threshold"),
    (["canary=leaf9"], "no leaf 'leaf9'"),
    (["canary=leaf1,leaf2"], "no equal control"),
    (["tolerance=2"], "tolerance"),
])
def test_bad_settings_are_refused_by_validate(sets, says):
    with pytest.raises(UsageError, match=says):
        SCENARIO.validate(_p(*sets))


@pytest.mark.parametrize("sets, says", [
    (["change=bogus=1"], "unknown key 'bogus'"),
    (["change=cc=vegas"], "must be one of"),
    (["runs_per_side=3"], ">= 4"),
])
def test_a_bad_change_is_one_line_exit_2_before_anything_is_built(sets, says, capsys, tmp_path, monkeypatch):
    def built(*a, **k):
        raise AssertionError("a fabric was built for a bad change")

    monkeypatch.setattr(runner, "run_scenario", built)
    argv = ["run", "canary", *sum((["--set", s] for s in sets), []), "--vm", "never", "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()


def test_summary_numbers_of_a_roll_back_and_a_verified_roll_out():
    d = rules.decide([1400.0, 2800.0, 2200.0, 1700.0, 2100.0], FAST)
    s = rules.summary_numbers(d, None, d.action, {"canary": [230.0] * 99 + [240.0], "control": [40.0] * 100}, True)
    assert (s["rolled_back"], s["rolled_out"], s["rollout_verified"], s["readback_verified"]) == (1, 0, 0, 1)
    assert s["canary_ratio_low"] > 1 and s["canary_ratio_low"] <= s["canary_ratio"] <= s["canary_ratio_high"]
    assert (s["canary_round_ms_p99"], s["control_round_ms_p99"]) == (230.0, 40.0)  # nearest rank: 99th of 100
    assert s["canary_job_ms_median"] == 2100.0 and s["control_job_ms_median"] == 502.0

    d = rules.decide([100.0, 110.0, 105.0, 99.0, 101.0], FAST)
    v = rules.verify([104.0, 106.0], d)
    s = rules.summary_numbers(d, v, d.action, {"canary": [5.0], "control": []}, False)
    assert (s["rolled_back"], s["rolled_out"], s["rollout_verified"], s["readback_verified"]) == (0, 1, 1, 0)
    assert math.isnan(s["control_round_ms_p99"])
    failed = rules.verify([600.0], d)  # the fabric-wide check failed: rolled back after all
    s = rules.summary_numbers(d, failed, rules.ROLL_BACK, {}, True)
    assert (s["rolled_back"], s["rolled_out"], s["rollout_verified"]) == (1, 0, 0)


def test_every_summary_name_is_one_a_lab_may_grade():
    d = rules.decide(FAST, FAST)
    names = set(rules.summary_numbers(d, None, d.action, {}, True))
    names |= {f"{side}_{k}" for side in ("canary", "control") for k in ("tcp_timeouts", "port_drops")}
    names |= {"decision_log"} | {k for k, _ in SCENARIO.table}
    assert [n for n in sorted(names) if not known(n)] == []


BASE = {"buffer_bytes": 4500, "discipline": "droptail", "k_bytes": 20000, "ecn": False, "cc": "cubic",
        "rto_min_ms": 1}


def test_readback_mismatches_name_the_port_or_host_that_differs():
    found = {"leaf1:h1": {"qdisc": "bfifo", "limit": 4500}, "h1": {"rto_min_ms": [1], "tcp_ecn": 0},
             "h2": {"rto_min_ms": [1], "tcp_ecn": 2}}
    assert canary_change.mismatches(found, BASE) == []
    assert canary_change.mismatches(found, {**BASE, "rto_min_ms": 200}) == [
        "h1: rto_min [1] ms, not 200", "h2: rto_min [1] ms, not 200"]
    assert canary_change.mismatches(found, {**BASE, "buffer_bytes": 64000}) == [
        "leaf1:h1: bfifo limit 4500, not bfifo limit 64000"]
    assert canary_change.mismatches({"h3": {"rto_min_ms": [], "tcp_ecn": 1}}, {**BASE, "rto_min_ms": 200}) == [
        "h3: tcp_ecn 1, ecn False wanted"]  # no route metric: the kernel's 200 ms
    step = {**BASE, "buffer_bytes": 16000, "discipline": "step", "k_bytes": 6000, "ecn": True}
    assert canary_change.mismatches({"leaf1:h1": {"qdisc": "red", "limit": 16000}}, step) == []


@pytest.mark.parametrize("text, why", [
    ("pfc_xoff_bytes=20000", "pauses spread hop by hop"),
    ("pfc_xon_bytes=10000", "no lossless class"),
    ("load_balancing=letflow", "stays inside its leaf"),
])
def test_changes_a_slice_cannot_carry_are_refused_naming_why(text, why):
    with pytest.raises(UsageError, match=why) as e:
        canary_change.parse_changes([text], BASE)
    assert "\n" not in str(e.value)
