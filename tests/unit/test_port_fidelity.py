"""Did each shaped port send at its rate while it had a backlog? analysis.fidelity.port_rates over hand-made
queues.csv / ports.csv / pfc.csv / events.csv rows, with hand-computed answers. Pure logic."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import fidelity

RATE_MBPS = 8.0  # 1 MB/s: 10 kB per 10 ms sample interval


def queues(rows):
    """rows: (t_s, node, port, class, backlog_bytes, sent_bytes)."""
    return pd.DataFrame([{"t_s": t, "node": n, "port": p, "class": c, "backlog_bytes": b, "sent_bytes": s}
                         for t, n, p, c, b, s in rows])


PORTS = pd.DataFrame([{"node": "leaf1", "port": "h1", "peer": "h1", "tier": "leaf_down", "rate_mbps": RATE_MBPS},
                      {"node": "spine1", "port": "leaf1", "peer": "leaf1", "tier": "spine", "rate_mbps": RATE_MBPS}])


def test_a_port_is_judged_only_over_intervals_its_backlog_could_fill():
    rows = []
    sent = 0
    for i in range(201):  # 2 s: leaf1:h1 always 20 kB deep (more than the 10 kB an interval drains), sends 9 kB
        rows.append((i * 0.01, "leaf1", "h1", "a", 12_000, sent))
        rows.append((i * 0.01, "leaf1", "h1", "b", 8_000, 0))  # classes add up: 20 kB
        sent += 9_000
    for i in range(201):  # spine1:leaf1 only 5 kB deep: never judged, whatever it sends
        rows.append((i * 0.01, "spine1", "leaf1", "a", 5_000, i * 1_000))
    t = fidelity.port_rates(queues(rows), PORTS).set_index("port")
    assert t.loc["leaf1:h1", "backlogged_s"] == pytest.approx(2.0)
    assert t.loc["leaf1:h1", "achieved_mbps"] == pytest.approx(7.2) and t.loc["leaf1:h1", "ratio"] == pytest.approx(0.9)
    assert t.loc["spine1:leaf1", "backlogged_s"] == 0 and math.isnan(t.loc["spine1:leaf1", "ratio"])
    assert fidelity.port_shortfall(t.reset_index()) is None  # 0.9 is not below PORT_RATE_MIN (0.85)
    low = fidelity.port_rates(queues([(r[0], r[1], r[2], r[3], r[4], int(r[5] * 0.7)) for r in rows]), PORTS)
    assert fidelity.port_shortfall(low) == "leaf1:h1 carried 0.63 of its 8 Mbit/s while backlogged (2.00 s)"
    # a host NIC is listed with its ratio but not judged (its own sender's stack feeds it: see UNJUDGED_TIERS)
    nic = fidelity.port_rates(queues([(r[0], r[1], r[2], r[3], r[4], int(r[5] * 0.7)) for r in rows]),
                              PORTS.assign(tier=["host_nic", "spine"]))
    assert nic.set_index("port").loc["leaf1:h1", "ratio"] == pytest.approx(0.63)
    assert fidelity.port_shortfall(nic) is None


def test_paused_and_slowed_times_are_not_held_against_a_port():
    rows = [(i * 0.01, "leaf1", "h1", "a", 50_000, min(i, 100) * 10_000) for i in range(201)]  # stops at 1 s
    pfc = pd.DataFrame([{"t_s": 1.0, "node": "leaf1", "port": "h1", "prio": 3, "event": "xoff", "backlog_bytes": 0},
                        {"t_s": 1.5, "node": "leaf1", "port": "h1", "prio": 3, "event": "xon", "backlog_bytes": 0}])
    events = pd.DataFrame([{"t_s": 1.5, "kind": "port_slow", "target": "leaf1:h1", "detail": ""}])
    ex = fidelity.excluded_intervals(pfc, events)
    assert ex == [("leaf1:h1", 1.0, 1.5), ("leaf1:h1", 1.5, math.inf)]
    t = fidelity.port_rates(queues(rows), PORTS, ex)
    assert t.iloc[0]["backlogged_s"] == pytest.approx(1.0) and t.iloc[0]["ratio"] == pytest.approx(1.0)
    assert fidelity.port_rates(queues([]), PORTS).empty and fidelity.port_shortfall(None) is None
    # the timeline's close restores every port at once (target "all"): that ends the interval too
    events = pd.DataFrame([{"t_s": 1.5, "kind": "port_slow", "target": "leaf1:h1", "detail": ""},
                           {"t_s": 2.5, "kind": "pause_storm", "target": "leaf1:h2", "detail": ""},
                           {"t_s": 3.0, "kind": "port_restored", "target": "all", "detail": ""}])
    assert sorted(fidelity.excluded_intervals(None, events)) == [("leaf1:h1", 1.5, 3.0), ("leaf1:h2", 2.5, math.inf)]


def test_sampler_timing_is_the_gaps_between_a_ports_successive_samples():
    rows = [(t, "leaf1", "h1", c, 0, 0) for t in (0.0, 0.01, 0.02, 0.03, 1.53) for c in ("a", "b")]
    rows += [(t, "spine1", "leaf1", "a", 0, 0) for t in (0.0, 0.01, 0.02)]
    timing = fidelity.sampler_timing(queues(rows))
    assert timing["sampler_interval_ms"] == pytest.approx(10.0)  # median of 10, 10, 10, 1500, 10, 10
    assert timing["sampler_gap_max_ms"] == pytest.approx(1500.0)
    assert fidelity.sampler_stalled(timing["sampler_gap_max_ms"]) == (
        "the queue sampler stalled for 1500 ms (limit 1000 ms): the queues in that time are unknown")
    assert fidelity.sampler_stalled(85.0) is None and fidelity.sampler_stalled(None) is None
    # p99 of the six gaps interpolates between 10 and 1500 ms; lateness is how far past the median (10 ms) it is
    assert timing["sampler_late_ms_p99"] == pytest.approx(10 + 0.95 * 1490 - 10)
    assert fidelity.timers_late(54.0) == ("timers fired late: the queue sampler's 1% latest rounds came 54 ms after "
                                          "its usual interval (limit 40 ms), and the agents' wake-ups with them")
    assert fidelity.timers_late(17.0) is None and fidelity.timers_late(None) is None
    assert fidelity.sampler_timing(queues([(0.0, "leaf1", "h1", "a", 0, 0)])) == {}


def test_pfc_is_too_slow_only_when_its_reaction_needs_more_than_the_headroom():
    base = {"pfc_enabled": True, "pfc_reaction_ms_max": 12.5, "pfc_headroom_bytes": 20_000}
    assert fidelity.pfc_too_slow({**base, "pfc_headroom_ok": True, "pfc_headroom_needed_bytes": 18_000}) is None
    line = fidelity.pfc_too_slow({**base, "pfc_headroom_ok": False, "pfc_headroom_needed_bytes": 34_278})
    assert line == ("PFC reacted in up to 12.5 ms: the feeders could send 34278 bytes meanwhile, more than the "
                    "20000-byte headroom")
    assert fidelity.pfc_too_slow({**base, "pfc_enabled": False, "pfc_headroom_ok": False}) is None
    assert fidelity.pfc_too_slow({}) is None


def test_the_cpu_is_judged_while_the_workload_ran():
    cpu = pd.DataFrame({"t_s": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "busy_fraction": [0.2, 0.3, 0.99, 0.97, 1.0, 0.1]})
    assert fidelity.busy_during(cpu, 0.25, 0.5) == pytest.approx((0.99 + 0.97 + 1.0) / 3)
    assert fidelity.busy_during(cpu, 0.61, 0.9) is None and fidelity.busy_during(cpu.iloc[:0], 0, 1) is None
    assert fidelity.cpu_busy(0.987, during="while the ops ran") == (
        "CPU 99% busy while the ops ran: the emulation may not have kept up")
    assert fidelity.cpu_busy(0.6) is None


def test_a_run_over_servers_is_judged_one_server_at_a_time():
    """server-1 holds leaf1 (a port at 0.9 of its rate: kept up) and its sampler ran every 10 ms; server-2 holds
    spine1 (a port at 0.6 while backlogged), its sampler stalled 1.5 s once and its CPU was 95% busy: only server-2
    is named, each of its three reasons once, and server-1's verdict is clean."""
    rows, sent1, sent2 = [], 0, 0
    times2 = [i * 0.01 for i in range(101)] + [2.5 + i * 0.01 for i in range(101)]  # a 1.5 s gap at 1.0-2.5 s
    for i in range(201):
        rows.append((i * 0.01, "leaf1", "h1", "a", 20_000, sent1))
        sent1 += 9_000
    for k, t in enumerate(times2):
        rows.append((t, "spine1", "leaf1", "a", 20_000, sent2))
        sent2 += 6_000 if k != 101 else 0
    q = queues(rows)
    table = fidelity.port_rates(q, PORTS)
    got = fidelity.by_server({"server-1": ["h1", "leaf1"], "server-2": ["spine1"]}, q, table,
                             {"server-1": {"cpu_busy_fraction": 0.4}, "server-2": {"cpu_busy_fraction": 0.95}},
                             handoffs=True)
    assert got["server-1"] == []
    assert len(got["server-2"]) == 3, got
    assert got["server-2"][0].startswith("spine1:leaf1 carried 0.60")
    assert "stalled for 1500 ms" in got["server-2"][1] and got["server-2"][2].startswith("CPU 95% busy")
