"""analysis.correlate: per-op fabric behaviour and the one-line explanation."""

import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.correlate import OP_NETWORK_COLUMNS, correlate_ops, correlate_run, explain_slowest
from analysis.load import empty_frame, load_run

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


@pytest.fixture(scope="module")
def run():
    return load_run(RUNS / "small_collective")


def test_correlate_run_hand_computed(run):
    t = correlate_run(run)
    assert list(t.columns) == OP_NETWORK_COLUMNS
    assert t.cct_ms.tolist() == pytest.approx([12.0, 10.0, 40.0, 20.0])
    slow = t.iloc[2]  # iteration 1 op 0, [1000.100, 1000.140]
    assert slow.peak_backlog_bytes == 9000 and slow.peak_port == "leaf1:eth3"
    assert slow.drops == 10 and slow.drop_port == "leaf1:eth3" and slow.drop_port_drops == 10
    assert slow.marks == 3
    assert slow.paused_ms == pytest.approx(3.0) and slow.pause_port == "spine1:eth2"
    assert slow.worst_port == "spine1:eth2"
    # op 0/1 has no queue sample inside it: peak is nan, counters from the bracketing samples
    short = t.iloc[1]
    assert math.isnan(short.peak_backlog_bytes) and short.marks == 5 and short.worst_port == ""
    assert t.iloc[0].worst_port == "leaf1:eth3" and t.iloc[0].drops == 0


def test_links_filter(run):
    t = correlate_ops(run.ops, run.queues, run.pfc, links=[("leaf1", "eth3")])
    slow = t.iloc[2]
    assert slow.paused_ms == 0 and slow.pause_port == "" and slow.worst_port == "leaf1:eth3"
    t2 = correlate_ops(run.ops, run.queues, run.pfc, links=["spine1:eth2"])
    assert t2.iloc[2].drops == 0 and t2.iloc[2].marks == 0 and t2.iloc[2].paused_ms == pytest.approx(3.0)


def test_open_pause_counts_until_run_end():
    ops = pd.DataFrame({"iteration": [0], "op": ["g"], "op_index": [0], "collective": ["allreduce"], "rank": [0],
                        "host": ["h0"], "start_s": [1.0], "end_s": [3.0], "bytes_sent": [1], "bytes_recv": [1],
                        "wait_s": [0.0]})
    pfc = pd.DataFrame({"t_s": [2.0], "node": ["s"], "port": ["e"], "prio": [3], "event": ["xoff"],
                        "backlog_bytes": [0]})
    t = correlate_ops(ops, empty_frame("queues"), pfc)
    assert t.iloc[0].paused_ms == pytest.approx(1000.0) and t.iloc[0].pause_port == "s:e"


def test_explain_slowest_sentence(run):
    s = explain_slowest(run)
    assert s.startswith("p99 op (iteration 1, op 0, 40.0 ms) coincided with 3.0 ms of pauses on spine1:eth2, "
                        "10 drops on leaf1:eth3 and 3 ECN marks")
    assert "n=4 ops" in s and "p99 is the max" in s and "\n" not in s


def test_explain_median_op(run):
    s = explain_slowest(run, q=0.5)
    assert s.startswith("p50 op (iteration 0, op 0, 12.0 ms) coincided with 5 ECN marks")
    assert "is the max" not in s


def test_explain_quiet_op(run):
    s = explain_slowest(run, q=0.5, links=["spine1:eth2"])
    assert "no pauses, drops or marks" in s and "peak backlog 0 B on spine1:eth2" in s


def test_explain_incomplete_and_empty():
    with pytest.warns(UserWarning):
        inc = load_run(RUNS / "incomplete")
    s = explain_slowest(inc)
    assert "600.0 ms" in s and "no queue sample" in s
    t = correlate_ops(empty_frame("ops"), empty_frame("queues"), empty_frame("pfc"))
    assert t.empty and list(t.columns) == OP_NETWORK_COLUMNS
    assert explain_slowest(None, table=t) == "p99 op: no collective ops in this run"


def _ops(starts: dict[int, float], end: float, op: str = "tp.l0", iteration: int = 0) -> list[dict]:
    return [{"iteration": iteration, "op": op, "op_index": 0, "collective": "allreduce", "rank": r, "host": f"h{r + 1}",
             "start_s": s, "end_s": end, "bytes_sent": 1, "bytes_recv": 1, "wait_s": 0.0} for r, s in starts.items()]


def test_a_late_rank_on_a_quiet_network_is_named_as_the_cause(tmp_path):
    """The story names a straggler; the slowest-op sentence no longer stops at "no pauses, drops or marks"."""
    from tests.unit.test_report_story import collective_run

    run = load_run(collective_run(tmp_path / "c", late_ms=600.0, late_rank=2))
    s = explain_slowest(run)
    assert "coincided with no pauses, drops or marks on the watched links: the cause is its late rank, rank 2 (h3) " \
           "joined 600.0 ms after the first rank (arrival skew: 97% of the op)" in s, s
    # a prompt rank on a quiet network: the sentence says what the queues did, no rank is blamed
    calm = load_run(collective_run(tmp_path / "d", late_ms=1.0))
    assert "late rank" not in explain_slowest(calm) and "peak backlog" in explain_slowest(calm)
    # the network did act: its events first, the late rank after them
    busy = load_run(collective_run(tmp_path / "e", late_ms=600.0, drops=7))
    assert "drops on spine1:leaf1; besides, rank 2 (h3) joined 600.0 ms" in explain_slowest(busy), explain_slowest(busy)


def test_grouped_ops_are_skewed_per_group_not_across_groups():
    """Two tensor-parallel groups {0, 1} and {2, 3} run one op at once; group B starts 500 ms after group A (the
    groups do not wait for each other). Within each group the ranks join 1 ms apart: no late rank. Across the groups
    the skew would read 501 ms and blame rank 3."""
    groups = {"tp.l0": [[0, 1], [2, 3]]}
    ops = pd.DataFrame(_ops({0: 1.0, 1: 1.001, 2: 1.5, 3: 1.501}, 1.6))
    t = correlate_ops(ops, empty_frame("queues"), empty_frame("pfc"), groups=groups)
    assert t.iloc[0].arrival_skew_ms == pytest.approx(1.0) and t.iloc[0].groups == 2
    assert "late rank" not in explain_slowest(None, table=t)
    whole = correlate_ops(ops, empty_frame("queues"), empty_frame("pfc"))  # no groups known: one group
    assert whole.iloc[0].arrival_skew_ms == pytest.approx(501.0) and whole.iloc[0].late_rank == 3
    # rank 2 is late within group B: it is named, with its group
    late = pd.DataFrame(_ops({0: 1.0, 1: 1.001, 2: 1.4, 3: 1.1}, 1.6))
    t = correlate_ops(late, empty_frame("queues"), empty_frame("pfc"), groups=groups)
    assert (t.iloc[0].late_rank, t.iloc[0].arrival_skew_ms) == (2, pytest.approx(300.0))
    assert "rank 2 (h3) joined 300.0 ms after the first rank of its group" in explain_slowest(None, table=t)


def test_op_groups_come_from_the_manifest_checked(tmp_path):
    from analysis.correlate import op_groups

    assert op_groups({"op_groups": {"tp.l0": [[0, 1], [2, 3]]}}) == {"tp.l0": [[0, 1], [2, 3]]}
    assert op_groups({"op_groups": {"tp.l0": [[0, "x"]], "dp": "no"}}) == {} and op_groups({}) == {}
