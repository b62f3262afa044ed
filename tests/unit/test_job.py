"""traffic.job: parsing, the job plan (compute jitter, stragglers, warm-up) and the metric math."""

from __future__ import annotations

import math

import pytest

from traffic import job as j


def seg(n=5, ops=(("allreduce", "k"),)):
    return (j.Segment(tuple(ops), n),)


def test_parse_size_and_lists():
    assert j.parse_size("1500") == 1500
    assert j.parse_size("64K") == 64_000
    assert j.parse_size("1M") == 1_000_000
    assert j.parse_size("1Mi") == 1 << 20
    assert j.parse_size("4MB") == 4_000_000
    assert j.parse_size(7) == 7
    assert j.parse_sizes("1K, 64K,1M") == [1000, 64_000, 1_000_000]
    for bad in ("0", "-5", "abc", "1.5", ""):
        with pytest.raises(j.JobError):
            j.parse_size(bad)
    with pytest.raises(j.JobError):
        j.parse_sizes("1K,,2K")
    assert j.parse_int_list("", "x") == []
    assert j.parse_int_list("1, 3", "x") == [1, 3]
    with pytest.raises(j.JobError):
        j.parse_int_list("1,a", "x")
    with pytest.raises(j.JobError):
        j.parse_int_list("1,1", "x")


def test_parse_flows():
    f = j.parse_flows("h1>h3, h2:h4", dscp=8, rate_mbps=5)
    assert [(x.src, x.dst, x.dscp, x.rate_mbps) for x in f] == [("h1", "h3", 8, 5), ("h2", "h4", 8, 5)]
    assert j.parse_flows("") == []
    for bad in ("h1", "h1>h1", ">h2"):
        with pytest.raises(j.JobError):
            j.parse_flows(bad)


def test_spec_validation():
    with pytest.raises(j.JobError, match="straggler rank 4"):
        j.JobSpec(4, seg(), stragglers=(4,))
    with pytest.raises(j.JobError, match="straggler_factor"):
        j.JobSpec(4, seg(), straggler_factor=0.5)
    with pytest.raises(j.JobError, match="jitter"):
        j.JobSpec(4, seg(), jitter=1.0)
    with pytest.raises(j.JobError):
        j.JobSpec(4, ())
    with pytest.raises(j.JobError):
        j.JobSpec(4, (j.Segment((("a", "k"),), 0),))
    assert j.JobSpec(4, seg(3) + seg(2)).iterations == 5


def test_plan_without_noise_is_flat():
    secs, slow = j.compute_plan(j.JobSpec(3, seg(4), compute_ms=20))
    assert secs == [[0.02] * 3] * 4
    assert not any(any(r) for r in slow)


def test_jitter_bounds_and_determinism():
    spec = j.JobSpec(4, seg(200), compute_ms=100, jitter=0.2, seed=11)
    a, _ = j.compute_plan(spec)
    b, _ = j.compute_plan(spec)
    assert a == b
    flat = [x for row in a for x in row]
    assert all(0.08 - 1e-12 <= x <= 0.12 + 1e-12 for x in flat)
    assert max(flat) - min(flat) > 0.03  # actually spread
    c, _ = j.compute_plan(j.JobSpec(4, seg(200), compute_ms=100, jitter=0.2, seed=12))
    assert c != a


def test_straggler_always():
    secs, slow = j.compute_plan(j.JobSpec(4, seg(10), compute_ms=50, stragglers=(1, 3), straggler_factor=3))
    for row, fl in zip(secs, slow):
        assert row == pytest.approx([0.05, 0.15, 0.05, 0.15])
        assert fl == [False, True, False, True]


def test_straggler_probability():
    secs, slow = j.compute_plan(j.JobSpec(4, seg(2000), compute_ms=10, stragglers=(2,), straggler_factor=5,
                                          straggler_prob=0.1, seed=3))
    hits = sum(fl[2] for fl in slow)
    assert 140 <= hits <= 260  # ~200 of 2000
    for row, fl in zip(secs, slow):
        assert math.isclose(row[2], 0.05 if fl[2] else 0.01)
        assert not fl[0] and not fl[1] and not fl[3]


def test_iteration_plan_warmup_and_segments():
    spec = j.JobSpec(2, (j.Segment((("a-1", "s1"),), 2), j.Segment((("a-2", "s2"),), 3)), compute_ms=5, warmup=2,
                     stragglers=(0,), straggler_factor=2)
    p = j.iteration_plan(spec)
    assert [x["iteration"] for x in p] == [-2, -1, 0, 1, 2, 3, 4]
    assert [x["record"] for x in p] == [False, False] + [True] * 5
    assert p[0]["compute_s"] == [0.005, 0.005] and p[0]["ops"] == [["a-1", "s1"]]  # warm-up: no straggler
    assert p[2]["compute_s"] == [0.01, 0.005] and p[2]["straggling"] == [0]
    assert [x["ops"][0][0] for x in p[2:]] == ["a-1", "a-1", "a-2", "a-2", "a-2"]


# ---- metrics ----

def test_nearest_rank_and_percentiles():
    v = list(range(1, 101))
    assert j.nearest_rank(v, 0.5) == 50
    assert j.nearest_rank(v, 0.99) == 99
    assert j.nearest_rank(v, 0.999) == 100
    assert j.nearest_rank([3.0], 0.99) == 3.0
    assert math.isnan(j.nearest_rank([], 0.5))
    p = j.percentiles([5, 1, 3])
    assert p["p50"] == 3 and p["max"] == 5 and p["n"] == 3 and p["mean"] == 3
    assert j.percentiles(range(10))["p99"] == 9  # p99 of 10 samples is the max


def test_cv():
    assert math.isnan(j.cv([1.0]))
    assert j.cv([2.0, 2.0, 2.0]) == 0
    assert math.isclose(j.cv([1.0, 3.0]), math.sqrt(2) / 2)


def _rows():
    # 2 ranks, 2 iterations, 1 op; start 10.0
    R = []
    for it, (s0, e0, s1, e1) in enumerate([(10.1, 10.5, 10.2, 10.6), (10.7, 11.0, 10.9, 11.2)]):
        R.append({"iteration": it, "op": "ar", "op_index": 0, "collective": "allreduce", "rank": 0, "start_s": s0,
                  "end_s": e0, "wait_s": 0.2})
        R.append({"iteration": it, "op": "ar", "op_index": 0, "collective": "allreduce", "rank": 1, "start_s": s1,
                  "end_s": e1, "wait_s": 0.1})
    return R


def test_op_cct_and_step_times():
    c = j.op_cct(_rows())
    assert [(x["iteration"], x["ranks"]) for x in c] == [(0, 2), (1, 2)]
    assert math.isclose(c[0]["cct_s"], 0.5) and math.isclose(c[1]["cct_s"], 0.5)
    st = j.step_times(_rows(), 10.0)
    assert [round(x, 6) for x in st] == [0.6, 0.6]


def test_comm_wait_fraction():
    # rank 0 steps: 0.5, 0.5; rank 1: 0.6, 0.6; waits 0.2+0.2, 0.1+0.1 -> 0.6 / 2.2
    assert math.isclose(j.comm_wait_fraction(_rows(), 10.0), 0.6 / 2.2)
    assert math.isnan(j.comm_wait_fraction([], 0.0))
    # per-rank origins: rank 1 finished its warm-up later, so its first step is shorter
    assert math.isclose(j.comm_wait_fraction(_rows(), {0: 10.0, 1: 10.2}), 0.6 / 2.0)


def test_nccl_rows_and_table():
    ccts = [{"op": "allreduce", "collective": "allreduce", "cct_s": 0.1},
            {"op": "allreduce", "collective": "allreduce", "cct_s": 0.3},
            {"op": "ag", "collective": "allgather", "cct_s": 0.4}]
    rows = j.nccl_rows(ccts, 4, {"allreduce": 1_000_000, "ag": 1_000_000})
    ar, ag = rows
    assert ar["size"] == 1_000_000 and math.isclose(ar["time_us"], 200_000)
    assert math.isclose(ar["algbw_gbps"], 1e6 * 8 / 0.2 / 1e9)
    assert math.isclose(ar["busbw_gbps"], ar["algbw_gbps"] * 1.5)
    assert ag["size"] == 4_000_000 and math.isclose(ag["busbw_gbps"], ag["algbw_gbps"] * 0.75)
    t = j.format_nccl_table(rows, "float32", 4)
    lines = t.splitlines()
    assert lines[0].startswith("#") and "algbw" in lines[0] and "busbw" in lines[0]
    assert lines[1].split()[:3] == ["1000000", "250000", "float32"]
    assert lines[2].split()[:2] == ["4000000", "1000000"]
