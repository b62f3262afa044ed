"""Ultra Ethernet's numbers for one run, from the raw files the run wrote (docs/uet.md):

* ``uet.csv`` (``rank, host, counter, value``; rank: the host's number in the lab, the same in every burst and
  job, which append their rows): each host's UET transport counters at a burst's or job's end, summed over its
  peers (and its ranks) (traffic.uet.UetTransport.totals(): data_packets, retransmitted_packets, retransmitted_bytes,
  nack_retransmits, fast_retransmits, rto_retransmits, rto_events, nacks_received, trimmed_received, acks_received,
  ecn_echoes, and the window's events as cc_<EVENT>; a burst's receiver also block_mismatches), written by the
  collective job (testbed.workloads.collective) and each UET burst (testbed.workloads.handles);
* ``trim.csv`` (``node, port, counter, value``): each switch port's trimming program counters at the end
  (testbed.kernel.trim.STATS: packets, uet_data_packets, trimmed_packets, trimmed_bytes_cut, too_short_to_trim;
  and vq_peak_bytes, its virtual queue's peak), written by testbed.workloads.trimming.

:func:`uet_metrics` and :func:`trim_metrics` are the one definition of the summary's ``uet_*`` keys.
"""

from __future__ import annotations

import pandas as pd

#: the transport counters summed over the hosts into the summary (uet_<name>); a counter no host incremented is 0
TOTALS = ("data_packets", "retransmitted_packets", "retransmitted_bytes", "nack_retransmits", "fast_retransmits",
          "rto_retransmits", "rto_events", "nacks_received", "trimmed_received", "acks_received", "ecn_echoes",
          "block_mismatches")
#: the per-host breakdowns (uet_<name>_by_host: "host=value; ..." for the hosts where it is not 0)
BY_HOST = ("rto_events", "nacks_received", "retransmitted_packets")
#: the trimming program's counters summed over the switch ports (uet_<name>)
TRIM_TOTALS = ("trimmed_packets", "trimmed_bytes_cut", "too_short_to_trim")


def _sum(df: pd.DataFrame, key: str, name: str) -> int:
    return int(df.loc[df[key] == name, "value"].sum())


def uet_metrics(counters: pd.DataFrame) -> dict:
    """The transport's uet_* keys from uet.csv's rows: :data:`TOTALS` summed over the rows, the window's events
    (uet_cc_<event>), :data:`BY_HOST` per host, uet_trimmed_unanswered (trimmed headers the receivers got minus
    packets the senders resent on a NACK: 0 when every trim was answered; below 0 if a NACK came without a trim),
    uet_retransmit_fraction (retransmitted / data packets) and
    uet_hosts (how many hosts reported). Empty without rows."""
    if counters.empty:
        return {}
    out: dict = {f"uet_{name}": _sum(counters, "counter", name) for name in TOTALS}
    for name in sorted(n for n in counters["counter"].astype(str).unique() if n.startswith("cc_")):
        out[f"uet_{name.lower()}"] = _sum(counters, "counter", name)
    by = counters.groupby(["host", "counter"])["value"].sum()
    hosts = sorted(str(h) for h in counters["host"].unique())
    for name in BY_HOST:
        out[f"uet_{name}_by_host"] = "; ".join(f"{h}={int(by.get((h, name), 0))}" for h in hosts
                                               if by.get((h, name), 0))
    # every trimmed header that reached its receiver should be answered by a NACK and resent by its sender once
    out["uet_trimmed_unanswered"] = out["uet_trimmed_received"] - out["uet_nack_retransmits"]
    data = out["uet_data_packets"]
    out["uet_retransmit_fraction"] = out["uet_retransmitted_packets"] / data if data else None
    out["uet_hosts"] = len(hosts)
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


__all__ = ["BY_HOST", "TOTALS", "TRIM_TOTALS", "trim_metrics", "uet_metrics"]
