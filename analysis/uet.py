"""Ultra Ethernet's numbers for one run, from the raw files the run wrote (docs/uet.md):

* ``uet.csv`` (``rank, host, counter, value``; rank: the host's number in the lab, the same in every burst and
  job, which append their rows): each host's UET transport counters at a burst's or job's end, summed over its
  peers (and its ranks) (traffic.uet.UetTransport.totals(): data_packets, retransmitted_packets, retransmitted_bytes,
  nack_retransmits, fast_retransmits, rto_retransmits, rto_events, nacks_received, trimmed_received, acks_received,
  ecn_echoes, and the window's events as cc_<EVENT>; a burst's receiver also block_mismatches), written by the
  collective job (testbed.workloads.collective) and each UET burst (testbed.workloads.handles);
* ``trim.csv`` (``node, port, counter, value``): each switch port's trimming program counters at the end
  (testbed.kernel.trim.STATS: packets, uet_data_packets, trimmed_packets, trimmed_bytes_cut, too_short_to_trim;
  and vq_peak_bytes, its virtual queue's peak) and the port's threshold_bytes and buffer_bytes (its virtual
  queue's cap; absent from files written before they were added), written by testbed.workloads.trimming.

:func:`uet_metrics` and :func:`trim_metrics` are the one definition of the summary's ``uet_*`` keys;
:func:`per_host` and :func:`per_port` are the same counters per host and per switch port (the report's UET panel,
:mod:`analysis.uetplot`); :func:`sentences` tells the run's story in UET terms from the ``uet_*`` keys.
"""

from __future__ import annotations

import pandas as pd

from .names import natural_key

#: the transport counters summed over the hosts into the summary (uet_<name>); a counter no host incremented is 0
TOTALS = ("data_packets", "retransmitted_packets", "retransmitted_bytes", "nack_retransmits", "fast_retransmits",
          "rto_retransmits", "rto_events", "nacks_received", "trimmed_received", "acks_received", "ecn_echoes",
          "block_mismatches")
#: the per-host breakdowns (uet_<name>_by_host: "host=value; ..." for the hosts where it is not 0)
BY_HOST = ("rto_events", "nacks_received", "retransmitted_packets")
#: the trimming program's counters summed over the switch ports (uet_<name>)
TRIM_TOTALS = ("trimmed_packets", "trimmed_bytes_cut", "too_short_to_trim")
#: how a sender found a packet lost, as uet.csv counts it (counter, plain name): its retransmission timer expired
#: (traffic.uet_tx: rto_retransmits), RACK's time rule on a SACK (fast_retransmits), a NACK of a trimmed packet
CAUSES = (("rto_retransmits", "timer"), ("fast_retransmits", "SACK rule"), ("nack_retransmits", "NACK"))


def _sum(df: pd.DataFrame, key: str, name: str) -> int:
    return int(df.loc[df[key] == name, "value"].sum())


def per_host(counters: pd.DataFrame) -> pd.DataFrame:
    """uet.csv's counters per host, summed over its rows (every burst and job, every rank of the host): one row per
    host (index ``host``, natural order), one column per counter of :data:`TOTALS` (0 where absent) and any other
    counter the rows have."""
    if counters.empty:
        return pd.DataFrame(columns=list(TOTALS), dtype="int64")
    t = counters.assign(host=counters["host"].astype(str)).pivot_table(index="host", columns="counter", values="value",
                                                                       aggfunc="sum", fill_value=0)
    t = t.reindex(columns=list(dict.fromkeys([*TOTALS, *t.columns])), fill_value=0).astype("int64")
    t.columns.name = None
    return t.loc[sorted(t.index, key=natural_key)]


def per_port(trim: pd.DataFrame) -> pd.DataFrame:
    """trim.csv per switch port: ``port`` ("node:port"), ``trimmed_packets``, ``vq_peak_bytes`` (the virtual
    queue's peak), ``threshold_bytes`` and ``buffer_bytes`` (0 where the file has none), most trimmed first (then
    highest peak, then by name)."""
    cols = ["port", "trimmed_packets", "vq_peak_bytes", "threshold_bytes", "buffer_bytes"]
    if trim.empty:
        return pd.DataFrame(columns=cols)
    t = trim.assign(port=trim["node"].astype(str) + ":" + trim["port"].astype(str))
    t = t.pivot_table(index="port", columns="counter", values="value", aggfunc="sum", fill_value=0)
    t = t.reindex(columns=cols[1:], fill_value=0).astype("int64").reset_index()
    t.columns.name = None
    return t.sort_values(["trimmed_packets", "vq_peak_bytes", "port"], ascending=[False, False, True],
                         kind="stable").reset_index(drop=True)


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
    by = per_host(counters)
    hosts = sorted(by.index)
    for name in BY_HOST:
        out[f"uet_{name}_by_host"] = "; ".join(f"{h}={int(by.at[h, name])}" for h in hosts if by.at[h, name])
    # every trimmed header that reached its receiver should be answered by a NACK and resent by its sender once
    out["uet_trimmed_unanswered"] = out["uet_trimmed_received"] - out["uet_nack_retransmits"]
    data = out["uet_data_packets"]
    out["uet_retransmit_fraction"] = out["uet_retransmitted_packets"] / data if data else None
    out["uet_hosts"] = len(hosts)
    return out


def trim_metrics(counters: pd.DataFrame) -> dict:
    """The switches' uet_* keys from trim.csv's rows: :data:`TRIM_TOTALS` summed over the ports
    (uet_trimmed_packets, ...), the ports that trimmed with their counts (uet_trimmed_by_port: "node:port=n; ..."),
    the largest virtual-queue peak (uet_trim_vq_peak_bytes_max), how many ports carried the program
    (uet_trim_ports) and, when the rows have the ports' thresholds, the smallest and largest threshold the ports
    trimmed at (uet_trim_threshold_bytes_min/_max) and how many ports' virtual queues reached their threshold
    (uet_trim_ports_at_threshold); these three are absent without thresholds (a file written before them, or a run
    with no switch port). Empty without rows."""
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
    thr = counters.loc[counters["counter"] == "threshold_bytes", "value"]
    if len(thr):
        out["uet_trim_threshold_bytes_min"], out["uet_trim_threshold_bytes_max"] = int(thr.min()), int(thr.max())
        t = per_port(counters)
        out["uet_trim_ports_at_threshold"] = int((t["vq_peak_bytes"] >= t["threshold_bytes"]).sum())
    return out


def _n(v: float) -> str:
    return f"{int(v):,}"


def _plural(n: int, one: str, many: str) -> str:
    return f"{_n(n)} {one if n == 1 else many}"


def _resend_sentence(m: dict) -> str:
    """What the senders sent again, and how they found each loss (:data:`CAUSES`)."""
    data, resent = m.get("uet_data_packets", 0), m.get("uet_retransmitted_packets", 0)
    text = f"The UET senders sent {_plural(data, 'data packet', 'data packets')}"
    if not resent and not any(m.get(f"uet_{c}", 0) for c, _ in CAUSES):
        return text + " and resent none."
    frac = m.get("uet_retransmit_fraction")
    share = f" ({frac:.1%} of the data packets)" if frac is not None else ""
    n = [m.get(f"uet_{c}", 0) for c, _ in CAUSES]
    found = [f"{_plural(n[0], 'loss', 'losses')} by the {CAUSES[0][1]}",
             *(f"{_n(v)} by {'a' if what == 'NACK' else 'the'} {what}" for v, (_c, what) in zip(n[1:], CAUSES[1:]))]
    return (text + f" and {_plural(resent, 'retransmission', 'retransmissions')}{share}; they found "
            f"{', '.join(found[:-1])} and {found[-1]}.")


def _nothing_trimmed(m: dict) -> str:
    """Trimming on, nothing trimmed: no port's queue reached its threshold only when no packet was found too short
    to trim (the program counts those only at or above the threshold) and, where trim.csv has the thresholds, no
    port's virtual queue peaked at its threshold."""
    ports, short = _plural(m.get("uet_trim_ports", 0), "switch port", "switch ports"), m.get("uet_too_short_to_trim", 0)
    if not short and not m.get("uet_trim_ports_at_threshold", 0):
        return f"trimming was on at {ports} but no port's queue reached its threshold (nothing trimmed)"
    why = f" ({_plural(short, 'packet', 'packets')} too short to trim)" if short else ""
    return f"trimming was on at {ports} but nothing was trimmed{why}"


def _answered(trimmed: int, got: int, nack: int, unanswered: int) -> str:
    """The receivers' trimmed headers and the senders' NACK resends, after "N packets were trimmed ..."."""
    if trimmed == got == nack:
        return " and it was answered by a NACK resend" if trimmed == 1 else \
            f" and all {_n(trimmed)} were answered by NACK resends"
    text = (f"; the receivers got {_plural(got, 'trimmed header', 'trimmed headers')} and the senders resent "
            f"{_n(nack)} on a NACK")
    if unanswered > 0:
        return text + f" ({_plural(unanswered, 'trimmed header', 'trimmed headers')} unanswered)"
    lost = trimmed - got
    return text + (f" ({_plural(lost, 'trimmed header', 'trimmed headers')} did not reach "
                   f"{'its receiver' if lost == 1 else 'their receivers'})" if lost > 0 else "")


def _trim_clause(m: dict, top: tuple[str, int] | None) -> str:
    """Trimmed at the switch ports, the headers received, the NACK resends ("" without trimming)."""
    trimmed, got = m.get("uet_trimmed_packets"), m.get("uet_trimmed_received", 0)
    nack, unanswered = m.get("uet_nack_retransmits", 0), m.get("uet_trimmed_unanswered", 0)
    if trimmed is None:  # no trim.csv: no switch trimmed in this run, or it was not recorded
        if not got:
            return ""
        text = (f"the receivers got {_plural(got, 'trimmed header', 'trimmed headers')} and their senders resent "
                f"{_n(nack)} on a NACK")
        return text + (f" ({_plural(unanswered, 'trimmed header', 'trimmed headers')} unanswered)" if unanswered > 0
                       else "")
    if not trimmed:
        return _nothing_trimmed(m)
    where = f" (most at {top[0]}: {_n(top[1])})" if top and top[1] < trimmed else f" (all at {top[0]})" if top else ""
    verb = "packet was" if trimmed == 1 else "packets were"
    return f"{_n(trimmed)} {verb} trimmed at switch ports{where}" + _answered(trimmed, got, nack, unanswered)


def network_note(net: str, m: dict) -> str:
    """The network sentence (analysis.story) on a run whose switch ports trimmed (``m``: the uet_* keys): a trimmed
    packet is a loss the network caused, told in the UET sentences that follow."""
    if not m.get("uet_trimmed_packets") or not net:
        return net
    nothing = "The network dropped, ECN-marked and paused nothing."
    if net.startswith(nothing):
        return nothing[:-1] + "; its switch ports trimmed packets instead (below)." + net[len(nothing):]
    return net + " The switch ports also trimmed packets (below)."


def network_troubled(m: dict) -> bool:
    """Whether UET saw the network lose packets (``m``: the uet_* keys): a switch port trimmed, or a sender resent."""
    return bool(m.get("uet_trimmed_packets") or m.get("uet_retransmitted_packets"))


def sentences(m: dict, ports: pd.DataFrame | None = None) -> list[str]:
    """The run's story in UET terms, from the summary's uet_* keys (``m``: :func:`uet_metrics` and
    :func:`trim_metrics` of the run's files): what the senders resent and how they found each loss; what the
    switch ports trimmed and whether every trimmed header was answered by a NACK resend; whether a retransmission
    timer expired (a loss found by timeout, which waits at least the timer's floor). ``ports``: :func:`per_port`, to
    name the port that trimmed most. Empty without uet.csv rows."""
    if not m.get("uet_hosts"):
        return []
    top = (str(ports["port"].iloc[0]), int(ports["trimmed_packets"].iloc[0])) if ports is not None and len(ports) \
        else None
    rto, by_timer = m.get("uet_rto_events", 0), m.get("uet_rto_retransmits", 0)
    timer = ("no retransmission timer expired" if not rto else
             f"{_plural(rto, 'retransmission timer expiry', 'retransmission timer expiries')}: "
             f"{_n(by_timer)} {'loss was' if by_timer == 1 else 'losses were'} found by timeout")
    trim = _trim_clause(m, top)
    second = (f"{trim}; {timer}." if trim else f"{timer}.")
    out = [_resend_sentence(m), second[0].upper() + second[1:]]
    if m.get("uet_block_mismatches"):
        out[-1] += f" {_plural(m['uet_block_mismatches'], 'block', 'blocks')} arrived different from what was sent."
    return out


__all__ = ["BY_HOST", "CAUSES", "TOTALS", "TRIM_TOTALS", "network_note", "network_troubled", "per_host", "per_port",
           "sentences", "trim_metrics", "uet_metrics"]
