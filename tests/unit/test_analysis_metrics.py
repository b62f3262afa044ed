"""analysis.metrics against hand-computed values (fixtures in tests/fixtures/runs)."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import metrics as m
from analysis.load import empty_frame, load_run

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
approx = pytest.approx


@pytest.fixture(scope="module")
def run():
    return load_run(RUNS / "small_collective")


# ---------------------------------------------------------------- percentiles

def test_nearest_rank_definition():
    x = list(range(1, 11))  # 1..10
    assert m.nearest_rank(x, 0.5) == 5
    assert m.nearest_rank(x, 0.95) == 10
    assert m.nearest_rank(x, 0.99) == 10  # p99 of 10 samples is the max
    assert m.nearest_rank(x, 0.0) == 1
    assert m.nearest_rank(range(1, 21), 0.95) == 19  # no float-rounding off-by-one
    assert m.nearest_rank(range(1, 201), 0.99) == 198
    assert math.isnan(m.nearest_rank([], 0.5))
    with pytest.raises(ValueError):
        m.nearest_rank([1.0], 1.5)


def test_percentiles_many_samples():
    p = m.percentiles(np.arange(1, 1001, dtype=float))
    assert (p.p50, p.p95, p.p99, p.p999, p.max, p.n) == (500, 950, 990, 999, 1000, 1000)
    assert p.mean == approx(500.5)
    assert p.resolves(0.99) and p.resolves(0.999)
    assert set(p.as_dict()) == {"p50", "p95", "p99", "p999", "max", "mean", "n"}


def test_percentiles_one_sample():
    p = m.percentiles([7.0])
    assert (p.p50, p.p99, p.p999, p.max, p.n) == (7.0, 7.0, 7.0, 7.0, 1)
    assert not p.resolves(0.5)


def test_percentiles_few_samples_p99_is_max():
    p = m.percentiles([3.0, 1.0, 2.0, np.nan])
    assert p.n == 3 and p.p50 == 2.0 and p.p99 == 3.0 == p.max
    assert p.resolves(0.5) and not p.resolves(0.99)


def test_percentiles_empty():
    p = m.percentiles([])
    assert p.n == 0 and math.isnan(p.p99) and math.isnan(p.max)
    assert not p.resolves(0.5)


def test_percentiles_scaled():
    assert m.percentiles([0.001, 0.002]).scaled(1e3).max == approx(2.0)


def test_cv():
    assert m.cv([1.0, 3.0]) == approx(np.std([1, 3], ddof=1) / 2)
    assert math.isnan(m.cv([5.0]))
    assert math.isnan(m.cv([]))


# ---------------------------------------------------------------- bandwidth

@pytest.mark.parametrize("coll,n,f", [("allreduce", 4, 1.5), ("all_reduce", 2, 1.0), ("allgather", 4, 0.75),
                                      ("reducescatter", 8, 0.875), ("alltoall", 2, 0.5),
                                      ("broadcast", 8, 1.0), ("reduce", 3, 1.0)])
def test_busbw_factors(coll, n, f):
    assert m.busbw_factor(coll, n) == approx(f)


def test_busbw_unknown():
    with pytest.raises(ValueError):
        m.busbw_factor("gossip", 4)


def test_algbw_busbw():
    assert m.algbw(1e9, 0.5) == approx(2e9)
    assert m.busbw(2e9, "allreduce", 4) == approx(3e9)
    assert math.isnan(m.algbw(1, 0))
    assert m.goodput(100, 2) == 50 and math.isnan(m.goodput(1, 0))


# ---------------------------------------------------------------- collectives

def test_op_table_cct_and_bandwidth(run):
    t = m.op_table(run.ops)
    assert list(zip(t.iteration, t.op_index)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert t.cct_s.tolist() == approx([0.012, 0.010, 0.040, 0.020])
    assert t.n_ranks.tolist() == [2, 2, 2, 2]
    # inferred size: max bytes_sent / factor (allreduce n=2: 1; allgather n=2: 0.5)
    assert t.size_bytes.tolist() == approx([1000, 1000, 1000, 1000])
    assert t.algbw_Bps.tolist() == approx([1000 / 0.012, 1e5, 25000, 50000])
    assert t.busbw_Bps.tolist() == approx([1000 / 0.012, 5e4, 25000, 25000])
    assert t.wait_s_max.tolist() == approx([0.002, 0.003, 0.020, 0.004])


def test_op_table_explicit_sizes(run):
    t = m.op_table(run.ops, size_bytes={"grad": 2000, "allgather": 4000})
    assert t.size_bytes.tolist() == approx([2000, 4000, 2000, 4000])
    assert m.op_table(run.ops, size_bytes=10).algbw_Bps.iloc[2] == approx(250)


def test_op_table_empty():
    t = m.op_table(empty_frame("ops"))
    assert t.empty and "cct_s" in t.columns


def test_step_times(run):
    s = m.step_times(run.ops)
    assert s.iteration.tolist() == [0, 1]
    assert s.step_s.tolist() == approx([0.030, 0.140])
    assert m.cv(s.step_s) == approx(np.std([0.03, 0.14], ddof=1) / 0.085)


def test_step_times_one_iteration_and_empty():
    ops = load_run(RUNS / "small_collective").ops
    one = m.step_times(ops[ops.iteration == 1])
    assert one.step_s.tolist() == approx([0.070])
    assert m.step_times(empty_frame("ops")).empty


def test_rank_step_times_and_comm_wait(run):
    r = m.rank_step_times(run.ops)
    assert r.step_s.tolist() == approx([0.030, 0.130, 0.024, 0.145])
    assert r.wait_s.tolist() == approx([0.005, 0.021, 0.001, 0.014])
    overall, per = m.comm_wait_fraction(run.ops)
    assert overall == approx(0.041 / 0.329)
    assert per.loc[0] == approx(0.026 / 0.160) and per.loc[1] == approx(0.015 / 0.169)


def test_overlapping_ops_wait_once():
    """A ring rank's send and receive ops run at the same time: their waits overlap and count once, so the
    fraction stays within [0, 1] (summed, these would give 1.4 of the step)."""
    cols = ["iteration", "op", "op_index", "collective", "rank", "host", "start_s", "end_s", "bytes_sent",
            "bytes_recv", "wait_s"]
    ops = pd.DataFrame([(0, "send", 0, "allreduce", 0, "h1", 0.0, 1.0, 10, 0, 0.8),
                        (0, "recv", 1, "allreduce", 0, "h1", 0.0, 1.0, 0, 10, 0.6),
                        (0, "send", 2, "allreduce", 0, "h1", 2.0, 3.0, 10, 0, 0.5)], columns=cols)
    r = m.rank_step_times(ops)
    assert r.wait_s.tolist() == approx([0.8 + 0.5])
    overall, _ = m.comm_wait_fraction(ops)
    assert overall == approx(1.3 / 3.0) and 0 <= overall <= 1


def test_comm_wait_empty():
    overall, per = m.comm_wait_fraction(empty_frame("ops"))
    assert math.isnan(overall) and per.empty


# ---------------------------------------------------------------- incast

def test_round_times_and_goodput(run):
    r = m.round_times(run.rounds)
    assert r.round_s.tolist() == approx([0.020, 0.040])
    assert r.bytes.tolist() == [20000, 20000] and r.senders.tolist() == [2, 2]
    assert r.goodput_Bps.tolist() == approx([1e6, 5e5])
    assert m.round_times(empty_frame("rounds")).empty


def test_counter_deltas(run):
    d = m.port_counter_deltas(run.queues)
    leaf = d[d.node == "leaf1"].iloc[0]
    assert (leaf.drops, leaf.marks, leaf.sent_packets, leaf.overlimits) == (12, 8, 400, 2)
    w = m.port_counter_deltas(run.queues, t_start=1000.1, t_end=1000.15)
    assert w[w.node == "leaf1"].drops.iloc[0] == 10


def test_counter_reset_tolerated():
    q = pd.DataFrame({"t_s": [0.0, 1.0, 2.0, 3.0], "node": "n", "port": "p", "class": "c",
                      "backlog_bytes": 0, "backlog_packets": 0, "drops": [5, 8, 2, 4], "marks": 0,
                      "sent_bytes": 0, "sent_packets": [0, 10, 3, 13], "overlimits": 0})
    d = m.port_counter_deltas(q)
    assert d.drops.iloc[0] == 3 + 2 + 2 and d.sent_packets.iloc[0] == 10 + 3 + 10


def test_incast_loss_rate_bottleneck_auto(run):
    lr = m.incast_loss_rate(run.queues)
    assert (lr.node, lr.port, lr.drops, lr.sent_packets) == ("leaf1", "eth3", 12, 400)
    assert lr.rate == approx(12 / 412)


def test_incast_loss_rate_named_port_and_missing(run):
    lr = m.incast_loss_rate(run.queues, node="spine1", port="eth2")
    assert lr.rate == 0.0 and lr.sent_packets == 40
    assert math.isnan(m.incast_loss_rate(run.queues, node="nope").rate)
    assert math.isnan(m.incast_loss_rate(empty_frame("queues")).rate)


def test_ecn_mark_fraction(run):
    assert m.ecn_mark_fraction(run.queues) == approx(9 / 440)
    assert m.ecn_mark_fraction(run.queues, node="leaf1", port="eth3") == approx(0.02)
    assert math.isnan(m.ecn_mark_fraction(empty_frame("queues")))


def test_queue_stats(run):
    s = m.queue_stats(run.queues).set_index(["node", "port"])
    leaf = s.loc[("leaf1", "eth3")]
    assert (leaf.mean_bytes, leaf.median_bytes, leaf.p90_bytes, leaf.max_bytes, leaf.n) == (2700, 1500, 9000, 9000, 5)
    spine = s.loc[("spine1", "eth2")]
    assert (spine.mean_bytes, spine.median_bytes, spine.p90_bytes, spine.max_bytes) == (600, 0, 2000, 2000)
    assert m.queue_stats(empty_frame("queues")).empty


def test_queue_stats_sums_classes():
    q = pd.DataFrame({"t_s": [0.0, 0.0, 1.0, 1.0], "node": "n", "port": "p", "class": ["a", "b", "a", "b"],
                      "backlog_bytes": [1, 2, 3, 4], "backlog_packets": 0, "drops": 0, "marks": 0,
                      "sent_bytes": 0, "sent_packets": 0, "overlimits": 0})
    s = m.queue_stats(q).iloc[0]
    assert (s.max_bytes, s.n, s.mean_bytes) == (7, 2, 5)


# ---------------------------------------------------------------- TCP

def test_retransmit_rate(run):
    assert m.retransmit_rate(run.tcp) == approx(40 / 2000)
    assert m.retransmit_rate(run.tcp, host="h0") == approx(10 / 1000)
    d = m.tcp_deltas(run.tcp).set_index(["host", "counter"])["delta"]
    assert d[("h1", "TcpRetransSegs")] == 30


def test_retransmit_rate_empty_and_one_phase(run):
    assert math.isnan(m.retransmit_rate(empty_frame("tcp")))
    assert math.isnan(m.retransmit_rate(run.tcp[run.tcp.phase == "before"]))


# ---------------------------------------------------------------- PFC

def test_pause_fraction_xoff_without_xon_runs_to_end(run):
    start, end = run.time_window()
    p = m.pause_fraction(run.pfc, start, end).set_index(["node", "port"])
    assert p.loc[("spine1", "eth2"), "paused_s"] == approx(0.003)
    assert p.loc[("spine1", "eth2"), "fraction"] == approx(0.012)
    assert p.loc[("leaf1", "eth3"), "paused_s"] == approx(0.060)
    assert p.loc[("leaf1", "eth3"), "fraction"] == approx(0.24)
    assert bool(p.loc[("leaf1", "eth3"), "open_at_end"]) and not bool(p.loc[("spine1", "eth2"), "open_at_end"])


def _pfc(rows):
    return pd.DataFrame(rows, columns=["t_s", "node", "port", "prio", "event", "backlog_bytes"])


def test_pause_intervals_edge_cases():
    ev = _pfc([(1.0, "s", "e1", 3, "xon", 0),       # xon while not paused: ignored
               (2.0, "s", "e1", 3, "xoff", 9),
               (2.5, "s", "e1", 3, "xoff", 9),      # repeated xoff: still the same pause
               (3.0, "s", "e1", 3, "xon", 0),
               (4.0, "s", "e1", 3, "xoff", 9),
               (4.5, "s", "e1", 3, "watchdog", 0),  # watchdog breaks the pause
               (2.0, "s", "e1", 4, "xoff", 9),      # other prio overlapping: counted once per port
               (3.5, "s", "e1", 4, "xon", 0)])
    iv = m.pause_intervals(ev, run_end=10.0)
    assert list(zip(iv.prio, iv.start_s, iv.end_s)) == [(3, 2.0, 3.0), (3, 4.0, 4.5), (4, 2.0, 3.5)]
    p = m.pause_fraction(ev, 0.0, 10.0).iloc[0]
    assert p.paused_s == approx(1.5 + 0.5) and p.fraction == approx(0.2) and p.watchdogs == 1
    assert p.pauses == 3 and not p.open_at_end
    by = m.pause_fraction(ev, 0.0, 10.0, by_prio=True)
    assert by.paused_s.tolist() == approx([1.5, 1.5])


def test_pause_only_xoff_and_empty():
    p = m.pause_fraction(_pfc([(8.0, "s", "e1", 3, "xoff", 9)]), 0.0, 10.0).iloc[0]
    assert p.paused_s == approx(2.0) and p.open_at_end
    assert m.pause_fraction(empty_frame("pfc"), 0.0, 1.0).empty
    assert m.pause_intervals(empty_frame("pfc"), 1.0).empty


# ---------------------------------------------------------------- scaling

def test_scaling_weak_and_strong():
    w = m.scaling_efficiency(1.0, 1.25, k=2, mode="weak")
    assert w.efficiency == approx(0.8) and w.verdict == "marginal"
    s = m.scaling_efficiency(1.0, 0.55, k=2, mode="strong")
    assert s.efficiency == approx(1 / 1.1) and s.verdict == "good"
    assert m.scaling_efficiency(1.0, 2.0, k=4, mode="strong").verdict == "poor"
    assert m.scaling_efficiency(1.0, 0.0, k=2).verdict == "n/a"
    with pytest.raises(ValueError):
        m.scaling_efficiency(1.0, 1.0, k=2, mode="diagonal")


@pytest.mark.parametrize("eff,verdict", [(0.7499, "poor"), (0.75, "marginal"), (0.8, "marginal"),
                                         (0.8001, "good"), (float("nan"), "n/a")])
def test_scaling_verdict_thresholds(eff, verdict):
    assert m.scaling_verdict(eff) == verdict


def test_rate_by_pause_state_splits_sample_intervals_by_the_other_ports_pause():
    # v:x sends 1000 B per 0.1 s except while s:e1 is paused (0.2-0.5 s: it sends nothing then)
    ts = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    sent = [0, 1000, 2000, 2000, 2000, 2000, 3000, 4000]
    q = pd.DataFrame({"t_s": ts, "node": "v", "port": "x", "class": "3", "sent_bytes": sent})
    q = pd.concat([q, q.assign(port="other", sent_bytes=0)])  # another port's rows are ignored
    ev = _pfc([(0.2, "s", "e1", 3, "xoff", 9), (0.5, "s", "e1", 3, "xon", 0),
               (0.65, "s", "e1", 3, "xoff", 9), (0.655, "s", "e1", 3, "xon", 0),  # 5% of 0.6-0.7: running
               (0.15, "s", "e2", 3, "xoff", 9)])  # a different port's pause: not this one
    r = m.rate_by_pause_state(q, ev, "v", "x", "s", "e1", run_end=0.7)
    assert r["paused_intervals"] == 3 and r["paused_s"] == approx(0.3) and r["paused_mbps"] == approx(0.0)
    assert r["running_intervals"] == 4 and r["running_s"] == approx(0.4)
    assert r["running_mbps"] == approx(4000 * 8 / 0.4 / 1e6)
    none = m.rate_by_pause_state(q, empty_frame("pfc"), "v", "x", "s", "e1", run_end=0.7)
    assert none["paused_intervals"] == 0 and math.isnan(none["paused_mbps"]) and none["running_intervals"] == 7
    assert m.rate_by_pause_state(q, ev, "v", "x", "s", "e1", 0.7, cls="9")["running_intervals"] == 0
