"""TCP metrics from tcp.csv (per-connection tcp_info counters): deltas and the retransmit rate."""

from __future__ import annotations

import math

import pandas as pd


def tcp_deltas(tcp: pd.DataFrame) -> pd.DataFrame:
    """``after - before`` per (host, counter) from tcp.csv (or rdma.csv after dropping ``device``).
    Counters present in only one phase are left out."""
    if tcp.empty:
        return pd.DataFrame({"host": pd.Series([], dtype=object), "counter": pd.Series([], dtype=object),
                             "delta": pd.Series([], dtype="int64")})
    p = tcp.pivot_table(index=["host", "counter"], columns="phase", values="value", aggfunc="sum")
    if "before" not in p.columns or "after" not in p.columns:
        return pd.DataFrame({"host": pd.Series([], dtype=object), "counter": pd.Series([], dtype=object),
                             "delta": pd.Series([], dtype="int64")})
    p = p.dropna(subset=["before", "after"])
    out = (p["after"] - p["before"]).rename("delta").reset_index()
    out["delta"] = out["delta"].astype("int64")
    return out


def retransmit_rate(tcp: pd.DataFrame, host: str | None = None) -> float:
    """``delta TcpRetransSegs / delta TcpOutSegs`` summed over hosts (or one host); nan if no segments
    were sent or the counters are absent."""
    d = tcp_deltas(tcp)
    if host is not None:
        d = d[d["host"] == host]
    retrans = d.loc[d["counter"] == "TcpRetransSegs", "delta"].sum()
    out = d.loc[d["counter"] == "TcpOutSegs", "delta"].sum()
    return float(retrans) / float(out) if out > 0 else math.nan
