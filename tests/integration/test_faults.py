"""Faults that need the lab VM's kernel: netem switched on and off on a live link (the fault timeline,
testbed.faults), read back from the kernel and from TCP's own counters."""

from __future__ import annotations

import time

from analysis.load import load_run
from testbed.kernel import netns
from testbed.lab import Lab
from topologies.mininet_topo import LeafSpineTopo


def netem_loss(lab: Lab, node: str) -> list[float]:
    """The loss probability (percent) of every netem qdisc in node's namespace, as the kernel holds it."""
    out = []
    with netns.ipr(lab.net.fabric.ns(node)) as ipr:
        for q in ipr.get_qdiscs():
            if q.get_attr("TCA_KIND") == "netem":
                opts = q.get_attr("TCA_OPTIONS")
                out.append(round(int(opts["loss"]) / 0xFFFFFFFF * 100, 3))
    return out


def test_a_lossy_spell_on_a_link_costs_retransmissions_and_goes_away(tmp_path):
    topo = LeafSpineTopo(spines=1, leaves=2, hosts_per_leaf=1, host_rate_mbps=10, fabric_rate_mbps=10)
    with Lab(topo, out=tmp_path / "run", name="netem-fault", quiet=True) as lab:
        lab.at(1.0, "netem leaf1:spine1 for_s=1.5 loss_percent=5")  # what leaves leaf1 towards spine1
        tcp = lab.tcp_counters(["h1"])
        flows = lab.flows([("h1", "h2")], duration_s=4.0)
        t0 = lab.faults.t0
        time.sleep(max(0.0, t0 + 1.7 - time.monotonic()))
        during = netem_loss(lab, "spine1")  # the far end's ingress IFB carries it
        time.sleep(max(0.0, t0 + 3.0 - time.monotonic()))
        after = netem_loss(lab, "spine1")
        flows.wait()
        delta = tcp.stop(lab.rundir)
    print("netem loss during:", during, "after:", after, "h1 retransmits:", delta["h1"]["TcpRetransSegs"])
    assert during == [5.0] and after == [0.0], (during, after)
    # 10 Mbit/s for 1.5 s is ~1250 segments: 5% is ~60 lost, each sent again (measured: 54)
    assert delta["h1"]["TcpRetransSegs"] >= 20, delta["h1"]
    run = load_run(tmp_path / "run")
    kinds = list(run.events["kind"])
    assert kinds[:2] == ["netem_set", "netem_cleared"], run.events
    # 1.5 s as planned, less the step's own latency (the emulated CPU: netem set 0.26 s late, measured 1240 ms)
    assert 1000 < run.summary["impaired_ms_total"] < 1700, run.summary
