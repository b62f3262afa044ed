"""The per-rank timeline's split of each op (analysis.metrics.rank_op_split / rank_timeline / op_arrivals /
cct_split_vs_bound) on a hand-made run (tests/timeline_fixture.py): waiting = from a rank's arrival to the last
rank's arrival, transfer = the rest; the agent's wait_s (large on every rank, as a ring's blocked receives make it)
plays no part."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import metricnames
from analysis import metrics as m
from analysis.load import load_run
from tests.timeline_fixture import LATE_S, T0, TRANSFER_S, op_rows, write_run

PNG = b"\x89PNG\r\n\x1a\n"


def _ops(straggler: bool = True) -> pd.DataFrame:
    return pd.DataFrame(op_rows(straggler))


def test_split_sums_to_each_ops_duration():
    s = m.rank_op_split(_ops())
    assert len(s) == 12
    assert (s["arrival_wait_s"] >= 0).all() and (s["transfer_s"] >= 0).all()
    assert (s["arrival_wait_s"] + s["transfer_s"]).to_numpy() == pytest.approx((s["end_s"] - s["start_s"]).to_numpy())
    # transfer starts at the last arrival for every rank
    assert (s["start_s"] + s["arrival_wait_s"]).to_numpy() == pytest.approx(s["last_arrival_s"].to_numpy())


def test_straggler_peers_wait_and_the_straggler_does_not():
    s = m.rank_op_split(_ops()).groupby("rank")[["arrival_wait_s", "transfer_s"]].sum()
    assert s.loc[3, "arrival_wait_s"] == 0.0  # the last to arrive waits for nobody
    for r in range(3):  # each peer waits the straggler's lateness plus its own lead over the last of the others
        assert s.loc[r, "arrival_wait_s"] == pytest.approx(3 * (LATE_S + 0.002 - 0.001 * r))
    assert s["transfer_s"].to_numpy() == pytest.approx([3 * (TRANSFER_S + 0.0002 * r) for r in range(4)])


def test_without_a_straggler_the_ops_are_transfer_not_waiting():
    """The agent's wait_s says 90% of every op is waiting; the arrival split says ~3 ms of ~43 ms."""
    ops = _ops(straggler=False)
    assert (ops["wait_s"] > 0.03).all()
    tl = m.rank_timeline(ops)
    tl["s"] = tl["end_s"] - tl["start_s"]
    per = tl.groupby("kind")["s"].sum()
    assert set(tl["kind"]) == {"compute", "wait", "transfer"}
    assert per["wait"] < 0.1 * per["transfer"], per


def test_timeline_covers_each_rank_from_origin_to_last_op_end():
    tl = m.rank_timeline(_ops())
    tl["s"] = tl["end_s"] - tl["start_s"]
    per = tl.groupby(["rank", "kind"])["s"].sum().unstack(fill_value=0.0)
    ops = _ops()
    for r in range(4):
        mine = ops[ops["rank"] == r]
        assert per.loc[r].sum() == pytest.approx(mine["end_s"].max() - mine["iter_start_s"].min())
    assert per.loc[3, "wait"] == 0.0 and per.loc[3, "compute"] > per.loc[0, "compute"]
    # the intervals of one rank never overlap
    for _, d in tl.groupby("rank"):
        d = d.sort_values("start_s")
        assert (d["start_s"].to_numpy()[1:] >= d["end_s"].to_numpy()[:-1] - 1e-12).all()


def test_op_arrivals_take_the_cct_apart():
    t = m.op_arrivals(_ops())
    assert (t["arrival_skew_s"] + t["transfer_s"]).to_numpy() == pytest.approx(t["cct_s"].to_numpy())
    assert t["cct_s"].to_numpy() == pytest.approx(m.op_table(_ops())["cct_s"].to_numpy())
    assert t["arrival_skew_s"].to_numpy() == pytest.approx([LATE_S + 0.002] * 3)
    assert m.op_arrivals(_ops().iloc[:0]).empty


def test_cct_vs_bound_splits_into_late_arrival_and_transfer():
    bound_s = 0.040
    split = m.cct_split_vs_bound(_ops(), {"allreduce": bound_s})
    cct_vs_bound = float((m.op_table(_ops())["cct_s"] / bound_s).mean())
    assert split["arrival_skew_vs_bound"] + split["transfer_vs_bound"] == pytest.approx(cct_vs_bound)
    assert cct_vs_bound > 3.0 and split["transfer_vs_bound"] < 1.05  # the straggler, not the network
    assert split["arrival_skew_ms_mean"] == pytest.approx((LATE_S + 0.002) * 1e3)
    assert split["transfer_ms_mean"] == pytest.approx((TRANSFER_S + 0.0006) * 1e3)
    assert m.cct_split_vs_bound(_ops(), {"other": 1.0}) == {}
    assert all(metricnames.known(k) for k in split)


def test_timeline_plot_on_the_runs_clock(tmp_path):
    from analysis import plots

    run = load_run(write_run(tmp_path / "run"))
    assert run.time_window()[0] == T0
    p = plots.plot_rank_timeline(run.ops, tmp_path / "t.png", t0=run.time_window()[0])
    assert p.read_bytes()[:8] == PNG
    assert set(plots.TIMELINE_COLOURS) == set(m.rank_timeline(run.ops)["kind"])
    assert all(w in plots.TIMELINE_CAPTION for w in ("green", "red", "blue", "last rank", "transfer"))
