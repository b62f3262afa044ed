"""Trace import (traffic.traces): a Chakra execution trace encoded here from the published schema (et_def.proto:
length-delimited GlobalMetadata then Nodes) and an ASTRA-sim text workload become ops with compute gaps and
schedules; malformed traces are refused in one line naming what is wrong."""

from __future__ import annotations

import pytest

from traffic import traces as tr
from traffic.jobplan import JobError, plan_job


from tests.chakra_fixture import ALL_REDUCE, COLL, COMP, SCATTER, SEND, attr, et, field, node, small_chakra, varint


def test_chakra_nodes_become_ops_with_compute_gaps(tmp_path):
    f = tmp_path / "w.0.et"
    f.write_bytes(small_chakra())
    t = tr.load_trace(f)
    assert t.kind == "chakra"
    assert [(o.name, o.collective, o.size_bytes, o.compute_before_ms) for o in t.ops] == [
        ("grads", "allreduce", 65536, 2.0), ("params", "allgather", 8192, 3.0),
        ("barrier", "allreduce", tr.BARRIER_BYTES, 0.0)]
    assert t.compute_after_ms == 0.5 and t.compute_ms == 5.5


ASTRA = """DATA
2
conv1 -1 1000000 NONE 0 2000000 NONE 0 3000000 ALLREDUCE 131072 500000
fc -1 500000 ALLGATHER 4096 700000 NONE 0 800000 ALLREDUCE 65536 0
"""


def test_astrasim_text_becomes_forward_then_backward_ops(tmp_path):
    f = tmp_path / "w.txt"
    f.write_text(ASTRA)
    t = tr.load_trace(f)
    assert t.kind == "astra-sim"
    # forward: conv1 (1 ms compute, no comm), fc (0.5 ms, all-gather); backward in reverse: fc ig (0.7 ms), fc wg
    # (0.8 ms, all-reduce 64 KiB), conv1 ig (2 ms), conv1 wg (3 ms, all-reduce 128 KiB), conv1's update 0.5 ms
    assert [(o.name, o.collective, o.size_bytes, round(o.compute_before_ms, 6)) for o in t.ops] == [
        ("fc.fwd", "allgather", 4096, 1.5), ("fc.wg", "allreduce", 65536, 1.5),
        ("conv1.wg", "allreduce", 131072, 5.0)]
    assert t.compute_after_ms == pytest.approx(0.5)


def knobs(path, **kw):
    k = {"collective": "allreduce", "algorithm": "", "size": "1M", "buckets": "", "ranks": 4, "iterations": 3,
         "warmup": 1, "chunks": 1, "dtype": "float32", "placement": "packed", "schedule_file": "",
         "trace_file": str(path), "trace_bytes_scale": 1.0, "trace_compute_scale": 1.0, "compute_ms": 0.0,
         "jitter": 0.0, "stragglers": "", "straggler_factor": 1.0, "straggler_prob": 1.0, "background": "",
         "bg_dscp": 0, "bg_rate_mbps": 0.0}
    k.update(kw)
    return k


HOSTS = [("h1", "leaf1"), ("h2", "leaf1"), ("h3", "leaf2"), ("h4", "leaf2")]


def test_a_trace_plans_a_job_with_schedules_gaps_and_scales(tmp_path):
    f = tmp_path / "w.0.et"
    f.write_bytes(small_chakra())
    pl = plan_job(knobs(f, trace_bytes_scale=0.5, trace_compute_scale=2.0), HOSTS, 1)
    seg = pl.job.segments[0]
    assert [(n, g) for n, _, g in seg.ops] == [("grads", 4.0), ("params", 6.0), ("barrier", 0.0)]
    # sizes halved, kept a multiple of the element size (a barrier's 4 B stays one element)
    assert pl.sizes == {"grads": 32768, "params": 4096, "barrier": 4}
    assert pl.job.compute_ms == 1.0  # the optimizer's 0.5 ms, doubled, opens every step
    for _, key, _ in seg.ops:
        s = pl.schedules[key]
        s.validate()
        assert s.ranks == 4
    from traffic.job import iteration_plan
    assert iteration_plan(pl.job)[1]["ops"][1] == ["params", seg.ops[1][1], 6.0]


MALFORMED = {
    "not protobuf": (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "varint"),
    "truncated": (small_chakra()[:-3], "remain"),
    "no metadata": (varint(2) + field(1, 0, 7), "GlobalMetadata"),
    "no nodes": (et(), "no nodes"),
    "p2p": (et(node(1, "send", SEND)), "point-to-point COMM_SEND_NODE"),
    "scatter": (et(node(1, "s", COLL, attrs=[attr("comm_type", int64=SCATTER), attr("comm_size", int64=4)])),
                "SCATTER has no testbed collective"),
    "no size": (et(node(1, "ar", COLL, attrs=[attr("comm_type", int64=ALL_REDUCE)])), "comm_size"),
    "missing dep": (et(node(1, "ar", COLL, deps=[9], attrs=[attr("comm_type", int64=0), attr("comm_size", int64=4)])),
                    "missing node id(s) 9"),
    "cycle": (et(node(1, "a", COMP, deps=[2], duration_us=1), node(2, "b", COMP, deps=[1], duration_us=1)),
              "cycle"),
    "compute only": (et(node(1, "a", COMP, duration_us=5)), "no collective"),
    "astra count": (b"DATA\n3\nl -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 8 0\n", "says 3 layers but 1"),
    "astra type": (b"DATA\n1\nl -1 1 NONE 0 1 NONE 0 1 ALLSUM 8 0\n", "'ALLSUM' is not one of"),
    "astra fields": (b"DATA\n1\nl -1 1 NONE 0\n", "12 fields"),
    "astra number": (b"DATA\n1\nl -1 x NONE 0 1 NONE 0 1 ALLREDUCE 8 0\n", "forward compute time must be a number"),
    "astra kind": (b"TENSOR\n1\nl -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 8 0\n", "unknown parallelism"),
    "empty": (b"  \n", "empty"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_traces_are_refused_in_one_line(tmp_path, case):
    data, says = MALFORMED[case]
    f = tmp_path / "bad.et"
    f.write_bytes(data)
    with pytest.raises(tr.TraceError) as e:
        tr.load_trace(f)
    msg = str(e.value)
    assert says in msg and "\n" not in msg and str(f) in msg, msg
    with pytest.raises(JobError) as je:  # and the job planner says it as a trace_file problem
        plan_job(knobs(f), HOSTS, 1)
    assert str(je.value).startswith("trace_file: "), je.value


def test_a_missing_trace_file_is_named(tmp_path):
    with pytest.raises(JobError, match="trace_file: .*nope.et"):
        plan_job(knobs(tmp_path / "nope.et"), HOSTS, 1)
