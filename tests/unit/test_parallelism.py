"""Parallelism strategies (pure logic): the communicators of a TP x DP (x EP) layout, the ops a step derives from a
model, grouped collectives whose result is each group's own, and the per-dimension communication time computed
from ops.csv on a fixture with hand-computed answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.dimensions import comm_by_dimension, dimension_of
from traffic.collectives import make_schedule
from traffic.collectives.grouped import grouped
from traffic.jobplan import JobError, plan_job
from traffic.parallelism import Model, Parallelism, ParallelismError, groups, step_ops
from traffic.schedule import random_inputs, simulate


def test_groups_of_each_order():
    p = Parallelism(tp=2, dp=4)
    assert groups(p, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups(p, "dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    q = Parallelism(tp=2, dp=4, order="dp-tp")
    assert groups(q, "tp") == [[0, 4], [1, 5], [2, 6], [3, 7]]  # TP peers four ranks apart: other servers
    assert groups(Parallelism(tp=1, dp=4, ep=2), "ep") == [[0, 1], [2, 3]]
    with pytest.raises(ParallelismError, match="ep .3. must divide dp .4."):
        Parallelism(tp=1, dp=4, ep=3)


def test_a_steps_ops_follow_the_model():
    m = Model(params=1000, layers=2, hidden=8, tokens=4, micro_batches=2, bucket_bytes=1600)
    ops = step_ops(m, Parallelism(tp=2, dp=2))
    tp = [o for o in ops if o.dim == "tp"]
    assert len(tp) == 2 * 2 * 4 and all(o.size_bytes == 4 * 8 * 4 for o in tp)  # mb x layers x (2 fwd + 2 bwd)
    dp = [o for o in ops if o.dim == "dp"]
    # params / tp = 500 elements = 2000 B in buckets of 1600: 1600 + 400
    assert [o.size_bytes for o in dp] == [1600, 400] and ops[-2:] == dp
    moe = step_ops(Model(params=100, layers=1, hidden=8, tokens=4, micro_batches=1, experts=4, topk=2, skew=1.0),
                   Parallelism(tp=1, dp=4, ep=2))
    ep = [o for o in moe if o.dim == "ep"]
    assert [o.name for o in ep] == ["ep.l0.mb0.dispatch", "ep.l0.mb0.combine", "ep.l0.mb0.combine.bwd",
                                    "ep.l0.mb0.dispatch.bwd"]
    assert all(o.size_bytes == 4 * 2 * 8 * 4 and o.skew == 1.0 and o.collective == "alltoall" for o in ep)


def test_grouped_collectives_sum_within_each_group():
    s = grouped(make_schedule("allreduce", 2, 4000), [[0, 4], [1, 5], [2, 6], [3, 7]], 8)
    s.validate()
    ins = random_inputs(s, 1)
    out = simulate(s, ins)
    assert all(np.array_equal(out[r], ins[r] + ins[(r + 4) % 8]) for r in range(8))


KNOBS = {"collective": "allreduce", "algorithm": "", "size": "1M", "buckets": "", "ranks": 8, "iterations": 2,
         "warmup": 1, "chunks": 1, "dtype": "float32", "placement": "packed", "schedule_file": "", "trace_file": "",
         "compute_ms": 0.0, "jitter": 0.0, "stragglers": "", "straggler_factor": 1.0, "straggler_prob": 1.0,
         "background": "", "bg_dscp": 0, "bg_rate_mbps": 0.0, "gpus_per_host": 2, "tp": 2, "pp": 1, "ep": 1,
         "rank_order": "tp-dp", "model_params": 4000, "model_layers": 1, "model_hidden": 8, "model_tokens": 4,
         "micro_batches": 1, "experts": 0, "topk": 1, "moe_skew": 0.0, "grad_bucket_bytes": 1 << 20}
HOSTS = [("h1", "leaf1"), ("h2", "leaf1"), ("h3", "leaf2"), ("h4", "leaf2")]


def test_a_parallel_job_plans_grouped_schedules_on_servers():
    pl = plan_job(KNOBS, HOSTS, 1)
    assert [n for n, _ in pl.job.segments[0].ops] == ["tp.l0.mb0.fwd0", "tp.l0.mb0.fwd1", "tp.l0.mb0.bwd0",
                                                      "tp.l0.mb0.bwd1", "dp.bucket0"]
    assert pl.placement.hosts == ("h1", "h1", "h2", "h2", "h3", "h3", "h4", "h4")  # each TP pair on one server
    for s in pl.schedules.values():
        s.validate()
        assert s.collective == "custom" and s.ranks == 8
    with pytest.raises(JobError, match="must be a multiple of tp"):
        plan_job({**KNOBS, "ranks": 7}, HOSTS, 1)


def test_comm_time_per_dimension_on_a_fixture():
    """Two ranks, two iterations of 1 s each (origin 0). Rank 0 starts its ops 0.05 s into each iteration: it 0 tp
    0.1 + 0.2 s then dp to the end (0.65 s); it 1 tp 0.1 s, dp 0.85 s. Rank 1 starts 0.15 s in: dp 0.55 and 0.75 s.
    comm_ms_tp = mean(0.3, 0.1, 0.3, 0.1) = 200 ms; comm_ms_dp = mean(0.65, 0.85, 0.55, 0.75) = 700 ms;
    comm_fraction_dp = 2.8 / 4.0 = 0.7; comm_fraction_tp = 0.8 / 4.0 = 0.2."""
    rows = []
    for rank, gap in ((0, 0.05), (1, 0.15)):
        for it, tps in enumerate(((0.1, 0.2), (0.1,))):
            t0 = float(it)
            t = t0 + gap
            for k, d in enumerate(tps):
                rows.append((it, f"tp.l0.mb0.fwd{k}", k, rank, t, t + d))
                t += d
            rows.append((it, "dp.bucket0", 9, rank, t, t0 + 1.0))
    ops = pd.DataFrame(rows, columns=["iteration", "op", "op_index", "rank", "start_s", "end_s"]).assign(
        collective="custom", host="h1", bytes_sent=0, bytes_recv=0, wait_s=0.0, iter_start_s=0.0)
    out = comm_by_dimension(ops)
    assert out["comm_ms_tp"] == pytest.approx(200.0)
    assert out["comm_ms_dp"] == pytest.approx(700.0)
    assert out["comm_fraction_dp"] == pytest.approx(0.7)
    assert out["comm_fraction_tp"] == pytest.approx(0.2)
    assert set(out) == {"comm_ms_tp", "comm_fraction_tp", "comm_ms_dp", "comm_fraction_dp"}
    assert comm_by_dimension(ops.assign(op="allreduce")) == {}
    assert dimension_of("tp.l0") == "tp" and dimension_of("tpx.l0") == "" and dimension_of("dp") == ""


def test_pipeline_stages_pass_activations_both_ways():
    p = Parallelism(tp=2, dp=2, pp=2)
    assert p.ranks == 8 and groups(p, "pp") == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert groups(p, "tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # every stage has its own TP groups
    ops = step_ops(Model(params=1000, layers=4, hidden=8, tokens=4, micro_batches=2), p)
    pp = [o for o in ops if o.dim == "pp"]
    assert [o.name for o in pp] == ["pp.mb0.fwd", "pp.mb0.bwd", "pp.mb1.fwd", "pp.mb1.bwd"]
    assert pp[1].groups == tuple(tuple(reversed(g)) for g in pp[0].groups)  # gradients go back
    assert sum(o.dim == "tp" for o in ops) == 2 * 2 * 4  # 2 layers per stage x 2 micro-batches x 4 all-reduces
    assert [o.size_bytes for o in ops if o.dim == "dp"] == [1000]  # params / (tp x pp) = 250 elements
    with pytest.raises(ParallelismError, match="layers .3. must be a multiple of pp .2."):
        step_ops(Model(layers=3), p)
    pl = plan_job({**KNOBS, "pp": 2, "model_layers": 2}, HOSTS, 1)
    for s in pl.schedules.values():
        s.validate()
