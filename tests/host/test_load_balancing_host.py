"""Flowlet and adaptive load balancing on the host kernel (cls_bpf + clsact + HTB: no lab VM needed): a degraded
spine (both leaves' uplinks to spine1 at a tenth of their rate) under an all-to-all of 6 ranks across two leaves,
with ECMP, with LetFlow (a random uplink per flowlet) and with the adaptive, CONGA-style choice (the path with the
least delay for a newcomer: the uplink's recent bytes at its measured rate, and the queues on the path).

Measured on this 2-CPU machine (3 runs, 10 Mbit/s, 128 kB all-to-all, 10 ms flowlet gap): ECMP op p50 1011-1607 ms
(p99 1190-1755), adaptive 330-335 ms (p99 380-1049: the first ops go by before the slow uplink's rate is measured),
LetFlow 967-1205 ms with 295-411 retransmissions against ECMP's 9-31: its flowlets switch paths at gaps shorter than
the slow queue's delay, so they arrive out of order, and half of them still land on the slow spine. (At a quarter of
the rate, 8 runs: ECMP p50 445-713, adaptive 196-347, the ratio 0.30-0.78 in one run: too close to assert on.)

Asserted on what the switches' kernel counters show, one run each: the share of the leaves' uplink bytes that went
up the slow spine (queues.csv sent_bytes), the reordering retransmissions, the balancers' flowlet counts; never one
run's op time against another's (the adaptive p99 above overlaps ECMP's across runs; telling op times apart takes
repeated runs: testbed compare on --repeat folders, docs/analysis.md).

The three runs are lab 04's (labs/04-load-balancing: the same parameters, faults and seed), made once by the lab
driver (`lab run 4 --repeat 1`) and graded as the lab too: one set of runs serves both (CI's time budget: this test
and test_labs_host.py's lab 04 made the same three runs, 22 + 21 s in CI; measured 2026-12-06: 19.2-22.0 + 21.7-22.7
s in 2 passes before, 19.5-24.3 s in 3 passes after, every band held: adaptive's share 0.016-0.023, LetFlow's
0.39-0.44, LetFlow's retransmissions 317-433 against ECMP's 20-31)."""

from __future__ import annotations

import os

import pytest

from analysis.load import load_run
from testbed.commands import labs as classlabs
from tests.fabricdrive import uplink_share
from tests.labdrive import assert_complete_once, runs_once

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")

#: the configuration the figures below were measured with (lab 04's runs; each run's own load_balancing besides)
MEASURED = {"collective": "alltoall", "size": "128K", "iterations": 6, "warmup": 1, "spines": 2, "leaves": 2,
            "hosts_per_leaf": 3, "ranks": 6, "host_rate_mbps": 10, "fabric_rate_mbps": 10, "buffer_bytes": 256_000,
            "sample_interval_ms": 20}
SLOW = ["slow-port leaf1:spine1 at_s=0 fraction=0.1", "slow-port leaf2:spine1 at_s=0 fraction=0.1"]
#: lab 04's run names by the balancer each runs
LAB04_RUNS = {"ecmp": "ecmp", "adaptive": "adaptive", "flowlet": "letflow"}


def lab04_is_the_measured_configuration() -> None:
    """Lab 04's runs are this test's three (an edit to the lab must fail here, not move the statistics unseen)."""
    lab = classlabs.find("04")
    assert sorted(r.name for r in lab.runs) == sorted(LAB04_RUNS.values()), lab.runs
    for lb, name in LAB04_RUNS.items():
        r = next(x for x in lab.runs if x.name == name)
        sc, p, faults = classlabs.resolve_run(r)
        assert sc.name == "collective" and r.seed == 1 and p["load_balancing"] == lb, (r, p)
        assert {k: p[k] for k in MEASURED} == MEASURED, {k: p[k] for k in MEASURED}
        assert sorted(f"{f.kind} {f.target} " + " ".join(f"{k}={v:g}" for k, v in f.params) for f in faults) == SLOW


def test_adaptive_balancing_routes_around_a_slow_spine_and_letflow_reorders(tmp_path):
    """Measured (host kernel, shared 2-CPU machine, other developers' runs alongside, 2 runs of each): share of the
    uplink bytes on the slow spine1: adaptive 0.014 and 0.016, LetFlow 0.37 and 0.41, ECMP 0.46 and 0.28 (by the
    hash); retransmissions LetFlow 314-381 against ECMP's 22-39. (The op times of these runs: ECMP p99 1758 and
    774 ms, adaptive 385 and 382: ECMP's p99 moved 2.3x between two runs of one configuration.) The bands sit
    far from every measured value (adaptive: 0.18 below its band's edge, 0.35 below LetFlow's lowest; LetFlow 0.17
    above 0.2). Two runs cannot measure a 1-in-100 tail: the estimate rests on the mechanism, ~1150 flowlets each up
    a random spine, which keeps LetFlow's share near 0.4 unless the balancer breaks (the runs differ by 0.04)."""
    lab04_is_the_measured_configuration()
    lab, made = runs_once("04", tmp_path / "lab")
    assert_complete_once(lab, tmp_path / "lab")  # lab 04 as `testbed lab run 4 --repeat 1` grades it
    runs = {lb: made[name][0] for lb, name in LAB04_RUNS.items()}
    folder = {lb: made[name][1] for lb, name in LAB04_RUNS.items()}
    share = {lb: uplink_share(folder[lb], "spine1")[0] for lb in runs}
    print("share of uplink bytes on spine1:", share)
    keys = ("cct_ms_p50", "cct_ms_p99", "tcp_retrans_segs", "flowlets", "flowlet_moved_fraction")
    for lb, s in runs.items():
        print(lb, {k: s.get(k) for k in keys})
    ecmp, adaptive, letflow = runs["ecmp"], runs["adaptive"], runs["flowlet"]
    assert all(s["data_verified"] for s in runs.values())
    # the balancers ran: every op's cross-leaf flows started flowlets, and some went up another uplink than ECMP's
    for s in (adaptive, letflow):
        assert s["flowlets"] > 100 and 0.05 < s["flowlet_moved_fraction"] < 0.95, s
    assert "flowlets" not in ecmp
    bal = load_run(folder["adaptive"]).balancing
    assert sorted(bal["node"]) == ["leaf1", "leaf2"] and (bal["packets"] > 0).all()
    # adaptive steers the flowlets to the fast spine (at a tenth of the rate it should carry about a tenth of the
    # bytes); LetFlow's random choice puts about half of them on the slow spine
    assert share["adaptive"] < 0.2, share
    assert 0.2 < share["flowlet"] < 0.7, share
    # LetFlow's random choice reorders: flowlets leave a slow queue for a fast path within a gap shorter than its delay
    assert letflow["tcp_retrans_segs"] > 2 * max(10, ecmp["tcp_retrans_segs"]), runs
