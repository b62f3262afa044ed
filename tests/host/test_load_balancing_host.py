"""Flowlet and adaptive load balancing on the host kernel (cls_bpf + clsact + HTB: no lab VM needed): a degraded
spine (both leaves' uplinks to spine1 at a tenth of their rate) under an all-to-all of 6 ranks across two leaves,
with ECMP, with LetFlow (a random uplink per flowlet) and with the adaptive, CONGA-style choice (the path with the
least delay for a newcomer: the uplink's recent bytes at its measured rate, and the queues on the path).

Measured on this 2-CPU machine (3 runs, 10 Mbit/s, 128 kB all-to-all, 10 ms flowlet gap): ECMP op p50 1011-1607 ms
(p99 1190-1755), adaptive 330-335 ms (p99 380-1049: the first ops go by before the slow uplink's rate is measured),
LetFlow 967-1205 ms with 295-411 retransmissions against ECMP's 9-31: its flowlets switch paths at gaps shorter than
the slow queue's delay, so they arrive out of order, and half of them still land on the slow spine. (At a quarter of
the rate, 8 runs: ECMP p50 445-713, adaptive 196-347, the ratio 0.30-0.78 in one run: too close to assert on.)"""

from __future__ import annotations

import os

import pytest

from analysis.load import load_run
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
    runs = {lb: run(tmp_path, lb) for lb in ("ecmp", "adaptive", "flowlet")}
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
    # adaptive steers the flowlets to the fast spine: a much shorter op than ECMP, whose hashed flows wait on spine1
    assert adaptive["cct_ms_p50"] < 0.6 * ecmp["cct_ms_p50"], runs
    assert adaptive["cct_ms_p99"] < ecmp["cct_ms_p99"], runs
    # LetFlow's random choice reorders: flowlets leave a slow queue for a fast path within a gap shorter than its delay
    assert letflow["tcp_retrans_segs"] > 2 * max(10, ecmp["tcp_retrans_segs"]), runs
