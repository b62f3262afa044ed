"""The schedule model: construction checks, validate(), simulate(), expected outputs, cost model, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from traffic.collectives import algorithms, canonical_collective, make_schedule
from traffic.schedule import (
    Local,
    RankProgram,
    Recv,
    Region,
    Schedule,
    ScheduleError,
    Send,
    Step,
    alpha_beta_bound_s,
    busbw_factor,
    expected_outputs,
    nccl_size_bytes,
    simulate,
    split_evenly,
)


def R(buf, off, cnt):
    return Region(buf, off, cnt)


def two_rank(steps0, steps1, count=4, collective="custom", out=4, extra=None):
    bufs = {"input": count, "output": out, **(extra or {})}
    return Schedule(
        collective=collective,
        ranks=2,
        count=count,
        programs=(RankProgram(0, bufs, tuple(steps0)), RankProgram(1, bufs, tuple(steps1))),
    )


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


# ---------------------------------------------------------------------------------------------- a hand-written swap


def swap_schedule():
    """Rank 0 and 1 swap inputs; rank 1 also reduces the received data a second time into scratch-free output."""
    s0 = [Step(sends=(Send(1, 0, R("input", 0, 4)),), recvs=(Recv(1, 0, R("output", 0, 4)),), label="swap")]
    s1 = [
        Step(sends=(Send(0, 0, R("input", 0, 4)),), recvs=(Recv(0, 0, R("output", 0, 4), "copy"),)),
        Step(deps=(0,), local=(Local(R("input", 0, 4), R("output", 0, 4), "reduce"),)),
    ]
    return two_rank(s0, s1)


def test_hand_written_schedule_simulates():
    s = swap_schedule().validate()
    a, b = np.arange(4, dtype=np.float32), 10 * np.ones(4, dtype=np.float32)
    out = simulate(s, [a, b])
    assert np.array_equal(out[0], b)
    assert np.array_equal(out[1], a + b)
    assert s.bytes_sent(0) == s.bytes_received(1) == 16
    with pytest.raises(ScheduleError, match="no expected result"):
        s.expected_outputs([a, b])


def test_unmatched_send_and_receive():
    only_send = two_rank([Step(sends=(Send(1, 0, R("input", 0, 4)),))], [])
    with pytest.raises(ScheduleError, match="no matching receive") as e:
        only_send.validate()
    assert "rank 0 step 0" in one_line(e)
    only_recv = two_rank([], [Step(recvs=(Recv(0, 3, R("output", 0, 4)),))])
    with pytest.raises(ScheduleError, match="receive from rank 0 tag 3 has no matching send"):
        only_recv.validate()
    wrong_tag = two_rank([Step(sends=(Send(1, 1, R("input", 0, 4)),))], [Step(recvs=(Recv(0, 0, R("output", 0, 4)),))])
    with pytest.raises(ScheduleError, match="no matching"):
        wrong_tag.validate()


def test_size_mismatch_and_duplicate_tags():
    s = two_rank([Step(sends=(Send(1, 0, R("input", 0, 3)),))], [Step(recvs=(Recv(0, 0, R("output", 0, 4)),))])
    with pytest.raises(ScheduleError, match="has 3 elements but the receive in rank 1 step 0 expects 4") as e:
        s.validate()
    one_line(e)
    dup = two_rank(
        [Step(sends=(Send(1, 0, R("input", 0, 2)),)), Step(sends=(Send(1, 0, R("input", 2, 2)),))],
        [Step(recvs=(Recv(0, 0, R("output", 0, 2)),))],
    )
    with pytest.raises(ScheduleError, match="duplicates"):
        dup.validate()
    with pytest.raises(ScheduleError, match="two sends to rank 1 with tag 0"):
        Step(sends=(Send(1, 0, R("input", 0, 2)), Send(1, 0, R("input", 2, 2))))


def test_deadlock_detected():
    # each rank first waits to receive, and only sends in a later step: a cycle through messages
    s0 = [Step(recvs=(Recv(1, 0, R("output", 0, 4)),)), Step(deps=(0,), sends=(Send(1, 0, R("input", 0, 4)),))]
    s1 = [Step(recvs=(Recv(0, 0, R("output", 0, 4)),)), Step(deps=(0,), sends=(Send(0, 0, R("input", 0, 4)),))]
    with pytest.raises(ScheduleError, match="deadlock") as e:
        two_rank(s0, s1).validate()
    one_line(e)


def test_dependency_must_point_backwards():
    with pytest.raises(ScheduleError, match="dependency 1 is not an earlier step"):
        RankProgram(0, {"input": 4, "output": 4}, (Step(deps=(1,)), Step()))
    with pytest.raises(ScheduleError, match="dependency 0 is not an earlier step"):
        RankProgram(0, {"input": 4, "output": 4}, (Step(deps=(0,)),))
    with pytest.raises(ScheduleError, match="duplicate dependency"):
        Step(deps=(0, 0))


def test_races_between_unordered_steps_are_rejected():
    # two independent steps: one receives into output[0:4], the other sends output[2:4]
    s0 = [
        Step(recvs=(Recv(1, 0, R("output", 0, 4)),)),
        Step(sends=(Send(1, 1, R("output", 2, 2)),)),
    ]
    s1 = [Step(sends=(Send(0, 0, R("input", 0, 4)),), recvs=(Recv(0, 1, R("output", 0, 2)),))]
    with pytest.raises(ScheduleError, match="steps 0 and 1 are not ordered") as e:
        two_rank(s0, s1).validate()
    one_line(e)
    # ordering them by a dependency fixes it
    s0[1] = Step(deps=(0,), sends=(Send(1, 1, R("output", 2, 2)),))
    two_rank(s0, s1).validate()
    # reads never conflict
    two_rank([Step(sends=(Send(1, 0, R("input", 0, 4)),)), Step(sends=(Send(1, 1, R("input", 0, 4)),))],
             [Step(recvs=(Recv(0, 0, R("output", 0, 4)),)),
              Step(deps=(0,), recvs=(Recv(0, 1, R("output", 0, 4)),))]).validate()


def test_in_step_conflicts():
    with pytest.raises(ScheduleError, match="overlapping regions"):
        Step(recvs=(Recv(1, 0, R("output", 0, 4)), Recv(2, 0, R("output", 3, 2), "reduce")))
    with pytest.raises(ScheduleError, match="overlaps send"):
        Step(sends=(Send(1, 0, R("output", 0, 4)),), recvs=(Recv(1, 0, R("output", 2, 2)),))
    with pytest.raises(ScheduleError, match="overlaps its destination"):
        Local(R("output", 0, 4), R("output", 2, 4))
    with pytest.raises(ScheduleError, match="sizes differ"):
        Local(R("input", 0, 4), R("output", 0, 3))


def test_bounds_buffers_and_read_only_input():
    bufs = {"input": 4, "output": 4}
    with pytest.raises(ScheduleError, match=r"out of bounds \(buffer 'output' has 4 elements\)"):
        RankProgram(0, bufs, (Step(recvs=(Recv(1, 0, R("output", 2, 3)),)),))
    with pytest.raises(ScheduleError, match="unknown buffer 'scratch'"):
        RankProgram(0, bufs, (Step(sends=(Send(1, 0, R("scratch", 0, 1)),)),))
    with pytest.raises(ScheduleError, match="read-only buffer 'input'"):
        RankProgram(0, bufs, (Step(recvs=(Recv(1, 0, R("input", 0, 1)),)),))
    with pytest.raises(ScheduleError, match="itself"):
        RankProgram(0, bufs, (Step(sends=(Send(0, 0, R("input", 0, 1)),)),))
    with pytest.raises(ScheduleError, match="missing buffer 'output'"):
        RankProgram(0, {"input": 4}, ())
    with pytest.raises(ScheduleError, match="region count must be >= 1"):
        R("input", 0, 0)
    with pytest.raises(ScheduleError, match="buffer name"):
        R("Input!", 0, 1)
    with pytest.raises(ScheduleError, match="peer 5 out of range"):
        two_rank([Step(sends=(Send(5, 0, R("input", 0, 1)),))], [])
    with pytest.raises(ScheduleError, match="action must be"):
        Recv(1, 0, R("output", 0, 1), "max")


def test_schedule_level_checks():
    with pytest.raises(ScheduleError, match="unknown collective 'allreduce2'"):
        two_rank([], [], collective="allreduce2")
    with pytest.raises(ScheduleError, match="needs a root"):
        two_rank([], [], collective="broadcast")
    # output size must fit the collective
    with pytest.raises(ScheduleError, match="allgather needs 8"):
        two_rank([], [], collective="allgather").validate()
    with pytest.raises(ScheduleError, match="input buffer has 4 elements, count is 5"):
        Schedule("custom", 1, 5, (RankProgram(0, {"input": 4, "output": 0}, ()),))


def test_simulate_checks_inputs():
    s = make_schedule("allreduce", 3, 12)
    with pytest.raises(ScheduleError, match="need 3 input arrays"):
        simulate(s, [np.zeros(3)] * 2)
    with pytest.raises(ScheduleError, match=r"shape \(4,\), need \(3,\)"):
        simulate(s, [np.zeros(3), np.zeros(3), np.zeros(4)])


# ---------------------------------------------------------------------------------------------- expected outputs


def test_expected_outputs_from_first_principles():
    x = [np.array([1.0, 2, 3, 4, 5]), np.array([10.0, 20, 30, 40, 50]), np.array([100.0, 200, 300, 400, 500])]
    total = np.array([111.0, 222, 333, 444, 555])
    assert all(np.array_equal(o, total) for o in expected_outputs("allreduce", x))
    rs = expected_outputs("reducescatter", x)
    assert [o.tolist() for o in rs] == [[111, 222], [333, 444], [555]]
    assert all(np.array_equal(o, np.concatenate(x)) for o in expected_outputs("allgather", x))
    bc = expected_outputs("broadcast", x, root=2)
    assert all(np.array_equal(o, x[2]) for o in bc)
    g = expected_outputs("gather", x, root=1)
    assert g[0].size == 0 and np.array_equal(g[1], np.concatenate(x)) and g[2].size == 0
    red = expected_outputs("reduce", x, root=0)
    assert np.array_equal(red[0], total) and red[1].size == 0
    pl = expected_outputs("pipeline", x)
    assert pl[0].size == 0 and np.array_equal(pl[2], x[0])
    a2a = expected_outputs("alltoall", x)  # blocks of sizes 2, 2, 1
    assert a2a[0].tolist() == [1, 2, 10, 20, 100, 200]
    assert a2a[2].tolist() == [5, 50, 500]
    skew = expected_outputs("alltoall", x, splits=[[5, 0, 0], [0, 0, 5], [1, 1, 3]])
    assert skew[0].tolist() == [1, 2, 3, 4, 5, 100] and skew[1].tolist() == [200]
    with pytest.raises(ScheduleError, match="splits"):
        expected_outputs("alltoall", x, splits=[[5, 0, 0], [0, 0, 4], [1, 1, 3]])
    with pytest.raises(ScheduleError, match="root"):
        expected_outputs("broadcast", x, root=3)


def test_split_evenly_spreads_remainder():
    assert split_evenly(10, 4) == [3, 3, 2, 2]
    assert split_evenly(2, 4) == [1, 1, 0, 0]
    assert sum(split_evenly(1001, 7)) == 1001


# ---------------------------------------------------------------------------------------------- cost model


def test_busbw_factors_match_nccl_tests():
    n = 8
    assert busbw_factor("allreduce", n) == pytest.approx(2 * 7 / 8)
    for c in ("allgather", "reducescatter", "alltoall", "reduce_scatter", "all-gather"):
        assert busbw_factor(c, n) == pytest.approx(7 / 8)
    for c in ("broadcast", "reduce", "pipeline", "sendrecv"):
        assert busbw_factor(c, n) == 1.0
    with pytest.raises(ScheduleError, match="no bus-bandwidth factor"):
        busbw_factor("allmagic", n)


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce",
                                        "gather", "pipeline"])
def test_alpha_beta_bound(collective):
    n, S, B = 8, 1 << 20, 1e9
    bw_only = alpha_beta_bound_s(collective, n, S, B, 0.0)
    assert bw_only == pytest.approx(nccl_size_bytes(collective, n, S) * busbw_factor(collective, n) / B)
    with_lat = alpha_beta_bound_s(collective, n, S, B, 1e-6)
    hops = n - 1 if collective == "pipeline" else math.ceil(math.log2(n))
    assert with_lat - bw_only == pytest.approx(hops * 1e-6)


def test_ring_allreduce_bytes_meet_the_bound():
    n, S, B = 8, 8 * 4 * 1000, 1e9
    s = make_schedule("allreduce", n, S)
    assert s.bytes_sent(0) / B == pytest.approx(alpha_beta_bound_s("allreduce", n, S, B, 0.0))


def test_cost_model_errors():
    with pytest.raises(ScheduleError, match="link_bytes_per_s"):
        alpha_beta_bound_s("allreduce", 4, 100, 0, 0)
    with pytest.raises(ScheduleError, match="latency_s"):
        alpha_beta_bound_s("allreduce", 4, 100, 1e9, -1)
    with pytest.raises(ScheduleError, match="message_bytes"):
        alpha_beta_bound_s("allreduce", 4, 0, 1e9, 0)


# ---------------------------------------------------------------------------------------------- make_schedule errors


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        (("allmagic", 4, 1024), {}, "unknown collective 'allmagic'"),
        (("allreduce", 1, 1024), {}, "ranks must be >= 2"),
        (("allreduce", 4, 0), {}, "message_bytes must be >= 1"),
        (("allreduce", 4, -8), {}, "message_bytes must be >= 1"),
        (("allreduce", 4, 1022), {}, "not a multiple of the float32 element size 4"),
        (("allreduce", 4, 1024), {"chunks": 0}, "chunks must be >= 1"),
        (("allreduce", 4, 1024), {"chunks": 2.5}, "chunks must be an integer"),
        (("allreduce", 4.0, 1024), {}, "ranks must be an integer"),
        (("allreduce", 4, 1024), {"algorithm": "butterfly"}, "unknown algorithm 'butterfly' for allreduce"),
        (("allreduce", 4, 1024), {"root": 1}, "unknown option 'root' for allreduce/ring"),
        (("broadcast", 4, 1024), {"root": 4}, "root must be a rank in 0..3"),
        (("alltoall", 4, 1024), {"skew": -1.0}, "skew must be a finite number >= 0"),
        (("allreduce", 4, 1024), {"dtype": "bfloat16"}, "unsupported dtype 'bfloat16'"),
        (("allreduce", 4, 1024), {"seed": "x"}, "seed must be an integer"),
        ((None, 4, 1024), {}, "collective must be a string"),
    ],
)
def test_make_schedule_errors_are_one_line(args, kwargs, match):
    with pytest.raises(ScheduleError, match=match) as e:
        make_schedule(*args, **kwargs)
    one_line(e)
    assert isinstance(e.value, ValueError)


def test_aliases_and_algorithm_listing():
    assert canonical_collective("All-Reduce") == "allreduce"
    assert canonical_collective("incast") == "gather"
    assert algorithms("allreduce")[0] == "ring"
    assert set(algorithms("allreduce")) == {"ring", "tree", "double_tree", "halving_doubling", "hierarchical"}
    s = make_schedule("incast", 4, 400)
    assert s.collective == "gather" and s.root == 0
    assert s.param("message_bytes") == 400 and s.message_bytes == 400


def test_chunks_larger_than_data_drop_empty_pieces():
    s = make_schedule("allreduce", 4, 4 * 4, chunks=16)  # one element per segment
    assert all(s.num_steps(r) == 6 for r in range(4))
    for p in s.programs:
        for stp in p.steps:
            assert not stp.is_empty
