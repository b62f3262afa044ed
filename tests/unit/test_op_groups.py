"""The collective scenario records each grouped op's communicators in the manifest (``op_groups``): the ranks its
schedule's sends and receives join, so the report measures a grouped op's arrival skew per group."""

from __future__ import annotations

from testbed.workloads.collective import op_groups
from tests.unit.test_parallelism import HOSTS, KNOBS
from traffic.jobplan import plan_job


def test_grouped_ops_name_their_groups_and_plain_ops_none():
    pl = plan_job(KNOBS, HOSTS, 1)  # tp=2 over 8 ranks, tp-dp order: TP pairs (0, 1), (2, 3), ...; DP the rest
    g = op_groups(pl)
    assert g["tp.l0.mb0.fwd0"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp.bucket0"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    strided = op_groups(plan_job({**KNOBS, "rank_order": "dp-tp"}, HOSTS, 1))
    assert strided["tp.l0.mb0.fwd0"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert op_groups(plan_job({**KNOBS, "tp": 1}, HOSTS, 1)) == {}  # a plain all-reduce: one group, nothing written
