"""DCQCN's convergence from unequal rates, its pure part: analysis.dcqcn.starts (when each flow began to send, from
its rate state changing in dcqcn_rates.csv) and analysis.dcqcn.convergence (the stagger between the first and the
last flow, and the time from the last one's start until Jain's index of the flows' rates stayed >= 0.9), and
testbed.workloads.dcqcn_incast.Incast's refusals."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from testbed.errors import UsageError
from analysis.dcqcn import FAIR_JAIN, convergence, cut_and_recovered, dcqcn_metrics, jain_last, lead_rates, starts

COLUMNS = ["t_s", "host", "peer", "rqpn", "rc_kbps", "rt_kbps", "alpha", "rate_cuts", "cnp_received", "cnp_ignored"]


def staggered(late_rc, join_i: int = 20, n: int = 60, dt: float = 0.1) -> pd.DataFrame:
    """h3's QP sends from sample 1 on at 10 Mbit/s (its alpha decaying each sample: it sends); h4's QP is mapped
    at sample `join_i` and sends from the next one; late_rc(k) gives both flows' rates k samples after the join
    (h3's, h4's). h1's receiving QP sits at the line rate, idle. Every flow received CNPs (a flow of the analysis)."""
    rows = []
    for i in range(n):
        t = 100 + i * dt
        a, b = (10000, None) if i < join_i else late_rc(i - join_i)
        rows.append((t, "h3", "h1", 17, a, 10000, round(1 - 0.004 * i, 5), i // 10, 1 + i // 10, 0))
        if b is not None:
            rows.append((t, "h4", "h1", 18, b, 10000, round(1 - 0.004 * (i - join_i), 5), 1 + i, 1 + i, 0))
        rows.append((t, "h1", "h3", 17, 10000, 10000, 1.0, 0, 0, 0))
    return pd.DataFrame(rows, columns=COLUMNS)


def test_starts_are_the_first_samples_whose_state_changed():
    s = starts(staggered(lambda k: (5000, 5000)))
    assert list(s.index) == ["h3>h1/17", "h4>h1/18"]  # the idle receiving QP is no flow
    assert s.iloc[0] == pytest.approx(100.1) and s.iloc[1] == pytest.approx(102.1)  # the first sample: no change


def test_the_lead_rates_are_the_first_flows_in_the_window_before_the_last_one_appeared():
    def late(k):
        return 5000, 5000

    rates = staggered(late)
    rates.loc[(rates["host"] == "h3") & (rates["t_s"] > 101.55) & (rates["t_s"] < 101.65), "rc_kbps"] = 9000
    assert list(lead_rates(rates)) == [10000, 9000, 10000, 10000, 10000]  # 101.5 .. 101.9: h4 is seen at 102.0
    assert list(lead_rates(rates, window_s=0.25)) == [10000, 10000]
    assert lead_rates(staggered(late, join_i=70)).empty  # one flow


def test_cut_and_recovered_is_each_flows_lowest_rate_from_the_join_and_its_highest_after_it():
    # from the join (h4's first sending sample, k = 1) both are cut to 2 and 3 Mbit/s at k = 5, then climb back
    r = staggered(lambda k: (2000 + 500 * max(0, k - 5), 3000 + 200 * max(0, k - 5)) if k >= 5 else (8000, 9000))
    got = cut_and_recovered(r)
    assert set(got) == {"h3>h1/17", "h4>h1/18"}
    assert got["h3>h1/17"] == (2000.0, 2000.0 + 500 * 34) and got["h4>h1/18"] == (3000.0, 3000.0 + 200 * 34)
    # h3 alone at 10 Mbit/s before the join is not its high: the high comes after the low
    assert cut_and_recovered(staggered(lambda k: (5000, 5000)))["h3>h1/17"] == (5000.0, 5000.0)
    # one flow: from its own start on; no flow: nothing
    assert cut_and_recovered(staggered(lambda k: (5000, 5000), join_i=70)) == {"h3>h1/17": (10000.0, 10000.0)}
    assert cut_and_recovered(pd.DataFrame(columns=COLUMNS)) == {}


def test_flows_fair_from_the_join_converge_at_once():
    c = convergence(staggered(lambda k: (5000 + 10 * (k % 2), 5000 - 10 * (k % 2))))
    assert c["stagger_s"] == pytest.approx(2.0)
    assert c["convergence_s"] == 0.0 and c["joint_bins"] == 8  # from the join (2.1 s) to the end (5.9 s)
    assert c["jain_joint_last"] == pytest.approx(1.0, abs=1e-4)


def test_the_join_bin_holds_no_solo_samples_wherever_the_join_falls():
    # h3 alone at 10 Mbit/s, then both at 2 at once: the first joint bin is fair whatever the join's phase against
    # a grid from the first sample (bins from the first sample mixed h3's solo 10 into the join's bin: 0.3 s at 21)
    for join_i in (20, 21, 22, 23, 24):
        c = convergence(staggered(lambda k: (2000 + k % 2, 2000 - k % 2), join_i=join_i))
        assert c["convergence_s"] == 0.0 and c["jain_join"] > 0.999, (join_i, c)


def test_a_flow_that_ends_mid_bin_is_compared_only_over_the_time_both_ran():
    # both at 5 Mbit/s; h3 ends at 4.1 s (its state then frozen in the map) and h4 takes the line rate, 10, in the
    # rest of the bin: compared only up to h3's end, the last bin is fair (counting h4's solo samples: Jain 0.95)
    rates = staggered(lambda k: (5000 + k % 2, 5000 - k % 2 if k < 22 else 10000 - k % 2), n=45)
    h3 = rates["host"] == "h3"
    end = rates.loc[h3 & (rates["t_s"] <= 104.1 + 1e-9)].iloc[-1]
    cols = ["rc_kbps", "rt_kbps", "alpha", "rate_cuts", "cnp_received"]
    rates.loc[h3 & (rates["t_s"] > 104.1 + 1e-9), cols] = end[cols].values
    c = convergence(rates)
    assert c["convergence_s"] == 0.0 and c["jain_joint_last"] > 0.999, c
    assert jain_last(rates) > 0.999
    rates.loc[(rates["host"] == "h4") & (rates["t_s"] <= 104.1 + 1e-9) & (rates["t_s"] > 103.05), "rc_kbps"] = 500
    assert convergence(rates)["jain_joint_last"] < 0.9  # unfair while both ran still counts


def test_unequal_rates_converge_when_jain_stays_fair():
    # the late flow at 1 Mbit/s beside 9 for 1.4 s after its start (2.1 s; Jain 0.61), then both at 5 (0.5 s bins
    # from the join: 2.1, 2.6, 3.1 hold unfair samples, 3.6 on is fair)
    c = convergence(staggered(lambda k: (9000 - k % 2, 1000 + k % 2) if k < 15 else (5000 + k % 2, 5000 - k % 2)))
    assert c["convergence_s"] == 1.5  # three whole bins
    assert c["jain_join"] == pytest.approx(0.61, abs=0.01)  # 9 against 1 Mbit/s in the join's bin
    m = dcqcn_metrics(pd.DataFrame([("h3", "rate_cuts", 1)], columns=["host", "counter", "value"]),
                      staggered(lambda k: (9000 - k % 2, 1000 + k % 2) if k < 15 else (5000 + k % 2, 5000 - k % 2)))
    assert m["dcqcn_convergence_s"] == 1.5 and m["dcqcn_stagger_s"] == pytest.approx(2.0)


def test_a_share_that_turns_unfair_again_converges_only_after_its_last_unfair_bin():
    rc = lambda k: (5000 + k % 2, 5000) if k < 10 or k >= 20 else (9000 + k % 2, 1000)  # noqa: E731
    # unfair from 3.0 to 3.9 s: the bins (from the join, 2.1 s) at 3.1 and 3.6 s; at 2.6 one unfair sample of five
    # (Jain 0.98), from 4.1 s fair: four whole bins after the join
    assert convergence(staggered(rc))["convergence_s"] == 2.0


def test_a_share_still_unfair_at_the_end_never_converged():
    c = convergence(staggered(lambda k: (9000 + k % 2, 1000 - k % 2)))
    assert math.isnan(c["convergence_s"]) and c["joint_bins"] > 0
    assert dcqcn_metrics(pd.DataFrame([("h3", "rate_cuts", 1)], columns=["host", "counter", "value"]),
                         staggered(lambda k: (9000 + k % 2, 1000 - k % 2)))["dcqcn_convergence_s"] is None


def test_one_flow_has_no_convergence():
    c = convergence(staggered(lambda k: (5000, None), join_i=70))
    assert math.isnan(c["stagger_s"]) and math.isnan(c["convergence_s"]) and c["joint_bins"] == 0
    assert math.isnan(c["jain_join"])


def test_the_fairness_threshold_is_the_one_the_docs_name():
    # docs/dcqcn.md's definition of the convergence time names the threshold analysis.dcqcn applies
    import re
    from pathlib import Path

    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "dcqcn.md").read_text().split())
    named = re.findall(r"every later joint bin has Jain >= ([0-9.]+)", doc)
    assert named and all(float(x) == FAIR_JAIN for x in named), named


def test_an_incast_needs_a_start_and_a_message_count_per_sender():
    from testbed.workloads.dcqcn_incast import MESSAGES, Incast

    assert Incast().start_s == (0.0, 0.0) and Incast().messages == (MESSAGES, MESSAGES)
    for bad in ({"start_s": (0.0,)}, {"messages": (1, 2, 3)}, {"start_s": (0.0, -1.0)}, {"messages": (0, 5)}):
        with pytest.raises(UsageError, match="one start"):
            Incast(**bad)


def test_an_incast_refuses_senders_the_fabric_cannot_write_from_and_no_bottleneck():
    from testbed.workloads.dcqcn_incast import Incast

    assert Incast(senders=("h3", "h4", "h2")).messages == (24, 24, 24)
    for senders in (("h3", "h9"), ("h3", "h1"), ("h3", "h3"), ()):
        with pytest.raises(UsageError, match="distinct hosts among h2, h3, h4") as e:
            Incast(senders=senders)
        assert "\n" not in str(e.value)
    for mbps in (0.0, -5.0, float("nan")):
        with pytest.raises(UsageError, match="bottleneck_mbps must be > 0"):
            Incast(bottleneck_mbps=mbps)
