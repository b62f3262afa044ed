"""Servers with several GPUs on the fabric (host kernel): 2 ranks per host talk over the host's scale-up domain
(its loopback, shaped), and NCCL's hierarchical all-reduce beats the flat ring on the same hosts because only a
slice per rail crosses the fabric; busbw follows the nccl-tests factor; a slow scale-up domain makes the
hierarchical algorithm slow (the shaper is real)."""

from __future__ import annotations

import os

import pytest

from analysis import stats
from analysis.dimensions import dimension_of
from analysis.load import load_run
from analysis.metrics import op_table, step_times
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


def op_cct_ms(run_dir) -> list[float]:
    """Each measured all-reduce's completion time (first rank's start to last rank's end), in ms."""
    return list(op_table(load_run(run_dir).ops)["cct_s"] * 1e3)


def said(d: stats.Difference, a: list[float], b: list[float]) -> str:
    return (f"{d.a.text()} vs {d.b.text()}; ratio {d.ratio:.2f} [{d.ratio_low:.2f}, {d.ratio_high:.2f}], "
            f"p {d.p_value:.2g}: {d.verdict}; A {sorted(round(x) for x in a)}, B {sorted(round(x) for x in b)}")


def test_hierarchical_allreduce_beats_the_flat_ring_on_servers_of_two(tmp_path):
    """The 4 ops of each of 2 seeded runs a side (8 against 8) compared by analysis.stats.compare (rank test and the
    ratio of medians' bootstrap interval), not the runs' p50s. Measured (host kernel, 2-CPU machine shared with other
    developers' runs, 2 passes): op CCT hierarchical 501-537 ms, ring 761-873 ms; ratio 0.61 [0.60, 0.66] and
    0.65 [0.64, 0.67], p 0.00016 both times (every op of one side below every op of the other; the runs before:
    p50 507-509 against 815-847 ms). A false failure
    needs the ratio of medians to move from ~0.6 past 0.85 or half the ops to swap sides: with a spread of a few
    percent a side, far rarer than 1 in 100."""
    runs = {alg: [allreduce(tmp_path, f"{alg}{i}", alg, seed=1 + i) for i in range(2)]
            for alg in ("ring", "hierarchical")}
    p50 = {alg: [s["cct_ms_p50"] for s in rs] for alg, rs in runs.items()}
    print(p50)
    for rs in runs.values():
        for s in rs:
            assert s["data_verified"] is True and s["gpus_per_host"] == 2 and s["hosts"] == "h1,h1,h2,h2", s
            # nccl-tests: busbw = algbw x 2(n-1)/n for an all-reduce, whatever the algorithm
            assert s["busbw_gbps"] == pytest.approx(s["algbw_gbps"] * 2 * 3 / 4, rel=1e-9)
    # per host NIC the fabric carries 1.5 MB (flat ring) vs 1.0 MB (hierarchical) per 1 MB all-reduce
    cct = {alg: [x for i in range(2) for x in op_cct_ms(tmp_path / f"{alg}{i}")] for alg in runs}
    d = stats.compare(cct["hierarchical"], cct["ring"])
    print("hierarchical vs ring op CCT:", said(d, cct["hierarchical"], cct["ring"]))
    assert d.verdict == "A < B" and d.ratio_high < 0.85, d


def test_the_scale_up_domain_is_shaped(tmp_path):
    """The 4 ops a side compared by analysis.stats.compare. Measured (host kernel, shared machine, 2 passes):
    2316-3007 ms at 2 Mbit/s against 111-131 ms at 400 Mbit/s, ratio 26.6 [26.0, 27.1] and 20.5 [18.6, 21.4]. 4 against
    4 is the fewest a rank test can decide (p 0.029 needs every slow op above every fast one), which a 26x gap set by
    the shaper's rate gives every time; the asserted ratio (3) sits far under it."""
    fast = allreduce(tmp_path, "fast", "hierarchical", size="256K", scaleup_rate_mbps=400.0)
    slow = allreduce(tmp_path, "slow", "hierarchical", size="256K", scaleup_rate_mbps=2.0)
    assert fast["data_verified"] and slow["data_verified"]
    cct = {name: op_cct_ms(tmp_path / name) for name in ("slow", "fast")}
    d = stats.compare(cct["slow"], cct["fast"])
    print("2 vs 400 Mbit/s scale-up op CCT:", said(d, cct["slow"], cct["fast"]))
    # at 2 Mbit/s the intra-server reduce-scatter and all-gather (2 x 2 x 128 KiB over one loopback) take ~2 s
    assert d.verdict == "A > B" and d.ratio_low > 3 and d.a.median > 1000, d


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
    for the 20 Mbit/s fabric and the step slows; the summary splits communication per dimension.

    Compared as samples (analysis.stats.compare), not one run's numbers against the other's: the TP ops' times
    (8 ranks x 6 steps x 8 TP ops a side) and the 6 steps a side (3 before: a 3 vs 3 rank test can never reach
    p < 0.05; 6 cost ~5 s more). Measured (host kernel, shared machine, 3 passes): TP op median 106, 76 and 60 ms
    across against 5.2 ms inside (ratio 20.4, 14.7, 11.6, low ends >= 11.2); steps 777-1223 ms across against
    673-692 ms inside, ratio 1.71 [1.63, 1.76], 1.49 [1.44, 1.51], 1.18 [1.14, 1.28], p 0.0022 each time (complete
    separation). The across side's steps move with the fabric's load from pass to pass (median 801-1166 ms), so the
    step assertion is the verdict alone (p < 0.05, up to 5 of the 36 pairs out of order, and the ratio's interval
    above 1; a low end of 1.15 failed the third pass at 1.14) and the mechanism's size is asserted on the TP ops
    (ratio low end > 2 against >= 11 measured). The closest pass kept 85 ms between the sides: a false failure
    needs several across steps to fall into the inside range, rarer than 1 in 100 on 3 passes, though thin."""
    inside = parallel(tmp_path, "inside", rank_order="tp-dp", iterations=6)
    across = parallel(tmp_path, "across", rank_order="dp-tp", iterations=6)
    keys = ("step_ms_p50", "comm_ms_tp", "comm_ms_dp", "comm_fraction_tp", "comm_fraction_dp")
    print({k: (inside.get(k), across.get(k)) for k in keys})
    for s in (inside, across):
        assert s["data_verified"] is True and s["comm_ms_tp"] > 0 and s["comm_ms_dp"] > 0, s
        assert 0 < s["comm_fraction_tp"] + s["comm_fraction_dp"] <= 1.0 + 1e-9, s
    runs = {name: load_run(tmp_path / name).ops for name in ("across", "inside")}
    tp = {n: list((o["end_s"] - o["start_s"])[o["op"].map(dimension_of) == "tp"] * 1e3) for n, o in runs.items()}
    d = stats.compare(tp["across"], tp["inside"])
    print("TP op time across vs inside:", d.a.text(), "vs", d.b.text(), f"ratio {d.ratio:.2f} "
          f"[{d.ratio_low:.2f}, {d.ratio_high:.2f}], p {d.p_value:.2g}: {d.verdict}")
    assert d.verdict == "A > B" and d.ratio_low > 2, d
    step = {n: list(step_times(o)["step_s"] * 1e3) for n, o in runs.items()}
    d = stats.compare(step["across"], step["inside"])
    print("step across vs inside:", said(d, step["across"], step["inside"]))
    assert d.verdict == "A > B", d


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
