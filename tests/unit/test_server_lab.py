"""A Lab over servers that are machines (testbed.workloads.serverlab): the value of ``servers=``, what such a run
refuses before anything is created, and the clock rule that refuses a run whose clock bound is coarser than its
analysis needs (pure: no server is contacted)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.summary import clock_metrics
from testbed.errors import UsageError
from testbed.workloads import serverlab
from testbed.workloads.serverlab import CLOCK_FRACTION, clock_need_s, clock_problem, refusals, servers_value


def test_servers_is_a_count_or_a_file():
    assert servers_value(1) == 1 and servers_value("2") == 2 and servers_value(" 16 ") == 16
    assert servers_value("servers.txt") == Path("servers.txt") and servers_value("/x/2") == Path("/x/2")
    assert servers_value(Path("2")) == Path("2")      # a path is a file, whatever its name
    for bad in ("", "  ", None, True):
        with pytest.raises(UsageError, match="servers: a number of servers or a servers file"):
            servers_value(bad)


def test_what_a_servers_run_cannot_do_is_named():
    ok = {"transport": "tcp", "background": "", "sample_interval_ms": 0.0, "gpus_per_host": 1, "pfc": "off",
          "dcqcn": "off", "trim": "auto", "loss_percent": 0.0, "capture": "", "load_balancing": "ecmp"}
    assert refusals(ok) == [] and refusals({}) == []
    bad = {**ok, "transport": "rdma", "sample_interval_ms": 10.0, "background": [("h1", "h3")], "trim": "on"}
    got = refusals(bad, faults=["link-down leaf1-spine1"])
    assert got == ["transport=rdma (RDMA and UET transports)", "background=[('h1', 'h3')] (background flows)",
                   "trim=on (packet trimming)", "--fault (faults)"], got   # queue sampling runs on every server
    with pytest.raises(UsageError) as e:
        serverlab.check({**ok, "pfc": "on"})
    assert str(e.value) == "servers=FILE: not built over servers yet: pfc=on (PFC) (docs/servers.md)"


def test_the_clock_need_is_a_fraction_of_the_smallest_ops_bound():
    need, why = clock_need_s([0.1024, 0.5, float("nan"), 0.0])   # NaN: a custom schedule; 0: no bound
    assert need == pytest.approx(CLOCK_FRACTION * 0.1024) and "102 ms" in why
    assert clock_need_s([0.1024], override_ms=2.5)[0] == pytest.approx(2.5e-3)
    assert clock_need_s([float("nan")]) == (serverlab.NO_BOUND_NEED_S, clock_need_s([])[1])
    # the rule: the clocks alone move the fastest possible op's CCT (two clocks) by at most 2 * 5% = 10%
    assert 2 * CLOCK_FRACTION == pytest.approx(0.10)


def test_a_clock_coarser_than_the_need_is_one_line_naming_the_server():
    passes = {"server-1": {"offset_s": 0.0, "uncertainty_s": 0.0, "reference": True},
              "server-2": {"offset_s": -66630.4, "uncertainty_s": 690e-6},
              "server-3": {"offset_s": 12.0, "uncertainty_s": 300e-6}}
    assert clock_problem(passes, 5.12e-3, "x") is None
    assert clock_problem(passes, 690e-6, "x") is None          # equal to the need: accepted
    msg = clock_problem(passes, 0.5e-3, "5% of the smallest op's alpha-beta bound, 10 ms")
    assert msg == ("server server-2's clock is known to +-0.69 ms, coarser than this run's analysis needs (+-0.5 ms: "
                   "5% of the smallest op's alpha-beta bound, 10 ms); set max_clock_uncertainty_ms to accept it")
    assert "\n" not in msg


def test_the_summary_takes_the_largest_bound_from_clocks_csv():
    clocks = pd.DataFrame({"rank": [0, 1, 2], "host": ["h1", "h2", "h3"], "server": ["s1", "s2", "s2"],
                           "offset_s": [0.0, -5.0, -5.0], "uncertainty_s": [0.0, 6.9e-4, 7.1e-4],
                           "drift_ppm": [0.0, 1.0, 1.0], "drift_bound_ppm": [0.0, 160.0, 160.0]})
    assert clock_metrics(clocks) == {"clock_uncertainty_us_max": pytest.approx(710.0), "clock_servers": 2}
    assert clock_metrics(clocks.iloc[:0]) == {}


def _job_on_two_servers(bound_s: float):
    """A 2-rank 256 kB all-reduce planned on a 2x2 leaf-spine at 20 Mbit/s, MTU 1450, and a ServersRun whose fabric
    (h1 on server-1, h2 on server-2) had one clock pass with server-2 known to +-``bound_s`` (plain data: no agent)."""
    import types

    from testbed.workloads.serverlab import ServersRun
    from testbed.workloads.settings import CollectiveSettings
    from topologies.leafspine import uniform_leaf_spine
    from traffic.controller import Member

    spec = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
    plan = CollectiveSettings(collective="allreduce", size="256000", ranks=2, iterations=3).plan(spec, 1)
    where = {"h1": "server-1", "h2": "server-2"}
    fab = types.SimpleNamespace(clocks=[{"server-1": {"offset_s": 0.0, "uncertainty_s": 0.0, "reference": True},
                                         "server-2": {"offset_s": -70000.5, "uncertainty_s": bound_s}}],
                                server_of=where.get, ns=lambda n: f"tb-x-{n}",
                                placement=types.SimpleNamespace(server_of=where))
    run = ServersRun.__new__(ServersRun)
    run.spec, run.fab, run.max_clock_uncertainty_ms, run.clock_at = spec, fab, 0.0, float("inf")
    run.launch = None
    run.servers = [types.SimpleNamespace(address="198.19.0.1")]
    job = types.SimpleNamespace(plan=plan, transport="tcp", rundir=types.SimpleNamespace(manifest={}))
    members = [Member(r, h, fab.ns(h), spec.host_ip(h)) for r, h in enumerate(plan.placement.hosts)]
    return run, job, members


def test_a_job_whose_clock_is_coarser_than_its_need_is_refused_before_its_ranks_start():
    from testbed.errors import RunFailed

    run, job, members = _job_on_two_servers(bound_s=6e-3)
    with pytest.raises(RunFailed) as e:   # raised where the Controller's keywords are made: no rank was spawned
        run.controller_args(job, members)
    assert str(e.value).startswith("servers: server server-2's clock is known to +-6 ms, coarser than this run's "
                                   "analysis needs (+-5.36 ms: 5% of the smallest op's alpha-beta bound, 107 ms)")
    run, job, members = _job_on_two_servers(bound_s=0.6e-3)
    kw = run.controller_args(job, members)   # the lab's fresh pass is the job's start: offsets per rank
    assert kw["clock_offsets_s"] == {0: 0.0, 1: -70000.5} and kw["listen"] == ("198.19.0.1", 0), kw
    assert job.rundir.manifest["clock_need_s"] == pytest.approx(5.36e-3, rel=1e-3)
    with pytest.raises(RunFailed, match="one collective job at a time"):   # the first has not finished
        run.controller_args(job, members)
