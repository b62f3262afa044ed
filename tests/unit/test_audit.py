"""`testbed audit`, the pure parts: the scale list, the plan (ranks x k on as many leaves of the same shape as
they need; strong scaling divides each rank's compute by k), bad input refused before anything runs, and the
efficiency table against the first point."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from testbed.commands import audit
from testbed.errors import UsageError
from testbed.scenario import get

COLL = get("collective")


def test_scale_lists_start_at_one_and_grow():
    assert audit.parse_scale("1,2,4") == (1, 2, 4)
    for bad in ("2,4", "1,4,2", "1,x", "1,1"):
        with pytest.raises(UsageError, match="--scale"):
            audit.parse_scale(bad)


def test_the_plan_grows_leaves_of_the_same_shape_and_strong_scaling_shrinks_compute():
    pl = audit.plan(COLL, ["ranks=4", "hosts_per_leaf=4", "spines=2", "compute_ms=100"], (1, 2, 4), "strong")
    got = [(p.params["ranks"], p.params["leaves"], p.params["spines"], p.params["compute_ms"]) for p in pl.points]
    assert got == [(4, 1, 2, 100), (8, 2, 2, 50), (16, 4, 2, 25)]
    assert [p.dirname for p in pl.points] == ["ranks=4", "ranks=8", "ranks=16"]
    weak = audit.plan(COLL, ["ranks=3", "hosts_per_leaf=2", "compute_ms=100"], (1, 2), "weak")
    assert [(p.params["leaves"], p.params["compute_ms"]) for p in weak.points] == [(2, 100), (3, 100)]


@pytest.mark.parametrize("sets, says", [(["leaves=4"], "grows the leaves itself"),
                                        (["ranks=200", "hosts_per_leaf=1"], r"2x \(400 ranks, 400 leaves\)"),
                                        (["topology_file=x.toml"], "topology_file")])
def test_bad_audits_are_refused_in_one_line(sets, says):
    with pytest.raises(UsageError, match=says):
        audit.plan(COLL, sets, (1, 2), "weak")


def test_efficiency_and_verdict_against_the_first_point():
    df = pd.DataFrame({"ranks": [4, 8, 16], "complete": [True, True, True], "step_ms_p50": [100.0, 110.0, 200.0],
                       "step_ms_p99": [120.0, 150.0, 300.0]})
    weak = audit.audit_table(df, (1, 2, 4), "weak")
    assert list(weak["efficiency"].round(3)) == [1.0, 0.909, 0.5]
    assert list(weak["verdict"]) == ["good", "good", "poor"]
    assert weak["efficiency_p99"].iloc[2] == pytest.approx(0.4)
    strong = audit.audit_table(df, (1, 2, 4), "strong")
    assert strong["efficiency"].iloc[1] == pytest.approx(100 / (2 * 110))
    failed = audit.audit_table(df.assign(complete=[True, False, True]), (1, 2, 4), "weak")
    assert failed["verdict"].iloc[1] == "n/a" and math.isnan(failed["efficiency"].iloc[1])
