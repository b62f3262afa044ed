"""The fault timeline on the host kernel (HTB + bfifo queues, u32 + mirred + IFB for a dead link): what the kernel's
routing tables hold while a link is dead and after it comes back, what events.csv records, and what a flapping
link does to a ring all-reduce's tail."""

from __future__ import annotations

import ipaddress
import os
import time

import pytest

from analysis import stats
from analysis.correlate import correlate_run, explain_slowest
from analysis.load import load_run
from analysis.metrics import op_table
from testbed.faults import plan as faultplan
from testbed.errors import UsageError
from testbed.kernel import netns
from testbed.lab import Lab
from testbed.commands.runner import run_scenario
from testbed.scenario import get
from topologies.mininet_topo import LeafSpineTopo

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")


def nexthop_ports(lab: Lab, node: str, subnet: str) -> list[str]:
    """The interfaces node's route to `subnet` leaves by, as the kernel holds it ([] when there is no route)."""
    net = ipaddress.ip_network(subnet)
    with netns.ipr(lab.net.fabric.ns(node)) as ipr:
        names = {l["index"]: l.get_attr("IFLA_IFNAME") for l in ipr.get_links()}
        for r in ipr.get_routes(family=2, table=254):
            if r.get_attr("RTA_DST") == str(net.network_address) and r["dst_len"] == net.prefixlen:
                mp = r.get_attr("RTA_MULTIPATH")
                return sorted(names[h["oif"]] for h in mp) if mp else [names[r.get_attr("RTA_OIF")]]
    return []


def sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def test_a_dead_spine_link_is_routed_around_after_detection_and_taken_back(tmp_path):
    topo = LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=20)
    with Lab(topo, out=tmp_path / "run", name="faults", quiet=True) as lab:
        subnets = lab.net.fabric.topology.address_plan.subnets
        to_leaf1, to_leaf2 = subnets["leaf1"], subnets["leaf2"]
        assert nexthop_ports(lab, "leaf1", to_leaf2) == ["spine1", "spine2"]
        lab.at(0.3, "link-down leaf1-spine1 for_s=1.2 detect_ms=100")
        with pytest.raises(UsageError, match="unknown link"):
            lab.at(0.5, "link-down leaf1-spine7")
        # 8 flows across the fabric: some hash onto spine1 in one direction or the other
        flows = lab.flows([("h1", "h3"), ("h2", "h4"), ("h1", "h4"), ("h2", "h3")] * 2, duration_s=3.5)
        t0 = lab.faults.t0
        sleep_until(t0 + 0.9)  # dead since 0.3, detected at 0.4
        watch = (("leaf1", "leaf1", to_leaf2), ("leaf2", "leaf2", to_leaf1), ("spine1>leaf1", "spine1", to_leaf1),
                 ("spine1>leaf2", "spine1", to_leaf2))
        during = {k: nexthop_ports(lab, n, d) for k, n, d in watch}
        sleep_until(t0 + 2.0)  # back at 1.5, taken back at 1.6
        after = {n: nexthop_ports(lab, n, d) for n, d in (("leaf1", to_leaf2), ("spine1", to_leaf1))}
        # every flow moves again, those that were on the dead link too (TCP's backed-off retransmission timer
        # fires by ~2.1 s: RTO 0.2-0.3 s doubling from 0.3 s)
        sleep_until(t0 + 2.6)
        a = flows.snapshot()
        sleep_until(t0 + 3.4)
        progress = [y - x for x, y in zip(a[1], flows.snapshot()[1])]
        stats = flows.wait()
    print("routes while dead:", during, "after:", after)
    # leaf1 and leaf2 send only via spine2; spine1 reaches leaf1 the long way round (shortest paths without the
    # link: leaf2, spine2), and keeps its route to leaf2
    assert during == {"leaf1": ["spine2"], "leaf2": ["spine2"], "spine1>leaf1": ["leaf2"],
                      "spine1>leaf2": ["leaf2"]}, during
    assert after == {"leaf1": ["spine1", "spine2"], "spine1": ["leaf1"]}, after
    assert all(f["bytes"] > 0 for f in stats), stats
    assert all(p > 0 for p in progress), progress

    run = load_run(tmp_path / "run")
    ev = run.events[run.events["target"] == "leaf1-spine1"]
    assert list(ev["kind"]) == ["link_down", "routes_withdrawn", "link_up", "routes_restored"], run.events
    t = dict(zip(ev["kind"], ev["t_s"] - t0))
    # the timeline's own clock: steps run in the lab's process beside the 8 flows' 16 threads; measured 0-144 ms
    # late on this 2-CPU machine (the events record when the kernel change was made), so a margin of 0.25 s
    assert 0.3 <= t["link_down"] < 0.55 and 1.5 <= t["link_up"] < 1.75, t
    reaction = (t["routes_withdrawn"] - t["link_down"]) * 1e3
    assert 100 <= reaction < 350, reaction
    s = run.summary
    assert s["link_down_events"] == 1 and s["routes_withdrawn_events"] == 1 and s["fault_errors"] == 0, s
    assert 1200 - 250 <= s["down_ms_total"] <= 1200 + 250, (s["down_ms_total"], t)
    assert s["dead_link_frames"] > 0, s  # what crossed the dead link before detection was lost
    assert run.manifest["faults"] == ["link-down leaf1-spine1 at_s=0.3 detect_ms=100 for_s=1.2"]


def test_faults_the_workload_never_reaches_are_recorded(tmp_path):
    topo = LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=1, host_rate_mbps=20, fabric_rate_mbps=20)
    with Lab(topo, out=tmp_path / "run", name="faults", quiet=True) as lab:
        lab.at(30, "slow-port spine1:leaf2 fraction=0.5")
        lab.at(0.0, "slow-port spine1:leaf1 fraction=0.25")
        flows = lab.flows([("h2", "h1")], duration_s=1.5)
        time.sleep(0.5)
        classes = lab.net["spine1"].cmd("tc class show dev leaf1")
        stats = flows.wait()
    # 20 Mbit/s cut to a quarter: the kernel's class says 5 Mbit, and the flow got about that (not 20)
    assert "rate 5Mbit" in classes, classes
    assert stats[0]["goodput_mbps"] < 0.5 * 20, stats
    run = load_run(tmp_path / "run")
    kinds = list(run.events["kind"])
    assert kinds[:1] == ["port_slow"] and "fault_not_reached" in kinds and "port_restored" in kinds, run.events
    assert run.summary["faults_not_reached"] == 1, run.summary


def test_bad_fault_specs_exit_2_before_anything_is_built(tmp_path):
    import subprocess
    import sys

    # smoke: h1 - s1 - h2, flows for duration_s
    for spec, says in (("link-down s1-s9 at_s=1", "unknown link"),
                       ("slow-port s1:s1-eth9 at_s=0 fraction=0.5", "no such egress port"),
                       ("slow-port s1:s1-eth2 at_s=0 fraction=0", "a rate of 0"),
                       ("link-down h1-s1 at_s=99", "past the end of the workload (2 s)"),
                       ("shake h1-s1 at_s=1", "unknown kind")):
        before = netns.list_ours()
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "smoke", "--vm", "never", "--out",
                            str(tmp_path / "x"), "--set", "duration_s=2", "--fault", spec],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (spec, r.stderr)
        assert netns.list_ours() == before and not (tmp_path / "x").exists()


def test_a_flapping_link_raises_the_ring_allreduce_tail_and_the_correlation_names_it(tmp_path):
    """One spine, so every cross-leaf hop of the ring uses leaf1-spine1: while it is down (and withdrawn) the ring
    stalls, and TCP recovers only by retransmission timeouts after it comes back.

    The ops the outages overlap (the correlation says so from the run's own events) are compared with every op of
    the run without the fault (analysis.stats.compare: rank test and the ratio of medians' bootstrap interval), not
    one run's p99 and max against the other's. An op that overlaps a 400 ms outage cannot finish before the link
    is back: a floor well above the ~0.2 s an undisturbed op takes. With 2-4 overlapped ops against 14 the rank test
    reaches p < 0.05 only when they sit above nearly all clean ops, which the 400 ms floor makes the rule. Measured (2
    passes, shared machine): overlapped ops 735-988 and 745-1212 ms (3 each), clean 166-179 ms; ratio 4.47 [4.41, 5.94]
    and 4.64 [4.37, 7.20], p 0.003 both times."""
    coll = get("collective")
    p = {x.name: x.default for x in coll.params}
    p.update(collective="allreduce", size="256K", iterations=14, warmup=1, spines=1, leaves=2, hosts_per_leaf=2,
             host_rate_mbps=20.0, fabric_rate_mbps=20.0, sample_interval_ms=10.0)
    coll.validate(p)
    flap = faultplan.parse("flap leaf1-spine1 at_s=0.6 down_s=0.4 up_s=0.6 count=2 detect_ms=50")
    base = run_scenario(coll, p, 1, tmp_path / "base", quiet=True)
    hit = run_scenario(coll, p, 1, tmp_path / "flap", quiet=True, faults=[flap])
    print({k: (base[k], hit[k]) for k in ("cct_ms_p50", "cct_ms_p99", "cct_ms_max", "tcp_retrans_segs")})
    assert base["data_verified"] and hit["data_verified"]
    assert hit["link_down_events"] == 2 and hit["routes_withdrawn_events"] == 2, hit
    run = load_run(tmp_path / "flap")
    assert list(run.events["kind"]).count("link_up") == 2
    table = correlate_run(run)
    # each 400 ms outage stalls the op it hits by at least that long; the undisturbed ops take ~0.2 s
    hit_ms = list(table.loc[table["faults"].str.contains("leaf1-spine1 down for", na=False), "cct_ms"])
    base_ms = list(op_table(load_run(tmp_path / "base").ops)["cct_s"] * 1e3)
    d = stats.compare(hit_ms, base_ms)
    print(f"op CCT overlapping an outage vs without the fault: {d.a.text()} vs {d.b.text()}; ratio {d.ratio:.2f} "
          f"[{d.ratio_low:.2f}, {d.ratio_high:.2f}], p {d.p_value:.2g}: {d.verdict}; {sorted(round(x) for x in hit_ms)}"
          f" vs {sorted(round(x) for x in base_ms)}")
    assert len(hit_ms) >= 2 and max(hit_ms) >= 400, (hit_ms, table[["cct_ms", "faults"]])
    assert d.verdict == "A > B", d
    slowest = table.sort_values("cct_ms").iloc[-1]
    assert "leaf1-spine1 down for" in slowest["faults"], table[["cct_ms", "faults"]]
    line = explain_slowest(run, 0.99, table=table)
    print(line)
    assert "leaf1-spine1 down for" in line


def test_a_fault_at_an_iteration_hits_that_iteration(tmp_path):
    """The link goes down when rank 0 begins measured iteration 3 (one spine: every cross-leaf ring hop uses it), so
    the ops of iteration 3 are the slow ones, whatever the time the warm-up and the first iterations took."""
    coll = get("collective")
    p = {x.name: x.default for x in coll.params}
    p.update(collective="allreduce", size="256K", iterations=6, warmup=1, spines=1, leaves=2, hosts_per_leaf=2,
             host_rate_mbps=20.0, fabric_rate_mbps=20.0)
    coll.validate(p)
    cut = faultplan.parse("link-down leaf1-spine1 at_iteration=3 at_s=0.05 for_s=0.4 detect_ms=50")
    out = run_scenario(coll, p, 1, tmp_path / "run", quiet=True, faults=[cut])
    assert out["data_verified"] and out["link_down_events"] == 1, out
    run = load_run(tmp_path / "run")
    kinds = list(run.events["kind"])
    assert kinds[:2] == ["iteration_reached", "link_down"], run.events
    per_iter = (run.ops["end_s"] - run.ops["start_s"]).groupby(run.ops["iteration"]).max()
    print(per_iter.to_dict())
    assert per_iter.idxmax() == 3 and per_iter[3] > 0.3 + per_iter.drop(3).max(), per_iter
    down_at = float(run.events[run.events["kind"] == "link_down"]["t_s"].iloc[0])
    starts = run.ops[run.ops["iteration"] == 3]["iter_start_s"]
    assert 0.0 <= down_at - float(starts.min()) < 0.3, (down_at, starts.min())


def test_a_fault_at_an_iteration_the_job_does_not_have_exits_2(tmp_path):
    import subprocess
    import sys

    for spec, says in (("link-down leaf1-spine1 at_iteration=5", "past the last iteration (4)"),
                       ("link-down leaf1-spine1 at_iteration=1.5", "at_iteration must be a whole number")):
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "collective", "--vm", "never", "--out",
                            str(tmp_path / "x"), "--set", "iterations=5", "--fault", spec],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, (spec, r.stderr)
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "smoke", "--vm", "never", "--out",
                        str(tmp_path / "y"), "--fault", "link-down h1-s1 at_iteration=1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "needs a workload with iterations" in r.stderr, r.stderr
