"""Per-packet spraying plan (topologies/spray.py): groups, shared far-end MACs, the random cascade."""

from __future__ import annotations

import random

import pytest

from topologies import DumbbellSpec, LeafSpineSpec, LinkSpec, SpecError
from topologies.spray import SprayGroup, cascade_thresholds, shared_macs, spray_groups


def leafspine(spines=2, **kw):
    return LeafSpineSpec(spines=spines, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(10),
                         fabric_link=LinkSpec(10), load_balancing="spray", **kw)


def test_groups_are_the_leaves_uplinks():
    groups = spray_groups(leafspine(spines=3))
    assert groups == (SprayGroup("leaf1", ("spine1", "spine2", "spine3")),
                      SprayGroup("leaf2", ("spine1", "spine2", "spine3")))


def test_no_groups_without_multipath():
    assert spray_groups(leafspine(spines=1)) == ()
    assert spray_groups(DumbbellSpec(senders=2, sender_link=LinkSpec(10), bottleneck_link=LinkSpec(5))) == ()


def test_far_ends_of_a_group_share_one_mac_and_groups_differ():
    t = leafspine(spines=3)
    macs = shared_macs(t, spray_groups(t))
    assert set(macs) == {(f"spine{s}", f"leaf{l}") for s in (1, 2, 3) for l in (1, 2)}
    assert len({macs[(f"spine{s}", "leaf1")] for s in (1, 2, 3)}) == 1
    assert macs[("spine1", "leaf1")] != macs[("spine1", "leaf2")]
    assert macs[("spine1", "leaf1")] == t.addresses[("spine1", "leaf1")].mac  # the first far end's own


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_cascade_gives_every_port_one_kth(k):
    th = cascade_thresholds(k)
    assert len(th) == k - 1
    # exact: P(n-th fires) = prod_{m<n} (1 - p_m) * p_n with p_n = th[n] / 2^32
    left, shares = 1.0, []
    for t in th:
        shares.append(left * t / 2**32)
        left -= shares[-1]
    shares.append(left)
    assert shares == pytest.approx([1 / k] * k, abs=1e-6)
    # and by drawing, as the kernel does (a fresh number per filter)
    rng = random.Random(1)
    counts = [0] * k
    for _ in range(40_000):
        for n, t in enumerate(th):
            if rng.getrandbits(32) < t:
                counts[n] += 1
                break
        else:
            counts[-1] += 1
    assert all(abs(c / 40_000 - 1 / k) < 0.015 for c in counts), counts


def test_moves_skip_the_port_itself():
    g = SprayGroup("leaf1", ("spine1", "spine2", "spine3"))
    assert [p for p, _ in g.moves("spine2")] == ["spine1", "spine3"]
    with pytest.raises(ValueError):
        cascade_thresholds(1)


def test_mixed_multipath_sets_are_refused():
    class Odd:
        routes = ()

    from topologies.spec import NextHop, Route

    Odd.routes = (Route("r1", "10.0.0.0/24", (NextHop("a", "1.1.1.1"), NextHop("b", "1.1.1.3"))),
                  Route("r1", "10.0.1.0/24", (NextHop("a", "1.1.1.1"), NextHop("c", "1.1.1.5"))))
    with pytest.raises(SpecError, match="spray needs every multipath route of r1 to use the same ports"):
        spray_groups(Odd())
