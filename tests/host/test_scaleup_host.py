"""Servers with several GPUs on the fabric (host kernel): 2 ranks per host talk over the host's scale-up domain
(its loopback, shaped), and NCCL's hierarchical all-reduce beats the flat ring on the same hosts because only a
slice per rail crosses the fabric; busbw follows the nccl-tests factor; a slow scale-up domain makes the
hierarchical algorithm slow (the shaper is real)."""

from __future__ import annotations

import os

import pytest

from testbed.commands.runner import run_scenario
from testbed.scenario import get

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")


def allreduce(tmp_path, name, algorithm, seed=1, **kw):
    sc = get("collective")
    p = {x.name: x.default for x in sc.params}
    p.update(collective="allreduce", algorithm=algorithm, gpus_per_host=2, ranks=4, size="1M", iterations=4,
             timeout_s=120.0)
    p.update(kw)
    sc.validate(p)
    return run_scenario(sc, p, seed, tmp_path / name, quiet=True)


def test_hierarchical_allreduce_beats_the_flat_ring_on_servers_of_two(tmp_path):
    runs = {alg: [allreduce(tmp_path, f"{alg}{i}", alg, seed=1 + i) for i in range(2)]
            for alg in ("ring", "hierarchical")}
    p50 = {alg: [s["cct_ms_p50"] for s in rs] for alg, rs in runs.items()}
    print(p50)
    for rs in runs.values():
        for s in rs:
            assert s["data_verified"] is True and s["gpus_per_host"] == 2 and s["hosts"] == "h1,h1,h2,h2", s
            # nccl-tests: busbw = algbw x 2(n-1)/n for an all-reduce, whatever the algorithm
            assert s["busbw_gbps"] == pytest.approx(s["algbw_gbps"] * 2 * 3 / 4, rel=1e-9)
    # per host NIC the fabric carries 1.5 MB (flat ring) vs 1.0 MB (hierarchical) per 1 MB all-reduce;
    # measured: ring 815-847 ms, hierarchical 507-509 ms (0.6x)
    assert max(p50["hierarchical"]) < 0.85 * min(p50["ring"]), p50


def test_the_scale_up_domain_is_shaped(tmp_path):
    fast = allreduce(tmp_path, "fast", "hierarchical", size="256K", scaleup_rate_mbps=400.0)
    slow = allreduce(tmp_path, "slow", "hierarchical", size="256K", scaleup_rate_mbps=2.0)
    print(fast["cct_ms_p50"], slow["cct_ms_p50"])
    assert fast["data_verified"] and slow["data_verified"]
    # at 2 Mbit/s the intra-server reduce-scatter and all-gather (2 x 2 x 128 KiB over one loopback) take ~2 s
    assert slow["cct_ms_p50"] > 3 * fast["cct_ms_p50"] and slow["cct_ms_p50"] > 1000, (fast, slow)


def parallel(tmp_path, name, **kw):
    sc = get("collective")
    p = {x.name: x.default for x in sc.params}
    p.update(ranks=8, gpus_per_host=2, tp=2, iterations=3, timeout_s=180.0, model_params=250_000,
             model_layers=2, model_hidden=256, model_tokens=64, micro_batches=1)
    p.update(kw)
    sc.validate(p)
    return run_scenario(sc, p, 1, tmp_path / name, quiet=True)


def test_tp_inside_a_server_beats_tp_across_leaves(tmp_path):
    """tp=2, dp=4 on 4 servers of 2 GPUs: TP groups inside a server (rank order tp-dp) against the same job with its
    TP groups strided across servers and leaves (dp-tp): the TP all-reduces leave the 200 Mbit/s scale-up domain
    for the 20 Mbit/s fabric and the step slows; the summary splits communication per dimension."""
    inside = parallel(tmp_path, "inside", rank_order="tp-dp")
    across = parallel(tmp_path, "across", rank_order="dp-tp")
    keys = ("step_ms_p50", "comm_ms_tp", "comm_ms_dp", "comm_fraction_tp", "comm_fraction_dp")
    print({k: (inside.get(k), across.get(k)) for k in keys})
    for s in (inside, across):
        assert s["data_verified"] is True and s["comm_ms_tp"] > 0 and s["comm_ms_dp"] > 0, s
        assert 0 < s["comm_fraction_tp"] + s["comm_fraction_dp"] <= 1.0 + 1e-9, s
    assert across["comm_ms_tp"] > 2 * inside["comm_ms_tp"], (inside, across)
    assert across["step_ms_p50"] > 1.15 * inside["step_ms_p50"], (inside, across)


def test_an_expert_parallel_job_with_skew_runs_verified(tmp_path):
    s = parallel(tmp_path, "moe", ranks=4, gpus_per_host=1, tp=1, ep=2, experts=4, topk=2, moe_skew=1.5)
    print({k: s.get(k) for k in ("step_ms_p50", "comm_ms_ep", "comm_ms_dp", "comm_fraction_ep")})
    assert s["data_verified"] is True and s["comm_ms_ep"] > 0 and s["comm_ms_dp"] > 0, s
    assert "comm_ms_tp" not in s


def test_a_pipeline_parallel_job_splits_its_communication_three_ways(tmp_path):
    s = parallel(tmp_path, "pp", pp=2)  # 8 ranks = tp 2 x dp 2 x pp 2; a layer per stage
    print({k: s.get(k) for k in ("step_ms_p50", "comm_ms_tp", "comm_ms_pp", "comm_ms_dp")})
    assert s["data_verified"] is True and all(s[f"comm_ms_{d}"] > 0 for d in ("tp", "pp", "dp")), s
    # per rank the three dimensions' ops are its whole communication, inside its steps
    assert s["comm_fraction_tp"] + s["comm_fraction_pp"] + s["comm_fraction_dp"] <= 1.0 + 1e-9, s
