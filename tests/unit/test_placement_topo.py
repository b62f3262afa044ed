"""placement=topo (fewest leaves, TP/EP blocks inside a server or leaf) and ``avoid`` (hosts, leaves, links)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traffic.placement import PlacementError, place, spine_crossings

H8 = [(f"h{i}", f"leaf{(i - 1) // 4 + 1}") for i in range(1, 9)]  # 2 leaves x 4 hosts
H9 = [(f"h{i}", f"leaf{(i - 1) // 3 + 1}") for i in range(1, 10)]  # 3 leaves x 3 hosts


def test_topo_on_a_clean_fabric_keeps_the_job_on_one_leaf_like_packed():
    assert place(4, H8, "topo").hosts == place(4, H8, "packed").hosts == ("h1", "h2", "h3", "h4")
    p = place(8, H8, "topo")
    assert p.policy == "topo" and spine_crossings(p.leaves) == 2  # one hop out of each leaf and back


def test_topo_keeps_tp_groups_inside_a_leaf_where_packed_splits_one():
    """3 hosts a leaf, TP groups of 2 consecutive ranks: packed puts ranks 2, 3 on leaf1 and leaf2; topo leaves
    h3 idle and keeps both groups whole."""
    packed, topo = place(4, H9, "packed"), place(4, H9, "topo", group=2)
    assert packed.leaves[2] != packed.leaves[3]
    assert topo.hosts == ("h1", "h2", "h4", "h5")
    assert all(topo.leaves[r] == topo.leaves[r + 1] for r in (0, 2))


def test_topo_keeps_tp_groups_inside_a_server():
    p = place(8, H8, "topo", per_host=2, group=2)
    assert p.hosts == ("h1", "h1", "h2", "h2", "h3", "h3", "h4", "h4")
    assert all(p.hosts[r] == p.hosts[r + 1] for r in range(0, 8, 2))


def test_topo_picks_the_leaf_that_holds_the_job_when_another_has_a_hole():
    assert place(4, H8, "topo", avoid={"h2"}).hosts == ("h5", "h6", "h7", "h8")
    assert place(4, H8, "packed", avoid={"h2"}).hosts == ("h1", "h3", "h4", "h5")  # packed crosses the spine


def test_topo_fewest_leaves_largest_first():
    hosts = [("a", "L1"), ("b", "L2"), ("c", "L2"), ("d", "L3"), ("e", "L3"), ("f", "L3")]
    p = place(5, hosts, "topo")
    assert set(p.leaves) == {"L2", "L3"} and spine_crossings(p.leaves) == 2


def test_a_flagged_link_keeps_crossing_jobs_off_its_leaf_but_not_a_job_inside_it():
    bad = {"leaf1-spine1"}
    assert place(4, H8, "topo", avoid=bad).hosts == ("h5", "h6", "h7", "h8")  # the clean leaf first
    assert place(4, [h for h in H8 if h[1] == "leaf1"], "topo", avoid=bad).hosts == ("h1", "h2", "h3", "h4")
    with pytest.raises(PlacementError, match="6 ranks need 6 hosts; 4 usable"):
        place(6, H8, "topo", avoid=bad)
    with pytest.raises(PlacementError, match="4 usable"):  # packed does not know where its ring crosses
        place(5, H8, "packed", avoid=bad)


def test_avoided_leaf_and_random():
    p = place(4, H8, "random", seed=3, avoid={"leaf1"})
    assert set(p.leaves) == {"leaf2"}
    with pytest.raises(PlacementError, match="5 ranks need 5 hosts; 4 usable \\(avoiding leaf1\\)"):
        place(5, H8, "topo", avoid={"leaf1"})


@settings(max_examples=80, deadline=None)
@given(ranks=st.integers(1, 9), avoid=st.sets(st.sampled_from([h for h, _ in H9] + ["leaf2"]), max_size=3),
       group=st.sampled_from([1, 2, 3]))
def test_topo_never_uses_what_it_avoids_and_keeps_groups_whole(ranks, avoid, group):
    left = [(h, lf) for h, lf in H9 if h not in avoid and lf not in avoid]
    if ranks > len(left):
        with pytest.raises(PlacementError):
            place(ranks, H9, "topo", avoid=avoid, group=group)
        return
    p = place(ranks, H9, "topo", avoid=avoid, group=group)
    assert len(set(p.hosts)) == ranks and not (set(p.hosts) | set(p.leaves)) & avoid
    used = len(set(p.leaves))
    if group == 1:  # fewest leaves, each one block of consecutive ranks: the ring crosses once per leaf used
        assert spine_crossings(p.leaves) <= spine_crossings(place(ranks, left, "packed").leaves)
        assert spine_crossings(p.leaves) == (0 if used == 1 else used)
    per_leaf = {lf: sum(1 for h, x in left if x == lf) // group * group for lf in {x for _, x in left}}
    if ranks % group == 0 and sum(per_leaf.values()) >= ranks:  # whole groups fit: none straddles two leaves
        assert all(len(set(p.leaves[r:r + group])) == 1 for r in range(0, ranks, group))


def test_bad_group():
    with pytest.raises(PlacementError, match="group must be an integer >= 1"):
        place(2, H8, "topo", group=0)


def test_the_collective_job_hands_its_tp_groups_to_topo():
    """A tp=2 job on 3 leaves x 3 hosts: packed splits ranks 2, 3 (a TP group) across leaf1 and leaf2; topo keeps
    each TP pair on one leaf (traffic.jobplan.rank_group: tp x ep with rank order tp-dp)."""
    from testbed.workloads.settings import CollectiveSettings, Parallel
    from topologies import LeafSpineSpec, LinkSpec

    spec = LeafSpineSpec(spines=1, leaves=3, hosts_per_leaf=3, host_link=LinkSpec(20), fabric_link=LinkSpec(20))
    topo = CollectiveSettings(parallel=Parallel(tp=2), ranks=4, placement="topo").plan(spec, 1).placement
    packed = CollectiveSettings(parallel=Parallel(tp=2), ranks=4, placement="packed").plan(spec, 1).placement
    assert packed.hosts == ("h1", "h2", "h3", "h4") and topo.hosts == ("h1", "h2", "h4", "h5")
    strided = CollectiveSettings(parallel=Parallel(tp=2, rank_order="dp-tp"), ranks=4, placement="topo")
    assert strided.plan(spec, 1).placement.hosts == ("h1", "h2", "h3", "h4")  # no consecutive groups to keep
