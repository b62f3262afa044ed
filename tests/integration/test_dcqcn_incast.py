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
least 4 bins both sent in from the join on, and Jain over their last third at least JAIN_MIN: in the median of
CONVERGE_RUNS runs (a single run fell below it once in 20).
"""

from __future__ import annotations

from statistics import median

from analysis.dcqcn import cut_and_recovered, lead_rates, starts
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
#: the convergence runs per test: one run's Jain over the last third fell below JAIN_MIN in 1 of 20 (0.882, in CI;
#: the others 0.925-0.9997), so the claim is the median's: P(2 of 3 below) ~ 3 x 0.05^2 < 1 %. The test stops after
#: two counted runs that both read fair (the median of three is then fair whatever the third reads): ~2 runs usually
CONVERGE_RUNS = 3
#: a run counts when its late flow began at least this long after the first (the samples are 50 ms apart; the
#: writers are launched 1 s apart and began 0.50-1.74 s apart in 23 runs: perftest's start-up in the VM varies)
STAGGER_MIN_S = 0.3


def test_dcqcn_flows_that_start_apart_converge_to_a_fair_share(tmp_path):
    """The first writer alone at the line rate, the second joining about a second later: they come to a fair share and
    keep it; the claim is the typical run's, so CONVERGE_RUNS runs (a fabric each) and medians. Measured in the lab
    VM with CONVERGE (docs/dcqcn.md, "Convergence"; 23 runs: this test's single runs, scripts/dcqcn_converge.py's,
    one CI run and the 3 of this test's first pass): stagger 0.50-1.74 s, Jain in the first joint bin 0.81-1.00,
    Jain over the last third of the 0.5 s bins from the join 0.882-0.9997 (median 0.99; below JAIN_MIN once). The
    low runs are DCQCN's own: in the 0.925 one the late flow joined with alpha = 1 against the first one's decayed
    0.93, so its cuts were deeper, and 4 of the first flow's 25 CNPs fell inside its cut interval (the late one's:
    none), so it was cut 25 times to 21 and ran at ~3.0 against ~5.2 Mbit/s over the last third. 11-24 joint bins,
    no lossless drop in any. About 30-40 s per run in the VM (the 3: 121.5 s; Jain 0.999, 0.943, 0.922); the test
    stops at two runs when both count and read fair."""
    runs, premised = [], []
    for i in range(CONVERGE_RUNS):
        dq = inc.run_incast(tmp_path / f"converge-{i}", DcqcnSettings(), incast=CONVERGE)
        runs.append(dq)
        print({k: v for k, v in dq.items() if k not in ("rates", "counters")})
        # counters, every run: the lossless class stayed lossless, two flows, in the order they were launched
        assert dq["lossless_drops"] == 0 and not dq["sampler_errors"], dq["sampler_errors"][:3]
        first, late = starts(dq["rates"]).index  # exactly two flows, in the order they began to send
        assert first.startswith("h3>") and late.startswith("h4>"), (first, late)
        assert dq["dcqcn_joint_bins"] >= 4, dq["dcqcn_joint_bins"]
        # the premises, per run: the late one really started later (writers 1 s apart: 0.50-1.74 s seen) and the
        # first flow had the port to itself at the line rate in the second before the late flow's QP appeared (the
        # highest of its Rc samples there, within 5 %: a starved sampler may list the late QP after it sent). A run
        # that misses them (flows that began together are fair trivially) does not count
        lead = lead_rates(dq["rates"], window_s=1.0)
        if dq["dcqcn_stagger_s"] >= STAGGER_MIN_S and len(lead) and lead.max() >= 0.95 * dq["line_rate_kbps"]:
            premised.append(dq)
        # decided early: two counted runs both fair make the median of three fair whatever the third reads
        if len(premised) == 2 and min(p["dcqcn_jain_joint_last"] for p in premised) >= JAIN_MIN:
            break
    # two of the runs must hold the premises
    assert len(premised) >= 2, [(dq["dcqcn_stagger_s"], list(lead_rates(dq["rates"], window_s=1.0))) for dq in runs]
    # DCQCN acted, or two flows never cut (or stuck at R_min) would read fair trivially: after the join each flow
    # was cut below half the line and came back above 0.3 of it (23 runs: lowest 1000-1875, then 5000-10000 kbit/s)
    line_kbps = runs[0]["line_rate_kbps"]
    for dq in premised:
        cr = cut_and_recovered(dq["rates"])
        assert len(cr) == 2, cr   # both flows, or the check below would pass on one
        for flow, (low, back) in cr.items():
            assert low <= 0.5 * line_kbps and back >= 0.3 * line_kbps, (flow, low, back, line_kbps)
    # ... and they came to a fair share and kept it: Jain over the last third of the bins from the join on, the
    # median over the runs that held the premises (the convergence time is printed, not asserted: it turns on
    # whether the single last joint bin reads >= 0.9)
    jains = [dq["dcqcn_jain_joint_last"] for dq in premised]
    assert median(jains) >= JAIN_MIN, jains
