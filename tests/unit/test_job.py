"""traffic.job: parsing, the job plan (compute jitter, stragglers, warm-up), and the job's metric definitions as
analysis computes them from ops.csv."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import metrics as m
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

def _rows():
    # 2 ranks, 2 iterations, 1 op; start 10.0
    R = []
    for it, (s0, e0, s1, e1) in enumerate([(10.1, 10.5, 10.2, 10.6), (10.7, 11.0, 10.9, 11.2)]):
        R.append({"iteration": it, "op": "ar", "op_index": 0, "collective": "allreduce", "rank": 0, "start_s": s0,
                  "end_s": e0, "wait_s": 0.2})
        R.append({"iteration": it, "op": "ar", "op_index": 0, "collective": "allreduce", "rank": 1, "start_s": s1,
                  "end_s": e1, "wait_s": 0.1})
    return R


def _ops(origins=None):
    """_rows() as ops.csv, with iter_start_s from traffic.job.iteration_starts (the job's start instant 10.0, or
    per-rank origins), as the collective scenario writes it."""
    rows = _rows()
    starts = j.iteration_starts(rows, origins or {0: 10.0, 1: 10.0})
    df = pd.DataFrame(rows)
    df["host"], df["bytes_sent"], df["bytes_recv"] = "h", 1_000_000, 1_000_000
    df["iter_start_s"] = [starts[(r["rank"], r["iteration"])] for r in rows]
    return df


def test_iteration_starts():
    s = j.iteration_starts(_rows(), {0: 10.0, 1: 10.2})
    assert s == {(0, 0): 10.0, (0, 1): 10.5, (1, 0): 10.2, (1, 1): 10.6}


def test_step_times_from_the_origin_include_the_first_compute():
    """The job's definitions, computed by analysis from ops.csv: CCT = last end - first start, step = end(i) -
    end(i-1) with end(-1) the measurement origin (so the first step includes its compute phase)."""
    ops = _ops()
    t = m.op_table(ops)
    assert t["n_ranks"].tolist() == [2, 2] and t["cct_s"].tolist() == pytest.approx([0.5, 0.5])
    assert m.step_times(ops)["step_s"].tolist() == pytest.approx([0.6, 0.6])
    # without iter_start_s the first step starts at the first op start: its compute is left out
    assert m.step_times(ops.drop(columns="iter_start_s"))["step_s"].tolist() == pytest.approx([0.5, 0.6])


def test_comm_wait_fraction():
    # rank 0 steps: 0.5, 0.5; rank 1: 0.6, 0.6; waits 0.2+0.2, 0.1+0.1 -> 0.6 / 2.2
    assert math.isclose(m.comm_wait_fraction(_ops())[0], 0.6 / 2.2)
    # per-rank origins: rank 1 finished its warm-up later, so its first step is shorter
    assert math.isclose(m.comm_wait_fraction(_ops({0: 10.0, 1: 10.2}))[0], 0.6 / 2.0)


def test_nccl_rows_and_table():
    from analysis.summary import nccl_table

    ops = []
    for it, (name, coll, size, cct) in enumerate([("allreduce", "allreduce", 1_000_000, 0.1),
                                                  ("allreduce", "allreduce", 1_000_000, 0.3),
                                                  ("ag", "allgather", 4_000_000, 0.4)]):
        for rank in range(4):
            ops.append({"iteration": it, "op": name, "op_index": 0, "collective": coll, "rank": rank, "host": "h",
                        "start_s": 10.0 + it, "end_s": 10.0 + it + cct, "bytes_sent": 1, "bytes_recv": 1,
                        "wait_s": 0.0, "size_bytes": size})
    ar, ag = nccl_table(pd.DataFrame(ops)).to_dict("records")
    assert ar["size"] == 1_000_000 and math.isclose(ar["time_us"], 200_000)
    assert math.isclose(ar["algbw_gbps"], 1e6 * 8 / 0.2 / 1e9)
    assert math.isclose(ar["busbw_gbps"], ar["algbw_gbps"] * 1.5)
    assert ag["size"] == 4_000_000 and math.isclose(ag["busbw_gbps"], ag["algbw_gbps"] * 0.75)
    t = j.format_nccl_table([ar, ag], "float32", 4)
    lines = t.splitlines()
    assert lines[0].startswith("#") and "algbw" in lines[0] and "busbw" in lines[0]
    assert lines[1].split()[:3] == ["1000000", "250000", "float32"]
    assert lines[2].split()[:2] == ["4000000", "1000000"]
