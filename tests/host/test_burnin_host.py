"""`testbed burnin` on the host kernel (run under the shared lock): the default fabric (2 spines x 2 leaves x 2 hosts
at 10 Mbit/s) is called healthy, and each injected fault is named, with nothing else named beside it.

False positives: none over the 9 clean batteries run on this code (this test twice, seeds 1-3, and 3 from the CLI,
seeds 4-6; about 44 checks each), and nothing named beside the culprit in the 6 fault batteries (these tests and the
same faults from the CLI). Measured spread of the clean runs: host rates 8.999-9.032 Mbit/s, path rates
8.996-9.034 Mbit/s (paced at 9), compute task 34.7-38.8 ms; the floors (15% for rates, 60% for times) sit far
outside it, and the faults land far past them (a path at 2.4 Mbit/s, a task at 197 ms against 35.7). One false
positive seen since, in a CI run: a host's p99 of 40 pings at 2.08 ms (one scheduling stall; peers 0.04 ms) against
the old 2 ms floor, which is now 5 ms. Three clean
runs, not one, because a false positive is what this file guards against. Each battery takes about 18 s on this
2-CPU machine (fabric build included); the four tests took 112 s.

Lab 12's two runs are two of these batteries (the default fabric, seed 1: healthy, and with spine1's port towards
leaf2 at 0.25), as the `burnin` scenario: CI runs the lab here, once, through the lab driver (`lab run 12 --repeat
1`), and these tests' checks read its folders (burnin.csv, health.json, burnin.md) instead of running the same two
batteries again from the CLI; the lab's own check (tests/labdrive.py) reads them too. The CLI's exit status and
printed verdict are checked on the other batteries (clean seeds 2-3, the host faults). Measured (2026-12-06, 2
passes): lab 12's test 36-38 s and the two clean batteries 36-37 s, where the three clean and the slow-port tests
took 56 + 21 s and lab 12 once 36 s in test_labs_host.py. Two false positives seen that day, with other developers'
work on the machine: a host's compute task at 68-70 ms against its peers' 40 (h4 in clean seed 3 from the CLI, on
the code before this change; h2 in lab 12's degraded run), past the 60% floor.

The three host faults (h2's MTU, h3's congestion control, h4's CPU throttle) share one battery: each is named on
its own host and no host or link beside them, as in the two batteries they took before (the battery costs its
fabric and its rounds, not its faults). Measured (2026-12-06, host kernel, shared machine): the two batteries
19.3-19.6 + 22.5 s (2 passes), the one battery 20.8-21.0 s (3 passes); in each of the 3, h4's task 203-206 ms against
its peers' 42-66 (3.1-4.9x, the bar 1.6x) and nothing flagged but h2's MTU, h3's reno and h4's task.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.labdrive import host_lab, run_once

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parent.parent.parent


def burnin(out: Path, *args: str) -> tuple[int, dict, list[dict], str]:
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "burnin", "--vm", "never", "--quiet", "--out", str(out),
                        *args], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return (r.returncode, *read(out), r.stdout)


def read(out: Path) -> tuple[dict, list[dict]]:
    """A battery's health.json and burnin.csv rows (from `testbed burnin` or a `burnin` scenario run)."""
    doc = json.loads((out / "health.json").read_text())
    with open(out / "burnin.csv") as fh:
        rows = list(csv.DictReader(fh))
    return doc, rows


def flagged(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["target"], r["metric"]): r for r in rows if r["verdict"] != "ok"}


def assert_healthy(seed: int, doc: dict, rows: list[dict]) -> None:
    """Every host and link ok, no row flagged, every kind of check made."""
    assert flagged(rows) == {}, (seed, flagged(rows))
    assert doc["healthy"] is True
    assert all(v["ok"] for v in doc["hosts"].values()) and all(v["ok"] for v in doc["links"].values())
    metrics = {r["metric"] for r in rows}
    assert {"tx_mbps", "retrans_pct", "rtt_ms_p50", "cpu_task_ms", "mtu_bytes", "congestion_control",
            "path_mbps", "cct_vs_bound"} <= metrics
    assert len({r["target"] for r in rows if r["metric"] == "path_mbps"}) == 4  # 2 leaf pairs x 2 spines


def assert_slow_port_named(doc: dict, rows: list[dict]) -> None:
    """Only the path through spine1's slow port is slow; its link spine1-leaf2 is named, no host is."""
    bad = flagged(rows)
    assert doc["healthy"] is False
    assert ("leaf1>spine1>leaf2", "path_mbps") in bad
    assert float(bad[("leaf1>spine1>leaf2", "path_mbps")]["value"]) < 0.4 * 10
    assert {t for t, _ in bad} <= {"leaf1>spine1>leaf2", "allreduce fabric"}, bad
    bad_links = {name for name, v in doc["links"].items() if not v["ok"]}
    assert bad_links == {"leaf2-spine1"}, doc["links"]
    assert all(v["ok"] for v in doc["hosts"].values())


def no_workers_left() -> None:
    """The CPU workers (one per host, in its namespace) are gone with the fabric."""
    workers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).count("x += i * i")]
    assert workers == []


def test_lab_12_healthy_and_slow_spine_port_batteries(tmp_path):
    """Lab 12 once (its driver, seed 1): the healthy battery flags nothing (the first of the three clean batteries)
    and the degraded one (spine1's port towards leaf2 at a quarter of its rate) names the link spine1-leaf2 and no
    host; every statement of the lab gets its metric."""
    lab = host_lab("12")
    run_once(lab, tmp_path / "lab")
    healthy, degraded = tmp_path / "lab" / "healthy" / "seed-1", tmp_path / "lab" / "degraded" / "seed-1"
    assert_healthy(1, *read(healthy))
    assert "**Verdict: healthy**" in (healthy / "burnin.md").read_text()
    assert_slow_port_named(*read(degraded))
    assert "- link leaf2-spine1: " in (degraded / "burnin.md").read_text()
    no_workers_left()


def test_a_healthy_fabric_flags_nothing(tmp_path):
    """The two other clean batteries (seeds 2-3; seed 1 is lab 12's healthy run), from the CLI: exit 0, every host
    and link ok, no row flagged."""
    for seed in (2, 3):
        rc, doc, rows, out = burnin(tmp_path / f"clean-{seed}", "--seed", str(seed))
        assert_healthy(seed, doc, rows)
        assert rc == 0 and "burn-in: healthy" in out
    no_workers_left()


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_mis_set_hosts_and_a_cpu_throttled_host_are_each_named_and_nothing_beside_them(tmp_path):
    """One battery, three host faults (two batteries before, 19 + 22 s in CI; the battery's fabric build and its
    rounds are the cost, not the faults): host-config gives h2 a link MTU of 1000 and h3 reno where the fabric runs
    its default, both named as drift; slow-host holds h4 at 20% of a CPU, so its compute task takes several times
    its peers' (h1-h3: their CPUs are not touched). Each host is named for its own fault and no other's, no host
    beside them, and no link: a slow host is not taken for a bad link."""
    rc, doc, rows, out = burnin(tmp_path / "hosts", "--fault", "host-config h2 at_s=0 mtu_bytes=1000",
                                "--fault", "host-config h3 cc=reno", "--fault", "slow-host h4 at_s=0 cpu_fraction=0.2")
    bad = flagged(rows)
    print({k: (r["value"], r["peers_median"], r["verdict"]) for k, r in bad.items()})
    assert rc == 1
    assert bad[("h2", "mtu_bytes")]["value"] == "1000" and bad[("h2", "mtu_bytes")]["verdict"] == "drift"
    assert bad[("h3", "congestion_control")]["value"] == "reno"
    assert ("h4", "cpu_task_ms") in bad
    r = bad[("h4", "cpu_task_ms")]
    assert float(r["value"]) > 1.6 * float(r["peers_median"])
    # each fault on its own host only: no other host's setting drifts, no other host's task is slow
    assert {t for t, m in bad if m in ("mtu_bytes", "congestion_control")} <= {"h2", "h3"}, bad
    assert {t for t, m in bad if m == "cpu_task_ms"} == {"h4"}, bad
    assert {h for h, v in doc["hosts"].items() if not v["ok"]} == {"h2", "h3", "h4"}
    assert all(v["ok"] for v in doc["links"].values()), doc["links"]
    # one part per named host, its reasons joined: h2's MTU may come with what it cost its flows (seen on a CI machine:
    # another reason first), so the reason is looked for in h2's line, not at its start
    verdict = next(ln for ln in out.splitlines() if ln.startswith("burn-in: "))
    named = dict(part.split(": ", 1) for part in verdict.removeprefix("burn-in: ").split(" | "))
    assert "mtu_bytes is 1000" in named["host h2"] and "congestion_control is reno" in named["host h3"], out
    assert "cpu_task_ms" in named["host h4"], out
