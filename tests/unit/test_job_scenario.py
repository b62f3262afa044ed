"""The collective scenario's parameter checks: bad input is one UsageError line, before any fabric exists."""

from __future__ import annotations

import json

import pytest

from testbed.errors import UsageError
from testbed.params import resolve
from testbed.scenario import get, names
from traffic import schedule_json
from traffic.collectives import make_schedule

SC = get("collective")


def params(**kw):
    return resolve(SC.params, [f"{k}={v}" for k, v in kw.items()])


def plan(p):
    """The job the scenario would run (testbed.workloads.collective.job_plan over the scenario's fabric)."""
    from testbed.workloads.collective import job_plan

    return job_plan(p, SC.topology(p, 1).spec, p["seed"] or 1)


def test_registered():
    assert "collective" in names() and SC.name == "collective"


def test_defaults_plan():
    pl = plan(params())
    assert pl.ranks == 4 and len(pl.schedules) == 1
    assert pl.job.iterations == 5 and pl.job.warmup == 1
    assert pl.placement.hosts == ("h1", "h2", "h3", "h4")


def test_sweep_and_buckets():
    pl = plan(params(size="1K,64K,1M", iterations=2))
    assert pl.sizes == {"allreduce-1000": 1000, "allreduce-64000": 64_000, "allreduce-1000000": 1_000_000}
    assert len(pl.job.segments) == 3 and pl.job.iterations == 6
    pl = plan(params(buckets="4K,4K,8K"))
    assert len(pl.schedules) == 2  # equal sizes share a schedule
    assert [o[0] for o in pl.job.segments[0].ops] == ["bucket0", "bucket1", "bucket2"]


def test_spread_placement():
    pl = plan(params(placement="spread"))
    assert pl.placement.hosts == ("h1", "h3", "h2", "h4")


@pytest.mark.parametrize("kw,msg", [
    ({"collective": "allfoo"}, "unknown collective"),
    ({"size": "0"}, "must be > 0"),
    ({"size": "1K,-1"}, "must be > 0"),
    ({"size": "1003"}, "multiple"),
    ({"ranks": 5}, "only 4 hosts"),
    ({"algorithm": "magic"}, "unknown algorithm"),
    ({"stragglers": "7"}, "straggler rank 7"),
    ({"background": "h1>h9"}, "unknown host"),
    ({"background": "h1"}, "SRC>DST"),
    ({"placement": "weird"}, "must be one of"),
    ({"schedule_file": "/nonexistent/x.json"}, "schedule_file"),
])
def test_bad_input(kw, msg):
    with pytest.raises(UsageError, match=msg):
        p = params(**kw)
        SC.validate(p)


def test_bad_schedule_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError):
        SC.validate(params(schedule_file=str(bad)))
    d = schedule_json.to_dict(make_schedule("allreduce", 3, 1200))
    d["programs"][0]["steps"][0]["sends"][0]["tag"] = 99  # unmatched send
    f = tmp_path / "unmatched.json"
    f.write_text(json.dumps(d))
    with pytest.raises(UsageError, match="no matching receive"):
        SC.validate(params(schedule_file=str(f)))
    big = tmp_path / "big.json"
    schedule_json.dump(make_schedule("allreduce", 6, 1200), big)
    with pytest.raises(UsageError, match="only 4 hosts"):
        SC.validate(params(schedule_file=str(big)))
    ok = tmp_path / "ok.json"
    schedule_json.dump(make_schedule("allgather", 3, 1200), ok)
    SC.validate(params(schedule_file=str(ok)))


def test_cli_bad_input_exit_2(capsys):
    from testbed.cli import main

    assert main(["run", "collective", "--set", "collective=nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown collective" in err[0]


def test_bound_counts_header_bytes_on_the_wire():
    """beta of the alpha-beta bound is per payload byte: 1448 of every 1514 bytes a 1500-MTU TCP flow puts through
    the shaper, 1024 of 1082 for RoCEv2 at rxe's MTU 1024."""
    from traffic.jobplan import payload_efficiency

    assert abs(payload_efficiency("tcp", 1500) - 1448 / 1514) < 1e-12
    assert abs(payload_efficiency("rdma", 1500) - 1024 / 1082) < 1e-12
    assert abs(payload_efficiency("rdma", 1500, 512) - 512 / 570) < 1e-12
    assert abs(payload_efficiency("tcp", 9000) - 8948 / 9014) < 1e-12


def test_pfc_on_makes_the_collectives_dscp_a_lossless_class():
    def build_spec(p):
        return SC.topology(p, 1).spec

    collective_dscp = SC.run.__globals__["collective_dscp"]  # scenarios/collective.py's
    p = params(pfc="on")
    assert collective_dscp(p) == 26 and collective_dscp(params()) == 0 and collective_dscp(params(dscp=10)) == 10
    topo = build_spec(p)
    bulk, coll = topo.classes
    assert (bulk.name, bulk.default, bulk.lossless, list(bulk.dscp)) == ("bulk", True, False, [0])
    assert (coll.name, coll.lossless, coll.pcp, list(coll.dscp)) == ("collective", True, 3, [26])
    # headroom 0 means: the whole buffer above XOFF
    assert coll.xoff_bytes + coll.headroom_bytes == p["buffer_bytes"] and coll.xon_bytes < coll.xoff_bytes
    assert build_spec(params()).classes != topo.classes  # pfc=off: the single default class
    sc = get("collective")
    assert "qdisc:plug" in sc.needs_of(p) and "qdisc:plug" not in sc.needs_of(params())


@pytest.mark.parametrize("kw,msg", [
    (dict(pfc="on", pfc_xon_bytes=40_000), "xon_bytes: must be < xoff_bytes"),
    (dict(pfc="on", pfc_headroom_bytes=300_000), "must fit the buffer"),
    (dict(pfc="on", background="h1>h3", bg_dscp=26), "bg_dscp \\(26\\) must differ"),
    (dict(pfc="maybe"), "pfc"),
])
def test_pfc_bad_input(kw, msg):
    with pytest.raises(UsageError, match=msg):
        get("collective").validate(params(**kw))
