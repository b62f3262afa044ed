"""The program event protocol (traffic.progevents): parsing, pairing, ops.csv rows, and what analysis makes of them
(step times, comm wait, the slowest step joined with the fabric) on hand-computed fixtures."""

import json
import math

import pandas as pd
import pytest

from analysis import metrics as m
from analysis import summary as asum
from analysis.correlate import correlate_ops, step_ops
from traffic import progevents as pe
from traffic.jobplan import OPS_COLUMNS


def lines(*events):
    return [json.dumps(e) for e in events]


def test_parse_keeps_protocol_lines_and_counts_the_rest():
    events, bad = pe.parse([*lines({"event": "step_begin", "step": 0, "t": 1.0}, {"event": "step_end", "step": 0,
                                                                                    "t": 2.0}),
                            "not json", "[1, 2]", json.dumps({"event": "nap", "t": 1}),
                            json.dumps({"event": "step_end", "step": 1}),  # no time
                            json.dumps({"event": "op", "name": "x", "start": 1.0}),  # no end
                            json.dumps({"event": "step_begin", "step": 2, "t": True}),  # a bool is not a time
                            "", "   "])
    assert [e["event"] for e in events] == ["step_begin", "step_end"]
    assert bad == 6


def test_rank_records_pairs_steps_and_ops():
    ev, _ = pe.parse(lines(
        {"event": "step_begin", "step": 0, "t": 10.0},
        {"event": "op_begin", "name": "ar", "collective": "allreduce", "bytes": 400, "t": 10.5},
        {"event": "op_end", "name": "ar", "t": 11.0},
        {"event": "op", "name": "b0", "collective": "allreduce", "bytes": 100, "start": 10.6, "end": 10.9,
         "wait_s": 0.1},
        {"event": "step_end", "step": 0, "t": 11.2},
        {"event": "step_begin", "step": 1, "t": 11.2},  # never ends: dropped
        {"event": "op_end", "name": "never-begun", "t": 12.0}))
    steps, ops = pe.rank_records(ev)
    assert steps == [{"step": 0, "start_s": 10.0, "end_s": 11.2}]
    assert [(o["name"], o["start_s"], o["end_s"], o["wait_s"]) for o in ops] == [
        ("ar", 10.5, 11.0, 0.5), ("b0", 10.6, 10.9, 0.1)]  # a blocking op waits its whole duration by default


def two_ranks():
    """Rank 0 and 1, three steps of 1 s compute + one all-reduce; step 0 is warm-up. Rank 1's all-reduce of step 2
    ends 0.5 s late (a slow step)."""
    out = {}
    for rank in (0, 1):
        ev, t = [], 100.0
        for step in range(3):
            ev.append({"event": "step_begin", "step": step, "t": t})
            end = t + 1.5 + (0.5 if step == 2 else 0.0)
            ev.append({"event": "op", "name": "bucket0", "collective": "allreduce", "bytes": 1000,
                       "start": t + 1.0, "end": end})
            ev.append({"event": "step_end", "step": step, "t": end})
            t = end
        out[rank] = pe.parse(lines(*ev))[0]
    return out


def test_ops_rows_feed_the_collective_analysis():
    rows = pe.ops_rows(two_ranks(), {0: "h1", 1: "h2"}, warmup_steps=1)
    assert {tuple(sorted(r)) for r in rows} == {tuple(sorted(OPS_COLUMNS))}
    ops = pd.DataFrame(rows)
    assert sorted(ops["iteration"].unique()) == [1, 2]
    st = m.step_times(ops)
    # step 1: from its begin (101.5, the origin) to 103.0; step 2: 103.0 -> 105.0
    assert st["step_s"].round(6).tolist() == [1.5, 2.0]
    cm = asum.collective_metrics(ops)
    assert cm["step_n"] == 2 and cm["cct_samples"] == 2
    assert cm["cct_ms_max"] == pytest.approx(1000.0)
    # comm wait: the all-reduces (0.5 s and 1.0 s) over the steps (1.5 s and 2.0 s), per rank
    assert cm["comm_wait_fraction"] == pytest.approx(1.5 / 3.5)
    assert m.op_table(ops)["size_bytes"].tolist() == [1000.0, 1000.0]


def test_a_step_without_ops_is_one_step_row():
    ev = {0: pe.parse(lines({"event": "step_begin", "step": 0, "t": 1.0}, {"event": "step_end", "step": 0, "t": 3.0},
                            {"event": "step_begin", "step": 1, "t": 3.0}, {"event": "step_end", "step": 1,
                                                                            "t": 4.0}))[0]}
    rows = pe.ops_rows(ev, {0: "h1"})
    assert [(r["iteration"], r["op"], r["start_s"], r["end_s"], r["wait_s"]) for r in rows] == [
        (0, "step", 1.0, 3.0, 0.0), (1, "step", 3.0, 4.0, 0.0)]
    assert m.step_times(pd.DataFrame(rows))["step_s"].tolist() == [2.0, 1.0]


def test_op_index_is_shared_by_name_across_ranks():
    """Asynchronous buckets complete in different orders on different ranks: the same name gets the same op_index
    (bucket2 before bucket10)."""
    def rank(order):
        ev = [{"event": "step_begin", "step": 0, "t": 0.0}]
        ev += [{"event": "op", "name": n, "start": 0.1 * i, "end": 0.1 * i + 0.05} for i, n in enumerate(order, 1)]
        ev.append({"event": "step_end", "step": 0, "t": 1.0})
        return pe.parse(lines(*ev))[0]
    rows = pe.ops_rows({0: rank(["bucket10", "bucket2"]), 1: rank(["bucket2", "bucket10"])}, {})
    idx = {(r["rank"], r["op"]): r["op_index"] for r in rows}
    assert idx[(0, "bucket2")] == idx[(1, "bucket2")] == 0
    assert idx[(0, "bucket10")] == idx[(1, "bucket10")] == 1000
    assert len(m.op_table(pd.DataFrame(rows))) == 2


def test_writer_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv(pe.ENV, str(tmp_path / "rank-{rank}.jsonl"))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.delenv("RANK", raising=False)
    ev = pe.Events()
    assert ev.rank == 3 and ev.enabled
    with ev.step(0):
        with ev.op("ar", "allreduce", 64):
            pass
    ev.close()
    events, bad = pe.parse((tmp_path / "rank-3.jsonl").read_text().splitlines())
    assert bad == 0 and [e["event"] for e in events] == ["step_begin", "op_begin", "op_end", "step_end"]
    assert all(e["rank"] == 3 for e in events)
    steps, ops = pe.rank_records(events)
    assert len(steps) == 1 and ops[0]["bytes"] == 64 and ops[0]["start_s"] <= ops[0]["end_s"]
    monkeypatch.delenv(pe.ENV)
    quiet = pe.Events()
    assert not quiet.enabled
    with quiet.step(1):  # a no-op outside the testbed
        pass


def test_the_slowest_step_meets_the_drops_inside_it():
    ops = pd.DataFrame(pe.ops_rows(two_ranks(), {0: "h1", 1: "h2"}, warmup_steps=1))
    # one port: 40 drops between 103.5 and 104.5 (inside step 2 = 103.0 .. 105.0), none during step 1
    t = [101.0, 102.0, 103.0, 103.5, 104.5, 105.5]
    queues = pd.DataFrame({"t_s": t, "node": "leaf1", "port": "h1", "class": "", "backlog_bytes": 0,
                           "backlog_packets": 0, "drops": [0, 0, 0, 0, 40, 40], "marks": 0, "sent_bytes": 0,
                           "sent_packets": 0, "overlimits": 0})
    pfc = pd.DataFrame(columns=["t_s", "node", "port", "prio", "event", "backlog_bytes"])
    steps = step_ops(ops)
    assert steps["start_s"].tolist() == [101.5, 103.0] and steps["end_s"].tolist() == [103.0, 105.0]
    c = correlate_ops(steps, queues, pfc)
    assert c["drops"].tolist() == [0.0, 40.0] and c["drop_port"].tolist() == ["", "leaf1:h1"]
    assert math.isclose(c["cct_ms"].max(), 2000.0)
