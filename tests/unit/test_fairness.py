"""Jain's fairness index (analysis.fairness): its bounds and its reading of dcqcn_rates.csv over time."""

import math

import pandas as pd
import pytest

from analysis.fairness import jain_index, jain_over_time


def test_equal_rates_are_perfectly_fair_and_one_hog_is_one_over_n():
    assert jain_index([5, 5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([8, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([3, 1]) == pytest.approx(16 / 20)  # (3+1)^2 / (2 * (9+1))
    assert math.isnan(jain_index([])) and math.isnan(jain_index([0, 0]))


def test_two_flows_converging_show_a_rising_index_per_bin():
    rows = []
    for i in range(20):  # flow A starts at 9 Mbit/s, B at 1; they meet at 5 by t = 1 s
        t = i * 0.1
        a = max(5000, 9000 - 8000 * t)
        rows += [(t, "h1", "h3", 17, a, 1 + i), (t, "h2", "h3", 18, 10000 - a, 1 + i),
                 (t, "h3", "h1", 21, 20000, 0)]  # the receiver's end of h1's QP: mapped, idle, never a CNP
    df = pd.DataFrame(rows, columns=["t_s", "host", "peer", "rqpn", "rc_kbps", "cnp_received"])
    out = jain_over_time(df, bin_s=0.5)
    assert list(out["flows"]) == [2, 2, 2, 2]  # the idle receiver QP is not a flow
    assert list(jain_over_time(df, bin_s=0.5, senders=["h1", "h2", "h3"])["flows"]) == [3, 3, 3, 3]
    assert list(out["jain"]) == sorted(out["jain"])  # never less fair than the bin before
    assert out["jain"].iloc[0] < 0.85 and out["jain"].iloc[-1] == pytest.approx(1.0)


def test_no_rows_no_bins():
    assert jain_over_time(pd.DataFrame(columns=["t_s", "host", "peer", "rqpn", "rc_kbps", "cnp_received"])).empty
