"""A real collective run with a straggler (host kernel): its report writes trace.json, which loads as a trace-event
document with a track per rank, and the arrival split names the straggler: its peers wait for it inside the
all-reduce, it waits for nobody, and cct_vs_bound comes apart into the late arrival and a transfer near the bound.

Checked on kernel counters and the run's own arrival times, not on a timing comparison: one run suffices (the
straggler's lateness, 2 x 100 ms of extra compute per iteration, is ~10x the ranks' arrival jitter on this machine)."""

from __future__ import annotations

import json
import os

import pytest

from analysis.load import load_run
from analysis.report import write_report
from testbed.commands.runner import run_scenario
from testbed.scenario import get

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")


def test_a_straggler_runs_trace_loads_and_names_the_late_rank(tmp_path):
    sc = get("collective")
    p = {x.name: x.default for x in sc.params}
    p.update(size="256K", iterations=4, compute_ms=100.0, stragglers="2", straggler_factor=3.0)
    sc.validate(p)
    s = run_scenario(sc, p, 1, tmp_path / "run", quiet=True)
    keys = ("cct_vs_bound", "arrival_skew_vs_bound", "transfer_vs_bound", "arrival_skew_ms_mean", "transfer_ms_mean",
            "comm_wait_fraction")
    print({k: s.get(k) for k in keys})
    assert s["data_verified"] is True
    assert s["arrival_skew_vs_bound"] + s["transfer_vs_bound"] == pytest.approx(s["cct_vs_bound"], rel=1e-6)
    assert s["arrival_skew_ms_mean"] > 150.0  # 200 ms of extra compute, less what the others spend meanwhile
    assert s["transfer_vs_bound"] < s["cct_vs_bound"] - 0.5

    write_report(tmp_path / "run")
    doc = json.loads((tmp_path / "run" / "trace.json").read_text(encoding="utf-8"))
    evs = doc["traceEvents"]
    ranks = load_run(tmp_path / "run").ops["rank"].nunique()
    threads = {e["args"]["name"]: (e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {f"rank {r}" for r in range(ranks)} <= set(threads)
    body = [e for e in evs if e["ph"] != "M"]
    assert [e["ts"] for e in body] == sorted(e["ts"] for e in body) and body[0]["ts"] >= 0
    wait_us = {name: sum(e["dur"] for e in body if e["ph"] == "X" and e["cat"] == "wait"
                         and (e["pid"], e["tid"]) == track) for name, track in threads.items()}
    print(wait_us)
    assert wait_us["rank 2"] < 0.1 * min(v for k, v in wait_us.items() if k.startswith("rank ") and k != "rank 2")
    assert any(e["ph"] == "C" and e["cat"] == "queue" for e in body)
