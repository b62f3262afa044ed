"""PFC metrics from pfc.csv (pause frames sent per port and priority): pause intervals, the fraction of a run
a port spent paused, and a port's rate while its peer was paused and not."""

from __future__ import annotations

import math

import pandas as pd

from .samples import _union_length


_PAUSE_COLS = ["node", "port", "prio", "start_s", "end_s", "open"]


def pause_intervals(pfc: pd.DataFrame, run_end: float) -> pd.DataFrame:
    """Pause intervals per (node, port, prio) from the xoff/xon event stream.

    An ``xoff`` opens a pause (a repeated xoff while paused is ignored); ``xon`` or ``watchdog`` (the PFC
    watchdog breaking a pause storm) closes it; an xon while not paused is ignored. A pause still open at
    the end is closed at ``run_end`` with ``open=True``. Columns: node, port, prio, start_s, end_s, open.
    """
    rows = []
    if not pfc.empty:
        ev = pfc.sort_values("t_s", kind="stable")
        for (node, port, prio), d in ev.groupby(["node", "port", "prio"], sort=True):
            start = None
            for t, e in zip(d["t_s"].to_numpy(dtype=float), d["event"].astype(str).str.lower()):
                if e == "xoff":
                    if start is None:
                        start = t
                elif e in ("xon", "watchdog"):
                    if start is not None:
                        rows.append((node, port, int(prio), start, t, False))
                        start = None
            if start is not None:
                rows.append((node, port, int(prio), start, max(float(run_end), start), True))
    df = pd.DataFrame(rows, columns=_PAUSE_COLS)
    return df.astype({"prio": "int64", "start_s": float, "end_s": float, "open": bool}) if len(df) else \
        pd.DataFrame({"node": pd.Series([], dtype=object), "port": pd.Series([], dtype=object),
                      "prio": pd.Series([], dtype="int64"), "start_s": pd.Series([], dtype=float),
                      "end_s": pd.Series([], dtype=float), "open": pd.Series([], dtype=bool)})


def pause_fraction(pfc: pd.DataFrame, run_start: float, run_end: float, by_prio: bool = False) -> pd.DataFrame:
    """Fraction of ``[run_start, run_end]`` each link (node, port) spent paused.

    Uses :func:`pause_intervals`; overlapping pauses of different priorities on one port count once unless
    ``by_prio``. Columns: node, port, [prio,] paused_s, pauses (number of pause intervals), open_at_end,
    watchdogs, fraction. Only links with at least one pfc event appear.
    """
    keys = ["node", "port", "prio"] if by_prio else ["node", "port"]
    cols = [*keys, "paused_s", "pauses", "open_at_end", "watchdogs", "fraction"]
    iv = pause_intervals(pfc, run_end)
    if pfc.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("node", "port") else
                                          ("int64" if c in ("prio", "pauses", "watchdogs") else
                                           (bool if c == "open_at_end" else float))) for c in cols})
    span = run_end - run_start
    rows = []
    for key, d in pfc.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        sel = iv
        for k, v in zip(keys, key):
            sel = sel[sel[k] == v]
        paused = _union_length(list(zip(sel["start_s"], sel["end_s"])), run_start, run_end)
        rows.append({**dict(zip(keys, key)), "paused_s": paused, "pauses": int(len(sel)),
                     "open_at_end": bool(sel["open"].any()),
                     "watchdogs": int((d["event"].astype(str).str.lower() == "watchdog").sum()),
                     "fraction": paused / span if span > 0 else math.nan})
    return pd.DataFrame(rows, columns=cols)


def rate_by_pause_state(queues: pd.DataFrame, pfc: pd.DataFrame, node: str, port: str, paused_node: str,
                        paused_port: str, run_end: float, *, cls: str | None = None,
                        pure: float = 0.1) -> dict:
    """What a port sent while another port was paused and while it was not: head-of-line blocking from counters.

    ``queues`` samples of ``node:port`` (optionally one class) give sent bytes per sample interval; the pause
    intervals of ``paused_node:paused_port`` (any priority, from ``pfc``) say how much of each interval it was
    paused. An interval paused for at least ``1 - pure`` of its length counts as *paused*, one paused for at most
    ``pure`` as *running*; mixed intervals are left out. Returns ``paused_s``, ``running_s`` (time in each state),
    ``paused_mbps``, ``running_mbps`` (sent bytes / time; NaN without such intervals), ``paused_intervals``,
    ``running_intervals``. For the victim of pfc-hol: its receiver's downlink (leaf1:h2) against the paused link it
    shares with the incast (spine1:leaf1).
    """
    q = queues[(queues["node"] == node) & (queues["port"] == port)]
    if cls is not None:
        q = q[q["class"].astype(str) == str(cls)]
    q = q.groupby("t_s", sort=True)["sent_bytes"].sum()
    t = q.index.to_numpy(dtype=float)
    sent = q.to_numpy(dtype=float)
    iv = pause_intervals(pfc, run_end)
    iv = iv[(iv["node"] == paused_node) & (iv["port"] == paused_port)]
    spans = list(zip(iv["start_s"], iv["end_s"]))
    acc = {"paused": [0.0, 0.0, 0], "running": [0.0, 0.0, 0]}  # seconds, bytes, intervals
    for i in range(len(t) - 1):
        a, b = t[i], t[i + 1]
        if b <= a:
            continue
        f = _union_length(spans, a, b) / (b - a)
        state = "paused" if f >= 1 - pure else ("running" if f <= pure else None)
        if state:
            acc[state][0] += b - a
            acc[state][1] += max(sent[i + 1] - sent[i], 0.0)
            acc[state][2] += 1
    out = {}
    for state, (secs, nbytes, n) in acc.items():
        out[f"{state}_s"] = float(secs)
        out[f"{state}_mbps"] = float(nbytes * 8 / secs / 1e6) if secs > 0 else math.nan
        out[f"{state}_intervals"] = n
    return out
