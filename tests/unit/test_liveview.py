"""The live view's pure part: from two of the sampler's snapshots, the busiest ports with their rates, and a port
that holds a queue but sent nothing since the last snapshot marked stalled (paused, or a slow or dead link)."""

from __future__ import annotations

import json

import pytest

from testbed.measure import liveview


def snap(t, rows):
    return {"t": t, "rows": rows}


def test_busiest_ports_first_with_rates_summed_over_classes_and_stalls():
    before = snap(1.0, [["leaf1", "h1", "a", 1000, 0, 0, 100_000], ["leaf1", "h1", "b", 0, 0, 0, 0],
                        ["spine1", "leaf2", "a", 5000, 2, 1, 50_000], ["leaf2", "h4", "a", 0, 0, 0, 10_000]])
    now = snap(1.5, [["leaf1", "h1", "a", 3000, 1, 0, 700_000], ["leaf1", "h1", "b", 1000, 0, 0, 25_000],
                     ["spine1", "leaf2", "a", 8000, 2, 3, 50_000], ["leaf2", "h4", "a", 0, 0, 0, 10_000]])
    rows = liveview.busiest(now, before, 0.5)
    assert [r["port"] for r in rows] == ["spine1:leaf2", "leaf1:h1"]  # leaf2:h4 idle: not shown
    top, h1 = rows
    assert top["stalled"] and top["mbps"] == 0 and (top["drops"], top["marks"]) == (2, 3)
    assert not h1["stalled"] and h1["backlog_bytes"] == 4000
    assert h1["mbps"] == pytest.approx((725_000 - 100_000) * 8 / 0.5 / 1e6)
    assert liveview.busiest(now, None, 0.0)[0]["stalled"] is False  # nothing to compare with yet


def test_the_snapshot_is_replaced_whole_and_top_limits_the_rows(tmp_path):
    p = tmp_path / "live.json"
    liveview.write_snapshot(str(p), 2.0, [("n", f"p{i}", "a", i + 1, 0, 0, 0) for i in range(30)])
    data = json.loads(p.read_text())
    assert data["t"] == 2.0 and len(data["rows"]) == 30
    assert [r["port"] for r in liveview.busiest(data, None, 0, top=3)] == ["n:p29", "n:p28", "n:p27"]
