"""lab.collective's settings (testbed.workloads.settings): the scenario's parameters as one typed object, checked
when it is made (one UsageError line naming the parameter), planning the same job the scenario plans."""

from __future__ import annotations

import dataclasses

import pytest

from testbed.errors import UsageError
from testbed.params import resolve
from testbed.scenario import get
from testbed.workloads.collective import job_plan
from testbed.workloads.settings import (JOB_PARAMS, CollectiveSettings, Parallel, Program, Rdma, Trace,
                                        settings_for)
from topologies.mininet_topo import DumbbellTopo, LeafSpineTopo

SC = get("collective")
JOB_NAMES = [q.name for q in JOB_PARAMS]


def params(**kw):
    return resolve(SC.params, [f"{k}={v}" for k, v in kw.items()])


def test_the_defaults_are_the_scenarios():
    p = params()
    assert CollectiveSettings().knobs() == {n: p[n] for n in JOB_NAMES}
    assert CollectiveSettings.from_params(p) == CollectiveSettings()
    assert CollectiveSettings().sample_interval_ms == p["sample_interval_ms"]
    assert CollectiveSettings().scaleup_rate_mbps == p["scaleup_rate_mbps"]


@pytest.mark.parametrize("sets", [
    {"collective": "alltoall", "size": "1K,64K", "stragglers": "1,3", "background": "h1>h3", "compute_ms": "50"},
    {"tp": 2, "pp": 2, "ranks": 8, "gpus_per_host": 2, "model_layers": 4, "rank_order": "dp-tp"},
    {"trace_file": "examples/traces/small-dp.0.et", "trace_bytes_scale": "0.5", "ranks": 2},
    {"schedule_file": "x.json", "transport": "rdma", "rdma_mtu": 1024, "rdma_timeout": 14},
])
def test_from_params_gives_back_every_knob(sets):
    p = params(**sets)
    s = CollectiveSettings.from_params(p)
    assert s.knobs() == {n: p[n] for n in JOB_NAMES}
    form = ("parallel" if "tp" in sets else "trace" if "trace_file" in sets
            else "program" if "schedule_file" in sets else None)
    assert [f for f in ("parallel", "trace", "program") if getattr(s, f) is not None] == ([form] if form else [])


def test_the_plan_is_the_scenarios():
    p = params(tp=2, ranks=4, iterations=3, background="h1>h4", seed=7)
    spec = SC.topology(p, 1).spec
    ours = CollectiveSettings.from_params(p).plan(spec, 1)
    theirs = job_plan(p, spec, 7)
    assert ours.sizes == theirs.sizes and ours.placement == theirs.placement and ours.job == theirs.job
    assert list(ours.schedules) == list(theirs.schedules)


@pytest.mark.parametrize("make, message", [
    (lambda: CollectiveSettings(ranks=1), "ranks: must be >= 2"),
    (lambda: CollectiveSettings(ranks=True), "ranks: not a valid int"),
    (lambda: CollectiveSettings(iterations=2.0), "iterations: not a valid int"),
    (lambda: CollectiveSettings(dtype="bfloat16"), "dtype: must be one of"),
    (lambda: CollectiveSettings(transport="udp"), "transport: must be one of"),
    (lambda: CollectiveSettings(dscp=64), "dscp: must be <= 63"),
    (lambda: CollectiveSettings(cc="vegas"), "cc: must be one of"),
    (lambda: CollectiveSettings(sample_interval_ms=-1), "sample_interval_ms: must be >= 0"),
    (lambda: CollectiveSettings(parallel=Parallel(tp=0)), "tp: must be >= 1"),
    (lambda: CollectiveSettings(parallel={"tp": 2}), "parallel: expected a Parallel"),
    (lambda: Trace("t.et", bytes_scale=0), "trace_bytes_scale: must be >= 1e-09"),
    (lambda: Trace(""), "trace_file: a file name"),
    (lambda: Program(""), "schedule_file: a file name"),
    (lambda: Rdma(timeout=0), "rdma_timeout: must be >= 1"),
    (lambda: CollectiveSettings(transport="uet", entropy_values=0), "entropy_values: must be >= 1"),
    (lambda: CollectiveSettings(transport="rdma", entropy_values=64),
     "entropy_values=64 needs transport=uet (with transport=rdma a connection keeps its one source port)"),
    (lambda: settings_for(42), "collective: a collective's name"),
])
def test_a_bad_value_is_one_line_naming_the_parameter(make, message):
    with pytest.raises(UsageError) as e:
        make()
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_lists_become_the_knobs_text_and_ints_floats():
    s = CollectiveSettings(size=[1000, 64000], buckets=[4096], stragglers=[1, 3], background=[("h1", "h3")],
                           compute_ms=50)
    assert (s.size, s.buckets, s.stragglers, s.background) == ("1000,64000", "4096", "1,3", "h1>h3")
    assert s.compute_ms == 50.0 and isinstance(s.compute_ms, float)
    assert CollectiveSettings(size=65536).size == "65536"


def test_the_forms():
    assert settings_for("alltoall", ranks=3) == CollectiveSettings("alltoall", ranks=3)
    assert settings_for(Parallel(tp=2), ranks=8).parallel == Parallel(tp=2)
    assert settings_for(Trace("t.et"), ranks=2).trace.file == "t.et"
    assert settings_for(Program("s.json")).program == Program("s.json")
    base = CollectiveSettings(size="64K")
    assert settings_for(base, iterations=9) == dataclasses.replace(base, iterations=9)


def test_what_the_fabric_cannot_take_is_refused_before_a_lab():
    topo = LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=2)
    CollectiveSettings(ranks=4).check(topo)
    with pytest.raises(UsageError, match=r"^ranks: 8 ranks but the fabric has only 4 hosts"):
        CollectiveSettings(ranks=8).check(topo)
    with pytest.raises(UsageError, match=r"^background: unknown host 'h9'"):
        CollectiveSettings(background="h1>h9").check(topo)
    with pytest.raises(UsageError, match=r"^collective: the job runs on a leaf-spine fabric"):
        CollectiveSettings(ranks=2).check(DumbbellTopo(senders=2, receivers=1))
