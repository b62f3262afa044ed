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
repeated runs: testbed compare on --repeat folders, docs/analysis.md)."""

from __future__ import annotations

import os

import pytest

from analysis.load import load_run
from tests.fabricdrive import uplink_share
from testbed.faults import plan as faultplan
from testbed.commands.runner import run_scenario
from testbed.scenario import get

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")

COLL = get("collective")
SLOW = [faultplan.parse(f"slow-port {leaf}:spine1 at_s=0 fraction=0.1") for leaf in ("leaf1", "leaf2")]


def run(tmp_path, lb: str) -> dict:
    p = {x.name: x.default for x in COLL.params}
    p.update(collective="alltoall", size="128K", iterations=6, warmup=1, spines=2, leaves=2, hosts_per_leaf=3,
             ranks=6, host_rate_mbps=10.0, fabric_rate_mbps=10.0, buffer_bytes=256_000, sample_interval_ms=20,
             load_balancing=lb)
    COLL.validate(p)
    return run_scenario(COLL, p, 1, tmp_path / lb, quiet=True, faults=SLOW)


def test_adaptive_balancing_routes_around_a_slow_spine_and_letflow_reorders(tmp_path):
    """Measured (host kernel, shared 2-CPU machine, other developers' runs alongside, 2 runs of each): share of the
    uplink bytes on the slow spine1: adaptive 0.014 and 0.016, LetFlow 0.37 and 0.41, ECMP 0.46 and 0.28 (by the
    hash); retransmissions LetFlow 314-381 against ECMP's 22-39. (The op times of these runs: ECMP p99 1758 and
    774 ms, adaptive 385 and 382: ECMP's p99 moved 2.3x between two runs of one configuration.) The bands sit
    far from every measured value (adaptive: 0.18 below its band's edge, 0.35 below LetFlow's lowest; LetFlow 0.17
    above 0.2). Two runs cannot measure a 1-in-100 tail: the estimate rests on the mechanism, ~1150 flowlets each up
    a random spine, which keeps LetFlow's share near 0.4 unless the balancer breaks (the runs differ by 0.04)."""
    runs = {lb: run(tmp_path, lb) for lb in ("ecmp", "adaptive", "flowlet")}
    share = {lb: uplink_share(tmp_path / lb, "spine1")[0] for lb in runs}
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
    bal = load_run(tmp_path / "adaptive").balancing
    assert sorted(bal["node"]) == ["leaf1", "leaf2"] and (bal["packets"] > 0).all()
    # adaptive steers the flowlets to the fast spine (at a tenth of the rate it should carry about a tenth of the
    # bytes); LetFlow's random choice puts about half of them on the slow spine
    assert share["adaptive"] < 0.2, share
    assert 0.2 < share["flowlet"] < 0.7, share
    # LetFlow's random choice reorders: flowlets leave a slow queue for a fast path within a gap shorter than its delay
    assert letflow["tcp_retrans_segs"] > 2 * max(10, ecmp["tcp_retrans_segs"]), runs
