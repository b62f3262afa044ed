"""Burn-in's health.json as placement reads it (traffic.health) and admission control (traffic.admission): place,
hold or refuse, each with its one line. The health files are real burn-in outputs (tests/fixtures/burnin)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traffic.admission import FabricView, Needs, admit
from traffic.health import HealthError, load_health, parse_health
from traffic.jobplan import JobError, plan_job

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "burnin"
SLOW_H2, SLOW_LINK = FIX / "slow-h2-health.json", FIX / "slow-link-health.json"
H8 = [(f"h{i}", f"leaf{(i - 1) // 4 + 1}") for i in range(1, 9)]
FABRIC = FabricView.of(H8, 20.0, {f"leaf{lf}": {f"leaf{lf}-spine{s}": 20.0 for s in (1, 2)} for lf in (1, 2)})


def test_health_of_a_flagged_host():
    h = load_health(SLOW_H2)
    assert set(h.hosts) == {f"h{i}" for i in range(1, 9)} and len(h.links) == 4
    assert list(h.bad_hosts) == ["h2"] and "tx_mbps 4.78" in h.bad_hosts["h2"] and h.bad_links == {}
    assert h.avoid() == {"h2"} and "h2" not in h.healthy_hosts


def test_health_of_a_flagged_link():
    h = load_health(SLOW_LINK)
    assert h.bad_hosts == {} and list(h.bad_links) == ["leaf2-spine1"]
    assert h.avoid() == {"leaf2-spine1"} and h.avoid(links=False) == frozenset()


@pytest.mark.parametrize("doc, msg", [
    ([], "not a JSON object"),
    ({"format": "x/1", "hosts": {}, "links": {}}, "format is 'x/1'"),
    ({"format": "testbed-burnin-health/1", "hosts": {"h1": {"ok": "yes"}}, "links": {}}, "hosts.h1 needs \"ok\""),
    ({"format": "testbed-burnin-health/1", "hosts": {}}, "\"links\" must be an object"),
])
def test_bad_health_documents(doc, msg):
    with pytest.raises(HealthError, match=msg):
        parse_health(doc)


def test_unreadable_health_files(tmp_path):
    with pytest.raises(HealthError, match="No such file"):
        load_health(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(HealthError, match="not JSON"):
        load_health(tmp_path / "bad.json")
    with pytest.raises(HealthError, match="slow-h2-health.json: host h5 is not in this fabric"):
        load_health(SLOW_H2).check_fabric(["h1", "h2", "h3", "h4"])


def test_place_avoids_the_flagged_host():
    d = admit(Needs(4), FABRIC, load_health(SLOW_H2))
    assert d.action == "place" and d.hosts == ("h5", "h6", "h7", "h8")
    assert d.reason == "placed: 4 ranks on h5, h6, h7, h8 (leaf2; 0 spine crossings, topo)"


def test_refuse_names_the_flagged_hosts_and_why():
    d = admit(Needs(8), FABRIC, load_health(SLOW_H2))
    assert d.action == "refuse" and d.hosts == () and "\n" not in d.reason
    assert d.reason.startswith("refused: 8 ranks need 8 healthy hosts; 7 are healthy (h2: tx_mbps 4.78 Mbit/s")


def test_hold_while_busy_hosts_run_another_job():
    d = admit(Needs(6), FABRIC, load_health(SLOW_H2), busy={"h5", "h6"})
    assert d.action == "hold" and d.hosts == ("h1", "h3", "h5", "h6", "h7", "h8")
    assert d.reason.startswith("held: 6 ranks need 6 healthy hosts; 5 of the 7 healthy are free (busy: h5, h6)")
    assert d.reason.endswith("once h5, h6 free")
    assert admit(Needs(4), FABRIC, load_health(SLOW_H2), busy={"h1"}).action == "place"  # leaf2 is free


def test_a_flagged_link_refuses_a_job_that_must_cross_the_spine_unless_it_does_not_mind():
    h = load_health(SLOW_LINK)
    assert admit(Needs(4), FABRIC, h).hosts == ("h1", "h2", "h3", "h4")
    d = admit(Needs(6), FABRIC, h)
    assert d.action == "refuse"
    assert d.reason.startswith("refused: 6 ranks need 6 healthy hosts across the spine; 4 are behind leaves whose "
                               "uplinks are healthy (leaf2-spine1: leaf1>spine1>leaf2: path_mbps 4.78")
    assert admit(Needs(6, healthy_links=False), FABRIC, h).action == "place"


def test_limits_on_spine_crossings_and_uplink_load():
    d = admit(Needs(6, max_spine_crossings=0), FABRIC)
    assert d.reason == "refused: its ring would cross the spine 2 times (topo on 2 leaves); at most 0 allowed"
    assert admit(Needs(4, max_spine_crossings=0), FABRIC, busy={"h1"}).action == "place"  # leaf2 whole
    held = admit(Needs(4, max_spine_crossings=0), FABRIC, busy={"h1", "h5"})
    assert held.action == "hold" and held.reason.startswith("held: its ring would cross the spine 2 times")
    d = admit(Needs(8, max_uplink_load=1.0), FABRIC)
    assert d.reason == ("refused: leaf1 would carry 4 hosts x 20 Mbit/s over 40 Mbit/s of healthy uplinks (2.00:1); "
                        "at most 1:1 allowed")
    assert admit(Needs(8, max_uplink_load=2.0), FABRIC).action == "place"
    d = admit(Needs(8, max_uplink_load=2.0, healthy_links=False), FABRIC, load_health(SLOW_LINK))
    assert d.action == "place"  # the flagged link is not counted out when the job accepts it
    d = admit(Needs(6, max_uplink_load=10, healthy_links=True, policy="topo"),
              FabricView.of(H8, 20.0, {"leaf1": {"leaf1-spine1": 20.0}, "leaf2": {"leaf2-spine1": 20.0}}))
    assert d.action == "place"


def _knobs(**kw):
    base = {"collective": "allreduce", "algorithm": "", "size": "64K", "buckets": "", "ranks": 4, "iterations": 2,
            "warmup": 0, "chunks": 1, "dtype": "float32", "placement": "topo", "schedule_file": "", "trace_file": "",
            "compute_ms": 0.0, "jitter": 0.0, "stragglers": "", "straggler_factor": 1.0, "straggler_prob": 1.0,
            "background": "", "bg_dscp": 0, "bg_rate_mbps": 0.0}
    return {**base, **kw}


def test_the_job_plan_reads_the_health_file():
    assert plan_job(_knobs(health=str(SLOW_H2)), H8, 1).placement.hosts == ("h5", "h6", "h7", "h8")
    assert plan_job(_knobs(), H8, 1).placement.hosts == ("h1", "h2", "h3", "h4")
    packed = plan_job(_knobs(health=str(SLOW_H2), placement="packed"), H8, 1).placement.hosts
    assert packed == ("h1", "h3", "h4", "h5")
    with pytest.raises(JobError, match=r"^health: refused: 8 ranks need 8 healthy hosts; 7 are healthy \(h2: "):
        plan_job(_knobs(health=str(SLOW_H2), ranks=8), H8, 1)
    with pytest.raises(JobError, match="health: health file .*: host h5 is not in this fabric"):
        plan_job(_knobs(health=str(SLOW_H2)), H8[:4], 1)


def test_fixtures_are_burn_in_outputs():
    for f in (SLOW_H2, SLOW_LINK):
        doc = json.loads(f.read_text())
        assert doc["format"] == "testbed-burnin-health/1" and doc["healthy"] is False
