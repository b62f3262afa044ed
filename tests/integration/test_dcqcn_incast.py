"""What DCQCN shows on a lossless RDMA incast (issue 28), in the lab VM: PFC alone against PFC + DCQCN on one fabric
(testbed.workloads.dcqcn_incast: h3 and h4 on leaf2 each write 1.5 MiB with ib_write_bw to h1 on leaf1, whose
5 Mbit/s downlink is the bottleneck; a lossless class for the RDMA traffic, switch ports marking ECN at 6 KB, below
XOFF 30 KB; PFC alone pauses every port, with DCQCN the switch ports only, the hosts' class holding DCQCN's fq).

Asserted on the PFC controller's and the programs' counters, never on one run's timing: with DCQCN the switch ports
are paused far less often (below PAUSE_RATIO of the PFC-only run's switch-port pause events), CNPs went out and cut
both senders' rates, nothing in the lossless class was dropped with DCQCN, and the two DCQCN flows share the port:
Jain's index of their rates, over the last third of the time both ran, at least JAIN_MIN.

And convergence from unequal rates (CONVERGE: h3 alone at the line rate, h4 joining later, h1's downlink at
12 Mbit/s): the first flow at the line rate when the second's QP appeared, then (analysis.dcqcn.convergence) at
least 4 bins both sent in from the join on, and Jain over their last third at least JAIN_MIN.
"""

from __future__ import annotations

from analysis.dcqcn import lead_rates, starts
from testbed.workloads import dcqcn_incast as inc
from testbed.workloads.dcqcn import DcqcnSettings

#: see the test's docstring for the measured spread these margins come from
PAUSE_RATIO = 0.5
JAIN_MIN = 0.9


def test_dcqcn_cuts_the_pauses_of_a_lossless_incast_and_shares_the_port_fairly(tmp_path):
    """Measured in the lab VM (shared 2-CPU host, noisy timings; docs/dcqcn.md "What it shows"): switch-port pause
    events PFC alone 152-173, with DCQCN 25-41 (ratio of medians 0.16, 95% interval 0.15-0.25; 6 pairs: this test's
    two and scripts/dcqcn_compare.py's four), no lossless drop with DCQCN in any, Jain 0.968-0.9998. The largest
    DCQCN/PFC ratio seen, 41/164 = 0.25, is half of PAUSE_RATIO, so one pair per test run. About 60 s in the VM."""
    settings = DcqcnSettings()  # the run option's defaults, tuned to the lab VM
    pfc = inc.run_incast(tmp_path / "pfc", settings, react=False)
    dq = inc.run_incast(tmp_path / "dcqcn", settings)
    print({k: v for k, v in pfc.items() if k not in ("rates", "counters")},
          {k: v for k, v in dq.items() if k not in ("rates", "counters")})
    assert pfc["pause_events"] > 0  # without DCQCN the incast drives h1's downlink over XOFF
    # DCQCN kept the lossless class lossless; PFC alone is not asserted on: in 1 of 4 runs of scripts/dcqcn_compare.py
    # h1's downlink filled its whole buffer (199 KB) and dropped 50 packets (the controller fell behind)
    assert dq["lossless_drops"] == 0
    assert not dq["sampler_errors"], dq["sampler_errors"][:3]
    assert dq["dcqcn_cnp_sent"] > 0 and dq["dcqcn_cnp_failed"] == 0
    # CE-marked packets of a QP not mapped yet (the sampler maps within 50 ms of the QP's start): a few, no more
    # (34 of 1317 = 2.6 % in a run after the merge; a starved sampler maps later: a 10 % bound)
    assert dq["dcqcn_unknown_qp"] <= 0.10 * dq["dcqcn_ce_seen"]
    by_host = dict(kv.split("=") for kv in dq["dcqcn_rate_cuts_by_host"].split("; "))
    assert set(by_host) == set(inc.SENDERS)  # both senders received CNPs outside the cut interval
    # ... and their rates really fell (a "cut" is counted even when R_min clamps it to nothing, as in PFC alone)
    line_kbps = dq["line_rate_kbps"]
    for host, mode in ((h, m) for h in inc.SENDERS for m in ("pfc", "dq")):
        rc = (dq if mode == "dq" else pfc)["rates"]
        rc = rc[rc["host"] == host]["rc_kbps"].astype(float)
        assert len(rc), (mode, host)
        if mode == "dq":
            assert rc.min() <= 0.5 * line_kbps, (host, rc.min(), line_kbps)
        else:
            assert rc.min() >= 0.95 * line_kbps, (host, rc.min(), line_kbps)  # PFC alone: R_min = the line rate
    # like for like: the switch ports' pauses (PFC alone also pauses the hosts, with DCQCN they are never paused)
    assert dq["switch_pause_events"] < PAUSE_RATIO * pfc["switch_pause_events"]
    assert dq["jain_last"] >= JAIN_MIN


#: the convergence run: h3 writes alone from its start, h4 joins 1 s later; h1's downlink at 12 Mbit/s, so one
#: flow at the line rate (10) fits and two (20) congest it; h3 writes twice h4's bytes, so they share the port for
#: seconds (docs/dcqcn.md, "Convergence")
CONVERGE = inc.Incast(start_s=(0.0, 1.0), messages=(100, 48), bottleneck_mbps=12.0)


def test_dcqcn_flows_that_start_apart_converge_to_a_fair_share(tmp_path):
    """The first writer alone at the line rate, the second joining about a second later: they come to a fair share
    and keep it (Jain over the last third of the 0.5 s bins from the join on >= JAIN_MIN). Measured in the lab VM
    with CONVERGE after the bins were anchored at the join (docs/dcqcn.md, "Convergence"; 6 runs of this test in
    two boots and 3 of scripts/dcqcn_converge.py re-evaluated): stagger 0.87-1.14 s where the test passed, Jain in
    the first joint bin 0.948-1.00, convergence time (whole bins) 0 in 7, 1.0 in 1 and 7.0 in 1 (one late unfair
    bin: why it is printed, not asserted), Jain over the last third of the joint bins 0.943-0.9997, 13-24 joint
    bins, no lossless drop. 5 of the 6 test runs passed; the sixth, on a host loaded by other work, failed a lead-rate
    premise that asked every sample of the last 0.5 s to be at the line rate (the first flow at 2540 kbit/s when the
    second QP appeared); the premise is now the highest sample of the last second. 36.5-37.6 s in the VM (65.5 s
    as the first test of a boot)."""
    dq = inc.run_incast(tmp_path / "converge", DcqcnSettings(), incast=CONVERGE)
    print({k: v for k, v in dq.items() if k not in ("rates", "counters")})
    assert dq["lossless_drops"] == 0 and not dq["sampler_errors"], dq["sampler_errors"][:3]
    rates, line_kbps = dq["rates"], dq["line_rate_kbps"]
    first, late = starts(rates).index  # exactly two flows, in the order they began to send
    assert first.startswith("h3>") and late.startswith("h4>"), (first, late)
    assert dq["dcqcn_stagger_s"] >= 0.5  # the late one really started later (writers 1 s apart: 0.87-1.38 s seen)
    # the first flow had the port to itself at the line rate in the second before the late flow's QP appeared (the
    # highest of its Rc samples there, within 5 %): the late one joins at the line rate, so they start unequal. Not
    # every sample: on a loaded host the sampler may list the late QP after it began to send, and the first flow's
    # last samples can already hold its cut (2540 kbit/s in 1 of 6 runs, the run otherwise converged)
    before = lead_rates(rates, window_s=1.0)
    assert len(before) and before.max() >= 0.95 * line_kbps, (list(before), line_kbps)
    # ... and they came to a fair share and kept it: Jain over the last third of the bins from the join on (the
    # convergence time is printed, not asserted: it turns on whether the single last joint bin reads >= 0.9)
    assert dq["dcqcn_joint_bins"] >= 4, dq["dcqcn_joint_bins"]
    assert dq["dcqcn_jain_joint_last"] >= JAIN_MIN, dq["dcqcn_jain_joint_last"]
