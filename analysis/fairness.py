"""Fairness between flows that share a bottleneck: Jain's index, once and over time.

Jain's fairness index of rates x_1..x_n is (sum x)^2 / (n * sum x^2): 1 when every flow has the same rate, 1/n when
one flow has it all. DCQCN's convergence (issue 28; Zhu et al. 2015 show it for 2 and more flows) is read from
dcqcn_rates.csv: each QP's current rate Rc over time, one QP = one flow.
"""

from __future__ import annotations

from typing import Iterable

import pandas as pd


def jain_index(rates: Iterable[float]) -> float:
    """Jain's index of the given rates (NaN for no flow or when every rate is 0)."""
    xs = [float(x) for x in rates]
    total, squares = sum(xs), sum(x * x for x in xs)
    if not xs or squares == 0:
        return float("nan")
    return total * total / (len(xs) * squares)


def jain_over_time(rates: pd.DataFrame, bin_s: float = 0.5, senders: Iterable[str] | None = None) -> pd.DataFrame:
    """Jain's index of the flows' rates per time bin, from dcqcn_rates.csv's rows (t_s, host, peer, rqpn,
    rc_kbps, cnp_received): each flow's mean Rc in the bin, over the flows seen in it. Columns: t_s (the bin's start,
    from the first sample), flows, jain.

    Which rows are flows: every mapped QP has a rate state, the receiving end's too (it sits at the line rate,
    sending nothing), so by default a flow is a QP that received at least one CNP in the run: one that sent into a
    congested queue. `senders` (host names) counts every QP of those hosts instead."""
    if rates.empty:
        return pd.DataFrame(columns=["t_s", "flows", "jain"])
    df = rates.assign(flow=rates["host"].astype(str) + ">" + rates["peer"].astype(str) + "/" +
                      rates["rqpn"].astype(str),
                      bin=((rates["t_s"] - rates["t_s"].min()) // bin_s).astype(int))
    if senders is not None:
        df = df[df["host"].isin(list(senders))]
    else:
        df = df[df.groupby("flow")["cnp_received"].transform("max") > 0]
    per_flow = df.groupby(["bin", "flow"])["rc_kbps"].mean().reset_index()
    out = per_flow.groupby("bin")["rc_kbps"].agg(flows="count", jain=jain_index).reset_index()
    out["t_s"] = out["bin"] * bin_s
    return out[["t_s", "flows", "jain"]]


__all__ = ["jain_index", "jain_over_time"]
