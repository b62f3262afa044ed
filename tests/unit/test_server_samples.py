"""Every server's queue samples on the reference clock (testbed.measure.serversamples.on_reference_clock): pure."""

from __future__ import annotations

import pytest

from analysis.clockoffset import ClockModel, Offset
from testbed.measure.serversamples import ShareSampling, on_reference_clock


def _offset(offset_s: float, at_s: float, unc_s: float = 3e-4) -> Offset:
    return Offset(offset_s, unc_s, at_s, 1e-3, 1e-4, 100, 10, 0)


def _reply(t: float, node: str) -> dict:
    return {"queues": [[t, node, "eth1", "be", 0, 0, 0, 0, 100, 1, 0]], "cpu": [[t, 0.5]],
            "stats": {"queue_samples": 1}}


def test_far_rows_move_by_their_servers_model_and_the_references_stay():
    # server-2's clock runs 5 s ahead of the reference (offset = server - reference): its t=105 is the reference's 100
    models = {"server-1": None, "server-2": ClockModel(_offset(5.0, 0.0), _offset(5.0, 200.0))}
    got = on_reference_clock({"server-2": _reply(105.0, "leaf2"), "server-1": _reply(100.5, "leaf1")}, models)
    assert [(round(r[0], 9), r[1]) for r in got.queues] == [(100.0, "leaf2"), (100.5, "leaf1")]  # sorted by time
    assert got.queues[0][2:] == ("eth1", "be", 0, 0, 0, 0, 100, 1, 0)
    assert got.cpu["server-2"] == [(pytest.approx(100.0), 0.5)] and got.cpu["server-1"] == [(100.5, 0.5)]
    assert got.stats["server-2"]["clock_uncertainty_s"] == 3e-4 and got.stats["server-1"]["clock_uncertainty_s"] == 0


def test_a_drifting_clock_is_moved_by_the_line_through_its_two_passes():
    # 1 ms apart after 100 s: 10 ppm; halfway the offset is 0.5 ms
    models = {"server-2": ClockModel(_offset(0.0, 0.0), _offset(1e-3, 100.0))}
    got = on_reference_clock({"server-2": _reply(50.0, "h2")}, models)
    assert got.queues[0][0] == pytest.approx(50.0 - 0.5e-3, abs=1e-9)


def test_the_agent_refuses_to_sample_without_a_share_or_twice_and_to_stop_what_it_did_not_start():
    s = ShareSampling()
    with pytest.raises(ValueError, match="no share"):
        s.start(None, 1.0)
    with pytest.raises(ValueError, match="not being sampled"):
        s.stop()
    s.teardown()   # nothing running: nothing to do


def test_a_servers_runs_port_counters_are_each_class_last_sample_minus_its_first():
    import pandas as pd

    from testbed.measure.serversamples import sampled_port_delta

    cols = ["t_s", "node", "port", "class", "drops", "marks", "sent_bytes", "sent_packets", "overlimits"]
    rows = [(0.0, "leaf1", "spine1", "1:10", 5, 1, 0, 0, 0), (0.0, "leaf1", "spine1", "1:20", 2, 0, 0, 0, 0),
            (1.0, "leaf1", "spine1", "1:10", 9, 4, 0, 0, 0), (1.0, "leaf1", "spine1", "1:20", 3, 0, 0, 0, 0),
            (0.2, "leaf2", "h2", "1:10", 0, 0, 0, 0, 0), (1.2, "leaf2", "h2", "1:10", 7, 2, 0, 0, 0)]  # server-2's
    got = sampled_port_delta(pd.DataFrame(rows, columns=cols))
    assert {k: (v["drops"], v["marks"]) for k, v in got.items()} == {("leaf1", "spine1"): (5, 3),
                                                                     ("leaf2", "h2"): (7, 2)}
    assert set(got[("leaf2", "h2")]) >= {"drops", "marks", "sent_bytes", "sent_packets"}  # what port_deltas promises
    assert sampled_port_delta(pd.DataFrame(columns=cols)) is None and sampled_port_delta(None) is None
