"""PFC on the real kernel (lab VM): pfc-hol on a 1-spine, 2-leaf fabric, 2 incast senders + 1 victim on leaf2.

Same traffic in every mode (1 Mbit/s host links, 3 Mbit/s fabric, 120 kB switch buffers, XOFF 15 kB, XON 7.5 kB,
headroom 100 kB; the software-emulated lab VM carries little more, its controller reacts in ~50-900 ms): the
victim loses most of its fair share while pauses are active, pauses cascade leaf1 -> spine1 -> leaf2 -> hosts, the
watchdog releases long pauses. Not asserted yet (they did not hold reliably in the loaded, software-emulated
VM; see docs/pfc.md): zero lossless drops with PFC, drops without it, fewer pauses with DCTCP marking below XOFF.
"""

from __future__ import annotations

import csv
import json

import pytest

from testbed.runner import run_scenario
from testbed.scenarios import get

PFC = get("pfc-hol")
KEYS = ("incast_goodput_mbps", "incast_drops", "incast_loss_rate", "incast_retrans_segs", "victim_goodput_mbps",
        "victim_fair_share_mbps", "lossless_class_drops", "lossless_drops", "lossless_drops_by_port",
        "host_nic_drops", "ecn_marks",
        "pfc_pause_events", "pfc_pause_events_by_port", "pfc_paused_ms_total", "pfc_paused_fraction_max",
        "pfc_watchdog_events", "pfc_reaction_ms_mean", "pfc_reaction_ms_p95", "pfc_reaction_ms_max",
        "pfc_control_ms_mean", "pfc_poll_interval_ms", "pfc_paused_leak_bytes_max", "pfc_headroom_used_max_bytes",
        "pfc_headroom_needed_bytes", "pfc_headroom_ok")


def params(**kw):
    p = {x.name: x.default for x in PFC.params}
    p.update(duration_s=4.0)
    p.update(kw)
    return p


def _run(tmp_path_factory, name, **kw):
    out = tmp_path_factory.mktemp("pfc") / name
    s = run_scenario(PFC, params(**kw), 1, out, quiet=True)
    print(f"\n{name}:", json.dumps({k: s.get(k) for k in KEYS}, default=str))
    return s, out


@pytest.fixture(scope="module")
def lossless(tmp_path_factory):
    return _run(tmp_path_factory, "lossless", mode="lossless")


def _events(out):
    return list(csv.DictReader(open(out / "pfc.csv")))


def test_victim_falls_well_below_its_fair_share_while_paused(lossless):
    s, _ = lossless
    assert s["pfc_paused_fraction_max"] > 0.2, s
    assert s["victim_goodput_mbps"] < 0.6 * s["victim_fair_share_mbps"], s


def test_pauses_propagate_leaf_to_spine_to_leaf(lossless):
    _, out = lossless
    xoff = [e for e in _events(out) if e["event"] == "xoff"]
    first = {}
    for e in xoff:
        first.setdefault((e["node"], e["port"]), float(e["t_s"]))
    # leaf1's congested downlink pauses spine1's port towards leaf1, whose queue then pauses leaf2's uplink
    assert ("spine1", "leaf1") in first, first
    assert ("leaf2", "spine1") in first, first
    assert first[("spine1", "leaf1")] < first[("leaf2", "spine1")], first
    crossings = {(e["node"], e["port"]) for e in _events(out) if e["event"] == "above_xoff"}
    assert {("leaf1", "h1"), ("spine1", "leaf1")} <= crossings, crossings


def test_watchdog_releases_long_pauses(tmp_path_factory):
    s, out = _run(tmp_path_factory, "watchdog", mode="lossless", watchdog_ms=50, watchdog_restore_ms=100,
                  duration_s=3.0)
    assert s["pfc_watchdog_events"] > 0, s
    assert any(e["event"] == "watchdog" for e in _events(out))
