"""Packet trimming as the Lab installs it (lab.trim(), what `--set trim=on` uses): the program's filter on the
egress of every switch port and of no host NIC, a UET burst through a shallow receiver port trimmed and NACKed
(the switch's count equals the receiver's), trim.csv and uet.csv written, and at finish() every filter detached
from the still-running fabric with the clsacts it added; a second burst appends its uet.csv rows, one number per host.
Counters only, no timing. About 4 s."""

from __future__ import annotations

import csv
import os
import time

import pytest

from testbed.kernel import netns
from testbed.kernel.spray import CLSACT_EGRESS
from testbed.kernel.trim import PROGRAM
from testbed.lab import Lab
from topologies import QueueSpec
from topologies.mininet_topo import LeafSpineTopo

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")


def _trim_filters(lab) -> dict[tuple[str, str], int]:
    """(node, ifname) -> how many filters named like the trimming program sit on its clsact egress."""
    out = {}
    for node, ns, ifname in lab.ports():
        with netns.ipr(ns) as ipr:
            idx = ipr.link_lookup(ifname=ifname)[0]
            fs = list(ipr.get_filters(index=idx, parent=CLSACT_EGRESS))
        out[(node, ifname)] = sum(PROGRAM in str(f) for f in fs)
    return out


def _clsacts(lab) -> set[tuple[str, str]]:
    """The ports with a clsact qdisc."""
    out = set()
    for node, ns, ifname in lab.ports():
        with netns.ipr(ns) as ipr:
            idx = ipr.link_lookup(ifname=ifname)[0]
            if any(q.get_attr("TCA_KIND") == "clsact" for q in ipr.get_qdiscs(index=idx)):
                out.add((node, ifname))
    return out


def test_trimming_goes_on_every_switch_port_trims_a_uet_incast_and_comes_off(tmp_path):
    before = set(netns.list_ours())
    topo = LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=40,
                         leaf_down_queue=QueueSpec("droptail", buffer_bytes=8000))
    with Lab(topo, out=tmp_path / "trim", quiet=True) as lab:
        had = _clsacts(lab)
        tr = lab.trim()
        on = _trim_filters(lab)
        switch = {k for k in on if not k[0].startswith("h")}
        assert switch and all(on[k] == 1 for k in switch) and not any(on[k] for k in set(on) - switch), on
        lab.burst(["h2", "h3", "h4"], "h1", 32_000, rounds=3, transport="uet")
        s = tr.finish()
        after, clsacts = _trim_filters(lab), _clsacts(lab)
        lab.burst(["h1"], "h4", 8_000, rounds=1, transport="uet")  # another burst: uet.csv gets its rows too
    assert not any(after.values()), after  # detached while the fabric still stood
    assert clsacts == had, (clsacts, had)  # and the clsacts install added are gone
    print(s)
    assert s["uet_trim_ports"] == len(switch) and s["uet_trimmed_packets"] > 0, s
    with open(tmp_path / "trim" / "uet.csv") as f:
        rows = list(csv.DictReader(f))
    got: dict[tuple[str, str], int] = {}
    for r in rows:  # summed over the two bursts (trimming was off in the second)
        got[(r["host"], r["counter"])] = got.get((r["host"], r["counter"]), 0) + int(r["value"])
    assert got[("h1", "block_mismatches")] == 0 and ("h4", "block_mismatches") in {(r["host"], r["counter"])
                                                                                    for r in rows}
    assert len({(r["rank"], r["host"]) for r in rows}) == len({r["host"] for r in rows}) == 4  # one number a host
    assert got[("h1", "trimmed_received")] == s["uet_trimmed_packets"], (got, s)  # every trimmed header arrived
    assert lab.summary.get("uet_trimmed_packets") == s["uet_trimmed_packets"]  # the lab's end put them in its summary
    assert not set(netns.list_ours()) - before


def test_a_slow_port_fault_slows_the_trimming_programs_drain_and_the_port_trims_while_slow(tmp_path):
    """slow-port leaf1:h1 (the receiver's port, 20 -> 5 Mbit/s) for good: while it is slow, the port's program
    drains its virtual queue at 5 Mbit/s (its config map) and trims; when the lab ends the timeline restores the
    port before trimming finishes, and the map is back at 20 Mbit/s (the trim_rate event reads it back)."""
    topo = LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=40,
                         leaf_down_queue=QueueSpec("droptail", buffer_bytes=12_000))
    with Lab(topo, out=tmp_path / "slow", quiet=True) as lab:
        tr = lab.trim()  # before lab.at(): the lab's end closes the timeline (restoring the port) first
        lab.at(0.0, "slow-port leaf1:h1 fraction=0.25")
        program = tr.loaded[("leaf1", "h1")][1]
        assert program.drain_rate_mbps() == pytest.approx(20.0)
        lab.burst(["h2", "h3", "h4"], "h1", 24_000, rounds=2, transport="uet")
        slow_rate = program.drain_rate_mbps()
        trimmed = tr.counters()[("leaf1", "h1")]["trimmed_packets"]
        others = {k: (tr.loaded[k][1].drain_rate_mbps(), lab.net.fabric.port_plan(*k).rate_mbps)
                  for k in tr.loaded if k != ("leaf1", "h1")}
    assert slow_rate == pytest.approx(5.0) and trimmed > 0, (slow_rate, trimmed)
    assert all(now == pytest.approx(planned) for now, planned in others.values()), others  # the others untouched
    with open(tmp_path / "slow" / "events.csv") as f:
        ev = [r for r in csv.DictReader(f) if r["kind"] == "trim_rate"]
    assert [(r["target"], r["detail"].split(";")[0]) for r in ev] == [("leaf1:h1", "drain_rate_mbps=5"),
                                                                      ("leaf1:h1", "drain_rate_mbps=20")], ev
    at_slow = int(ev[0]["detail"].split("trimmed_packets=")[1].split(";")[0])
    assert lab.summary["trimmed_while_slow_packets"] == trimmed - at_slow, lab.summary


def test_trimming_started_during_a_slow_port_fault_drains_at_the_slowed_rate_and_says_so(tmp_path):
    """The fault first, then lab.trim(): the port's program starts at the slowed rate (the timeline's record of each
    port's rate now), and events.csv has its trim_rate row from the start (no trims yet), where a restore's row would
    close the interval (here trimming finishes first, at the lab's end: analysis.faults.trimmed_while_slow leaves an
    interval trimming outlived to trim.csv's totals)."""
    topo = LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=40,
                         leaf_down_queue=QueueSpec("droptail", buffer_bytes=12_000))
    with Lab(topo, out=tmp_path / "late", quiet=True) as lab:
        lab.at(0.0, "slow-port leaf1:h1 fraction=0.25")
        lab.start_workload()
        deadline = time.monotonic() + 5
        while not (lab.fault_events()["kind"] == "port_slow").any() and time.monotonic() < deadline:
            time.sleep(0.05)
        tr = lab.trim()
        started_at = tr.loaded[("leaf1", "h1")][1].drain_rate_mbps()
        lab.burst(["h2", "h3", "h4"], "h1", 24_000, rounds=2, transport="uet")
        trimmed = tr.counters()[("leaf1", "h1")]["trimmed_packets"]
    assert started_at == pytest.approx(5.0) and trimmed > 0, (started_at, trimmed)
    with open(tmp_path / "late" / "events.csv") as f:
        ev = [r for r in csv.DictReader(f) if r["kind"] == "trim_rate"]
    assert [(r["target"], r["detail"].split(";")[:2]) for r in ev][0] == ("leaf1:h1", ["drain_rate_mbps=5",
                                                                                      "trimmed_packets=0"]), ev
