"""Servers with several GPUs (pure logic): the hierarchical all-reduce's result equals the sum on every rank, it
sends across servers exactly the bytes NCCL's two-level algorithm does, and placement packs a server's ranks."""

from __future__ import annotations

import numpy as np
import pytest

from traffic.collectives import make_schedule
from traffic.placement import PlacementError, place
from traffic.schedule import ScheduleError, expected_outputs, random_inputs, simulate


def cross_server_bytes(s, g):
    return sum(x.src.count * s.itemsize for p in s.programs for st in p.steps for x in st.sends
               if x.peer // g != p.rank // g)


@pytest.mark.parametrize("n,g,count,chunks", [(4, 2, 1000, 1), (8, 2, 4096, 2), (6, 3, 999, 1), (4, 1, 100, 1),
                                              (4, 4, 64, 1), (8, 4, 1024, 3), (2, 2, 8, 1), (9, 3, 27, 2)])
def test_hierarchical_allreduce_sums_on_every_rank(n, g, count, chunks):
    s = make_schedule("allreduce", n, count * 4, chunks=chunks, algorithm="hierarchical", local_size=g)
    s.validate()
    ins = random_inputs(s, seed=3)
    out, exp = simulate(s, ins), expected_outputs("allreduce", ins)
    assert all(np.array_equal(out[r], exp[r]) for r in range(n))
    assert s.algorithm == "hierarchical" and dict(s.params)["local_size"] == g


@pytest.mark.parametrize("servers,g", [(2, 2), (4, 2), (2, 4), (3, 2)])
def test_only_each_rails_slice_crosses_the_fabric(servers, g):
    """Per server, the fabric carries G ranks x 2(S-1)/S of a 1/G slice = 2(S-1)/S of the message; a flat ring
    over the same ranks (packed) sends 2(n-1)/n of it from the one rank per server whose neighbour is elsewhere."""
    n, count = servers * g, 48 * servers * g
    msg = count * 4
    h = make_schedule("allreduce", n, msg, algorithm="hierarchical", local_size=g)
    flat = make_schedule("allreduce", n, msg)
    assert cross_server_bytes(h, g) == servers * 2 * (servers - 1) * msg // servers
    assert cross_server_bytes(flat, g) == servers * 2 * (n - 1) * msg // n
    assert cross_server_bytes(h, g) < cross_server_bytes(flat, g)


def test_local_size_must_divide_the_ranks():
    with pytest.raises(ScheduleError, match="local_size must be a positive divisor of ranks"):
        make_schedule("allreduce", 6, 4096, algorithm="hierarchical", local_size=4)


HOSTS = [("h1", "leaf1"), ("h2", "leaf1"), ("h3", "leaf2"), ("h4", "leaf2")]


def test_a_servers_ranks_are_consecutive_and_the_policy_places_servers():
    p = place(8, HOSTS, "packed", per_host=2)
    assert p.hosts == ("h1", "h1", "h2", "h2", "h3", "h3", "h4", "h4")
    assert [p.local_rank(r) for r in range(8)] == [0, 1] * 4
    s = place(6, HOSTS, "spread", per_host=2)
    assert s.hosts == ("h1", "h1", "h3", "h3", "h2", "h2") and s.leaves[2] == "leaf2"
    assert place(3, HOSTS, "packed", per_host=2).hosts == ("h1", "h1", "h2")
    with pytest.raises(PlacementError, match="9 ranks at 2 per host need 5 hosts; there are 4"):
        place(9, HOSTS, per_host=2)
    with pytest.raises(PlacementError, match="more than one rank"):
        type(p)(("h1", "h1"), ("leaf1", "leaf1"))
