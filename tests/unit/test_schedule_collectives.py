"""Every schedule generator: valid DAG, correct result, exact byte accounting, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traffic.collectives import GENERATORS, make_schedule, moe_splits, nccl_btree, nccl_double_tree
from traffic.schedule import ScheduleError, expected_output, random_inputs, split_evenly

ALL = sorted(GENERATORS)
ROOTED = {"broadcast", "reduce", "gather"}


def _check(s, seed=0):
    x = random_inputs(s, seed)
    got = s.simulate(x)
    want = s.expected_outputs(x)
    assert len(got) == s.ranks
    for r, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.dtype(s.dtype)
        assert np.array_equal(g, w), f"rank {r} of {s.collective}/{s.algorithm}"
        # what an agent computes for itself, one input at a time, is the same result
        mine = expected_output(s, seed, r)
        assert mine.dtype == w.dtype and np.array_equal(mine, w), f"expected_output, rank {r} of {s.collective}"


@pytest.mark.parametrize("collective,algorithm", ALL)
@pytest.mark.parametrize("ranks", range(2, 17))
def test_every_generator_every_rank_count(collective, algorithm, ranks):
    for count, chunks in ((ranks * 6, 1), (ranks * 5 + 3, 3), (7, 2)):
        s = make_schedule(collective, ranks, count * 4, chunks=chunks, algorithm=algorithm)
        assert s.collective == collective and s.algorithm == algorithm and s.count == count
        _check(s, seed=ranks)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gen=st.sampled_from(ALL),
    ranks=st.integers(2, 16),
    count=st.integers(1, 300),
    chunks=st.integers(1, 6),
    root=st.integers(0, 15),
    dtype=st.sampled_from(["float32", "float64", "int64", "float16"]),
    seed=st.integers(0, 2**31),
)
def test_random_sizes_simulate_matches_first_principles(gen, ranks, count, chunks, root, dtype, seed):
    collective, algorithm = gen
    opts = {"root": root % ranks} if collective in ROOTED else {}
    if collective == "alltoall":
        opts["skew"] = (seed % 7) / 3.0
    itemsize = np.dtype(dtype).itemsize
    s = make_schedule(collective, ranks, count * itemsize, chunks=chunks, seed=seed, algorithm=algorithm, dtype=dtype,
                      **opts)
    _check(s, seed)


def _delivery(s):
    """(src, dst) -> list of (src region, dst region) for every transfer."""
    recvs = {}
    for p in s.programs:
        for stp in p.steps:
            for r in stp.recvs:
                recvs[(r.peer, p.rank, r.tag)] = r
    out = {}
    for p in s.programs:
        for stp in p.steps:
            for snd in stp.sends:
                rv = recvs.pop((p.rank, snd.peer, snd.tag))
                out.setdefault((p.rank, snd.peer), []).append((snd.src, rv.dst))
    assert not recvs
    return out


@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8, 12, 16])
@pytest.mark.parametrize("chunks", [1, 4])
def test_ring_allreduce_bytes_exact(ranks, chunks):
    S = ranks * chunks * 4 * 10  # divisible by ranks and chunks
    s = make_schedule("allreduce", ranks, S, chunks=chunks)
    for r in range(ranks):
        assert s.bytes_sent(r) * ranks == 2 * (ranks - 1) * S
        assert s.bytes_received(r) * ranks == 2 * (ranks - 1) * S
        assert s.num_steps(r) == 2 * (ranks - 1) * chunks
        # only to the right neighbour, only from the left one
        peers = {snd.peer for stp in s.steps(r) for snd in stp.sends}
        assert peers == {(r + 1) % ranks}
    # every piece of the reduce-scatter phase moves once per ring hop: each rank sends each of n-1 segments once per
    # phase
    d = _delivery(s)
    assert set(d) == {(r, (r + 1) % ranks) for r in range(ranks)}


@pytest.mark.parametrize("ranks", [2, 3, 7, 16])
def test_ring_allgather_and_reducescatter_bytes(ranks):
    S = ranks * 4 * 8
    ag = make_schedule("allgather", ranks, S)
    rs = make_schedule("reducescatter", ranks, S)
    for r in range(ranks):
        assert ag.bytes_sent(r) == (ranks - 1) * S
        assert rs.bytes_sent(r) * ranks == (ranks - 1) * S
        assert ag.num_steps(r) == rs.num_steps(r) == ranks - 1


@pytest.mark.parametrize("ranks", [2, 4, 8, 16])
def test_halving_doubling_power_of_two_bytes_and_rounds(ranks):
    S = ranks * 4 * 16
    s = make_schedule("allreduce", ranks, S, algorithm="halving_doubling")
    log = ranks.bit_length() - 1
    for r in range(ranks):
        assert s.bytes_sent(r) * ranks == 2 * (ranks - 1) * S
        assert s.num_steps(r) == 2 * log


def test_halving_doubling_non_power_of_two_policy():
    make_schedule("allreduce", 6, 4 * 60, algorithm="halving_doubling")  # pre/post step by default
    with pytest.raises(ScheduleError, match="power-of-two"):
        make_schedule("allreduce", 6, 4 * 60, algorithm="halving_doubling", non_power_of_two="error")
    make_schedule("allreduce", 8, 4 * 64, algorithm="halving_doubling", non_power_of_two="error")


@pytest.mark.parametrize("ranks", [2, 3, 5, 8, 13, 16])
@pytest.mark.parametrize("skew", [0.0, 0.7, 2.0])
def test_alltoall_delivers_full_matrix_exactly_once(ranks, skew):
    count = 40 * ranks + 3
    s = make_schedule("alltoall", ranks, count * 4, chunks=3, seed=11, skew=skew)
    splits = s.splits if s.splits is not None else [split_evenly(count, ranks)] * ranks
    d = _delivery(s)
    for i in range(ranks):
        assert sum(splits[i]) == count
        for j in range(ranks):
            if i == j:
                assert (i, j) not in d
                continue
            moved = sum(src.count for src, _ in d.get((i, j), []))
            assert moved == splits[i][j]
            # the pieces tile the block exactly once, in both buffers
            srcs = sorted((a.offset, a.count) for a, _ in d.get((i, j), []))
            pos = sum(splits[i][:j])
            for off, cnt in srcs:
                assert off == pos
                pos += cnt
            assert pos == sum(splits[i][: j + 1])
    _check(s, 5)
    if skew == 0:
        assert s.splits is None


def test_alltoall_skew_is_uneven_and_deterministic():
    a = moe_splits(8, 1000, 1.5, 42)
    assert a == moe_splits(8, 1000, 1.5, 42)
    assert a != moe_splits(8, 1000, 1.5, 43)
    cols = [sum(row[j] for row in a) for j in range(8)]
    assert max(cols) > 3 * min(cols)  # a hot expert
    assert all(sum(row) == 1000 for row in a)
    # pinned values: the skew must not drift across Python/NumPy versions
    assert moe_splits(4, 100, 1.0, 0) == ((19, 50, 15, 16), (19, 47, 17, 17), (25, 40, 21, 14), (14, 54, 19, 13))
    assert moe_splits(3, 12, 2.0, 5) == ((9, 1, 2), (10, 0, 2), (9, 1, 2))
    assert moe_splits(3, 10, 0, 9) == ((4, 3, 3),) * 3


@pytest.mark.parametrize("gen", ALL)
def test_deterministic_for_a_seed(gen):
    collective, algorithm = gen
    a = make_schedule(collective, 6, 4 * 100, chunks=2, seed=7, algorithm=algorithm)
    b = make_schedule(collective, 6, 4 * 100, chunks=2, seed=7, algorithm=algorithm)
    assert a == b and hash(a) == hash(b)


def test_every_chunk_delivered_exactly_once_to_the_right_rank():
    # in all-gather every rank must receive every other rank's block exactly once, tiled by the pieces
    n, count = 5, 23
    s = make_schedule("allgather", n, count * 4, chunks=4)
    for r in range(n):
        got = sorted((rv.dst.offset, rv.dst.count) for stp in s.steps(r) for rv in stp.recvs)
        pos, blocks = 0, []
        for off, cnt in got:
            assert off >= pos
            pos = off + cnt
            blocks.append(off // count)
        covered = np.zeros(n * count, dtype=int)
        for off, cnt in got:
            covered[off : off + cnt] += 1
        expect = np.ones(n * count, dtype=int)
        expect[r * count : (r + 1) * count] = 0
        assert np.array_equal(covered, expect)
    # gather: the root receives each sender's input once
    g = make_schedule("incast", n, count * 4, chunks=3, root=2)
    d = _delivery(g)
    assert set(d) == {(i, 2) for i in range(n) if i != 2}
    assert all(sum(a.count for a, _ in v) == count for v in d.values())


def test_tree_shapes():
    for n in range(2, 70):
        t = nccl_btree(n)
        assert t.root == 0 and all(len(c) <= 2 for c in t.children)
        t1, t2 = nccl_double_tree(n)
        assert all(len(c) <= 2 for c in t2.children)
        if n % 2 == 0 and n >= 4:
            # NCCL's property: a rank that is interior in one tree is a leaf in the other (mostly)
            interior_both = [r for r in range(n) if t1.children[r] and t2.children[r]]
            assert len(interior_both) <= 2
        assert t1.depth() <= n.bit_length() + 1


def test_double_tree_splits_load():
    n, S = 8, 8 * 4 * 64
    single = make_schedule("allreduce", n, S, algorithm="tree")
    double = make_schedule("allreduce", n, S, algorithm="double_tree")
    assert max(double.bytes_sent(r) for r in range(n)) < max(single.bytes_sent(r) for r in range(n))


def test_pipeline_and_broadcast_bytes():
    n, S = 6, 4 * 60
    p = make_schedule("pipeline", n, S, chunks=5)
    assert [p.bytes_sent(r) for r in range(n)] == [S] * (n - 1) + [0]
    assert [p.bytes_received(r) for r in range(n)] == [0] + [S] * (n - 1)
    for alg in ("ring", "tree"):
        b = make_schedule("broadcast", n, S, algorithm=alg, root=3)
        assert sum(b.bytes_received(r) for r in range(n)) == (n - 1) * S
        assert b.bytes_received(3) == 0
