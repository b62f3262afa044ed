"""Ultra Ethernet's numbers for one run, from the raw files the run wrote (docs/uet.md):

* ``uet.csv`` (``rank, host, counter, value``): each rank's UET transport counters at the job's end, summed over
  its peers (traffic.uet.UetTransport.totals(): data_packets, retransmitted_packets, retransmitted_bytes,
  nack_retransmits, fast_retransmits, rto_retransmits, rto_events, nacks_received, trimmed_received, acks_received,
  ecn_echoes, and the window's events as cc_<EVENT>), written by the collective job (testbed.workloads.collective);
* ``trim.csv`` (``node, port, counter, value``): each switch port's trimming program counters at the end
  (testbed.kernel.trim.STATS: packets, uet_data_packets, trimmed_packets, trimmed_bytes_cut, too_short_to_trim;
  and vq_peak_bytes, its virtual queue's peak), written by testbed.workloads.trimming.

:func:`uet_metrics` and :func:`trim_metrics` are the one definition of the summary's ``uet_*`` keys.
"""

from __future__ import annotations

import pandas as pd

#: the transport counters summed over the ranks into the summary (uet_<name>); a counter no rank incremented is 0
TOTALS = ("data_packets", "retransmitted_packets", "retransmitted_bytes", "nack_retransmits", "fast_retransmits",
          "rto_retransmits", "rto_events", "nacks_received", "trimmed_received", "acks_received", "ecn_echoes")
#: the per-rank breakdowns (uet_<name>_by_rank: "rank=value; ..." for the ranks where it is not 0)
BY_RANK = ("rto_events", "nacks_received", "retransmitted_packets")
#: the trimming program's counters summed over the switch ports (uet_<name>)
TRIM_TOTALS = ("trimmed_packets", "trimmed_bytes_cut", "too_short_to_trim")


def _sum(df: pd.DataFrame, key: str, name: str) -> int:
    return int(df.loc[df[key] == name, "value"].sum())


def uet_metrics(counters: pd.DataFrame) -> dict:
    """The transport's uet_* keys from uet.csv's rows: :data:`TOTALS` summed over the ranks, the window's events
    (uet_cc_<event>), :data:`BY_RANK` per rank, uet_retransmit_fraction (retransmitted / data packets) and
    uet_ranks (how many ranks reported). Empty without rows."""
    if counters.empty:
        return {}
    out: dict = {f"uet_{name}": _sum(counters, "counter", name) for name in TOTALS}
    for name in sorted(n for n in counters["counter"].astype(str).unique() if n.startswith("cc_")):
        out[f"uet_{name.lower()}"] = _sum(counters, "counter", name)
    by = counters.groupby(["rank", "counter"])["value"].sum()
    ranks = sorted(int(r) for r in counters["rank"].unique())
    for name in BY_RANK:
        out[f"uet_{name}_by_rank"] = "; ".join(f"{r}={int(by.get((r, name), 0))}" for r in ranks
                                               if by.get((r, name), 0))
    data = out["uet_data_packets"]
    out["uet_retransmit_fraction"] = out["uet_retransmitted_packets"] / data if data else None
    out["uet_ranks"] = len(ranks)
    return out


def trim_metrics(counters: pd.DataFrame) -> dict:
    """The switches' uet_* keys from trim.csv's rows: :data:`TRIM_TOTALS` summed over the ports
    (uet_trimmed_packets, ...), the ports that trimmed with their counts (uet_trimmed_by_port: "node:port=n; ..."),
    the largest virtual-queue peak (uet_trim_vq_peak_bytes_max) and how many ports carried the program
    (uet_trim_ports). Empty without rows."""
    if counters.empty:
        return {}
    out: dict = {f"uet_{name}": _sum(counters, "counter", name) for name in TRIM_TOTALS}
    trimmed = counters[counters["counter"] == "trimmed_packets"]
    busy = trimmed[trimmed["value"] > 0].sort_values(["node", "port"])
    out["uet_trimmed_by_port"] = "; ".join(f"{n}:{p}={int(v)}" for n, p, v in
                                           zip(busy["node"], busy["port"], busy["value"]))
    peaks = counters.loc[counters["counter"] == "vq_peak_bytes", "value"]
    out["uet_trim_vq_peak_bytes_max"] = int(peaks.max()) if len(peaks) else 0
    out["uet_trim_ports"] = int(counters[["node", "port"]].drop_duplicates().shape[0])
    return out


__all__ = ["BY_RANK", "TOTALS", "TRIM_TOTALS", "trim_metrics", "uet_metrics"]
