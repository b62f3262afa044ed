"""A grouped op (every tensor-parallel group's all-reduce of a layer at once) on the per-rank timeline, the story's
late rank and the Perfetto trace: a rank waits for the last rank of its own group, never for another group's.

The hand-made op: groups {0, 1} and {2, 3}. Group A joins at 1.000 and 1.001 s and ends at 1.05 s; group B joins
at 1.100 (rank 2) and 1.400 (rank 3: 300 ms late within its group) and ends at 1.45 s. Taken as one group, ranks 0
and 1 would be painted as waiting their whole op for rank 3."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis import metrics as m
from analysis.load import load_run
from analysis.story import late_rank
from analysis.trace import trace_events

GROUPS = {"tp.l0": [[0, 1], [2, 3]]}
STARTS = {0: 1.000, 1: 1.001, 2: 1.100, 3: 1.400}
ENDS = {0: 1.05, 1: 1.05, 2: 1.45, 3: 1.45}


def _ops(iterations: int = 3) -> pd.DataFrame:
    return pd.DataFrame([{"iteration": it, "op": "tp.l0", "op_index": 0, "collective": "allreduce", "rank": r,
                          "host": f"h{r + 1}", "start_s": s + it, "end_s": ENDS[r] + it, "bytes_sent": 1,
                          "bytes_recv": 1, "wait_s": 0.0} for it in range(iterations) for r, s in STARTS.items()])


def test_a_rank_waits_only_for_its_own_groups_last_arrival():
    split = m.rank_op_split(_ops(1), GROUPS).set_index("rank")
    assert split.loc[0, "arrival_wait_s"] == pytest.approx(0.001) and split.loc[1, "arrival_wait_s"] == 0.0
    assert split.loc[2, "arrival_wait_s"] == pytest.approx(0.300) and split.loc[3, "arrival_wait_s"] == 0.0
    assert split.loc[0, "transfer_s"] == pytest.approx(0.049)
    # without the groups the op is one communicator: ranks 0 and 1 "wait" all their op for rank 3
    whole = m.rank_op_split(_ops(1)).set_index("rank")
    assert whole.loc[0, "arrival_wait_s"] == pytest.approx(0.05) and whole.loc[0, "transfer_s"] == 0.0
    tl = m.rank_timeline(_ops(1), GROUPS)
    waits = tl[tl["kind"] == "wait"].assign(s=lambda d: d["end_s"] - d["start_s"]).groupby("rank")["s"].sum()
    assert waits.to_dict() == {0: pytest.approx(0.001), 2: pytest.approx(0.300)}


def test_the_late_rank_is_late_within_its_group():
    late = late_rank(_ops(), GROUPS)
    assert late is not None and (late["rank"], late["host"]) == (3, "h4")
    assert late["late_ms"] == pytest.approx(300.0) and late["n_ops"] == 6  # 3 iterations x 2 groups
    # the groups' own offset is no lateness: group B as a whole 100 ms behind A, on time within itself
    prompt = _ops().assign(start_s=lambda d: d["start_s"].where(d["rank"] != 3, d["start_s"] - 0.3))
    assert late_rank(prompt, GROUPS) is None


def test_the_trace_names_the_last_rank_of_each_groups_op(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.json").write_text(json.dumps({"scenario": "collective", "params": {}, "seed": 1,
                                                       "complete": True, "t0_monotonic": 0.5,
                                                       "op_groups": GROUPS}))
    _ops(1).to_csv(run_dir / "ops.csv", index=False)
    ev = trace_events(load_run(run_dir))["traceEvents"]
    ops = {e["tid"] - 1: e for e in ev if e.get("cat") == "op"}
    assert ops[0]["args"]["last_to_join"] == "rank 1" and ops[2]["args"]["last_to_join"] == "rank 3"
    waits = {e["tid"] - 1: e["dur"] for e in ev if e.get("cat") == "wait"}
    assert waits == {0: 1000, 2: 300000}  # microseconds
