"""Switch-queue metrics from queues.csv (the qdisc counters sampled per port): counter deltas over a window,
incast loss rate, ECN mark fraction, queue occupancy statistics."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .samples import nearest_rank


_COUNTERS = ["drops", "marks", "sent_bytes", "sent_packets", "overlimits"]


def _monotone_delta(values: np.ndarray) -> float:
    """Increase of a cumulative counter across samples; a decrease (counter reset) contributes the new
    value (the counter restarted from zero)."""
    if values.size < 2:
        return 0.0
    d = np.diff(values.astype(float))
    d = np.where(d < 0, values[1:], d)
    return float(d.sum())


def counter_deltas(queues: pd.DataFrame, t_start: float | None = None, t_end: float | None = None
                   ) -> pd.DataFrame:
    """Increase of each cumulative counter (drops, marks, sent_bytes, sent_packets, overlimits) per
    (node, port, class) over the samples with ``t_start <= t_s <= t_end`` (bounds optional)."""
    cols = ["node", "port", "class", *_COUNTERS]
    if queues.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("node", "port", "class") else float)
                             for c in cols})
    q = queues
    if t_start is not None:
        q = q[q["t_s"] >= t_start]
    if t_end is not None:
        q = q[q["t_s"] <= t_end]
    rows = []
    for (node, port, cls), d in q.sort_values("t_s", kind="stable").groupby(["node", "port", "class"], sort=True):
        rows.append({"node": node, "port": port, "class": cls,
                     **{c: _monotone_delta(d[c].to_numpy()) for c in _COUNTERS}})
    return pd.DataFrame(rows, columns=cols)


def port_counter_deltas(queues: pd.DataFrame, t_start: float | None = None, t_end: float | None = None,
                        cls: str | None = None) -> pd.DataFrame:
    """:func:`counter_deltas` summed over classes per (node, port) (or one class with ``cls``)."""
    d = counter_deltas(queues, t_start, t_end)
    if cls is not None:
        d = d[d["class"] == str(cls)]
    if d.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("node", "port") else float)
                             for c in ["node", "port", *_COUNTERS]})
    return d.groupby(["node", "port"], sort=True)[_COUNTERS].sum().reset_index()


@dataclass(frozen=True)
class LossRate:
    """Packet loss at one port: ``rate = drops / (drops + sent_packets)`` (nan if nothing offered)."""

    node: str | None
    port: str | None
    drops: float
    sent_packets: float
    rate: float


def incast_loss_rate(queues: pd.DataFrame, node: str | None = None, port: str | None = None,
                     cls: str | None = None) -> LossRate:
    """Loss at the incast bottleneck: drops / packets offered, offered = drops + sent packets.

    With ``node``/``port`` None the bottleneck is the port with the most drops (ties: most sent packets).
    """
    d = port_counter_deltas(queues, cls=cls)
    if node is not None:
        d = d[d["node"] == node]
    if port is not None:
        d = d[d["port"] == port]
    if d.empty:
        return LossRate(node, port, 0.0, 0.0, math.nan)
    row = d.sort_values(["drops", "sent_packets"], ascending=False, kind="stable").iloc[0]
    offered = row["drops"] + row["sent_packets"]
    return LossRate(str(row["node"]), str(row["port"]), float(row["drops"]), float(row["sent_packets"]),
                    float(row["drops"] / offered) if offered > 0 else math.nan)


def ecn_mark_fraction(queues: pd.DataFrame, node: str | None = None, port: str | None = None,
                      cls: str | None = None) -> float:
    """ECN-marked packets / sent packets, summed over the selected ports (all ports by default)."""
    d = port_counter_deltas(queues, cls=cls)
    if node is not None:
        d = d[d["node"] == node]
    if port is not None:
        d = d[d["port"] == port]
    sent = float(d["sent_packets"].sum()) if len(d) else 0.0
    return float(d["marks"].sum()) / sent if sent > 0 else math.nan


def queue_stats(queues: pd.DataFrame) -> pd.DataFrame:
    """Backlog statistics per (node, port), sample based: backlog_bytes summed over classes at each sample
    time, then mean / median / p90 (nearest rank) / max and the number of samples ``n``. The sampler is
    periodic, so this equals the time-weighted value up to jitter; bursts shorter than the sampling interval
    can be missed, so ``max_bytes`` is a lower bound on the true peak."""
    cols = ["node", "port", "mean_bytes", "median_bytes", "p90_bytes", "max_bytes", "n"]
    if queues.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("node", "port") else
                                          ("int64" if c == "n" else float)) for c in cols})
    per_t = queues.groupby(["node", "port", "t_s"], sort=True)["backlog_bytes"].sum().reset_index()
    rows = []
    for (node, port), d in per_t.groupby(["node", "port"], sort=True):
        x = d["backlog_bytes"].to_numpy(dtype=float)
        rows.append({"node": node, "port": port, "mean_bytes": float(x.mean()), "median_bytes": float(np.median(x)),
                     "p90_bytes": nearest_rank(x, 0.90), "max_bytes": float(x.max()), "n": int(x.size)})
    return pd.DataFrame(rows, columns=cols)
