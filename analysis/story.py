"""What a run's report says first: the run's story in plain sentences, and a few key numbers with plain names.

Every sentence is computed from the run's files (rounds.csv, ops.csv, queues.csv, pfc.csv, events.csv, tcp.csv and
the manifest's parameters), so a reader sees what happened and why before any table:

* an incast run: how many rounds took about one retransmission timeout (RTOmin, the kernel's ``rto_min``) longer
  than the ideal round, and at which port the drops that caused them happened;
* a collective run: how much of an op was waiting for a late rank (the spread of the ranks' start times, each
  rank's ``wait_s``) and how much was transfer; when the network dropped, marked or paused nothing, the late rank
  is named as the cause instead of a list of what did not happen;
* any run: drops, ECN marks and PFC pauses per port (the switch queues' counters), faults from events.csv;
* a run over UET (uet.csv, trim.csv): how its senders found their losses (timer, SACK rule, NACK), what the switch
  ports trimmed and whether every trimmed header was answered, whether a retransmission timer expired
  (:func:`analysis.uet.sentences`); its timer expiries, not TCP's, decide whether a slow incast round waited one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

from . import metrics as m
from .correlate import op_groups
from .load import Run
from .uet import network_note, network_troubled, per_port, trim_metrics, uet_metrics
from .uet import sentences as uet_sentences

__all__ = ["KEY_NUMBERS", "Story", "collective_sentences", "event_times", "incast_ideal_ms", "incast_sentences",
           "key_numbers", "late_rank", "network_sentence", "rto_min_ms", "rto_rounds", "tell"]

#: a round (and its slowest sender) "waited RTOmin" when it took at least this share of rto_min ...
RTO_SHARE = 0.9
#: ... and this many times the ideal (or median) round ...
SLOW_SHARE = 1.2
#: ... and at most the ideal plus this many RTOmin (backed-off timeouts double; beyond this it is something else)
MAX_RTOS = 4
#: a rank is "late" when it starts the ops this much (share of the median op time) after the first rank
LATE_SHARE = 0.25


@dataclass
class Story:
    """The report's opening: sentences, then (plain name, value with unit) pairs."""

    sentences: list[str] = field(default_factory=list)
    numbers: list[tuple[str, str]] = field(default_factory=list)


def _num(v: float, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:,.{digits}f}" if abs(v - round(v)) > 1e-9 or digits == 0 else f"{int(round(v)):,}"


def _span(lo: float, hi: float) -> str:
    """"216-226 ms", or "33 ms" when both ends read the same."""
    return f"{_num(lo)} ms" if _num(lo) == _num(hi) else f"{_num(lo)}-{_num(hi)} ms"


def _port_series(queues: pd.DataFrame, counter: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per ``node:port``: sample times and the counter summed over classes (cumulative)."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if queues.empty:
        return out
    per_t = queues.groupby(["node", "port", "t_s"], sort=True)[counter].sum().reset_index()
    for (node, port), d in per_t.groupby(["node", "port"], sort=True):
        out[f"{node}:{port}"] = (d["t_s"].to_numpy(float), np.maximum.accumulate(d[counter].to_numpy(float)))
    return out


def _increase(series: tuple[np.ndarray, np.ndarray], start: float, end: float) -> float:
    """Counter increase from the last sample at or before ``start`` to the first at or after ``end``."""
    t, v = series
    i = max(int(np.searchsorted(t, start, side="right")) - 1, 0)
    j = min(int(np.searchsorted(t, end, side="left")), len(t) - 1)
    return float(v[j] - v[i]) if j >= i else 0.0


def event_times(queues: pd.DataFrame, counter: str) -> pd.DataFrame:
    """Where a queue counter (``drops``, ``marks``) rose: ``t_s, port, count`` per sample that saw an increase
    (the samples bracket the event; the sample time is when the sampler saw it)."""
    rows = []
    for port, (t, v) in _port_series(queues, counter).items():
        d = np.diff(v, prepend=v[0] if len(v) else 0.0)
        for ti, di in zip(t[d > 0], d[d > 0]):
            rows.append((float(ti), port, float(di)))
    return pd.DataFrame(rows, columns=["t_s", "port", "count"]).sort_values("t_s", kind="stable")


# --------------------------------------------------------------------------- incast

def rto_rounds(rounds: pd.DataFrame, queues: pd.DataFrame, ideal_ms: float | None, rto_ms: float | None
               ) -> pd.DataFrame:
    """Incast rounds in which a sender waited a retransmission timeout: a round that took at least
    ``max(SLOW_SHARE x base, RTO_SHARE x rto_ms)`` and at most ``base + MAX_RTOS x rto_ms`` (base: the ideal round,
    else the median round), whose slowest sender's own transfer took at least ``RTO_SHARE x rto_ms``. (The timeout
    overlaps the round's other transfers, so such a round takes RTOmin plus a part of the ideal, not ideal +
    RTOmin.) Columns ``round, round_ms, sender, sender_ms, drops_port, drops`` (the port with most drops during the
    round)."""
    cols = ["round", "round_ms", "sender", "sender_ms", "drops_port", "drops"]
    if rounds.empty or not rto_ms:
        return pd.DataFrame(columns=cols)
    rt = m.round_times(rounds)
    ms = rt["round_s"].to_numpy(float) * 1e3
    base = ideal_ms if ideal_ms else m.nearest_rank(ms, 0.5)
    lo, hi = max(SLOW_SHARE * base, RTO_SHARE * rto_ms), base + MAX_RTOS * rto_ms
    drops = _port_series(queues, "drops")
    rows = []
    for r, round_ms, s, e in zip(rt["round"], ms, rt["start_s"], rt["end_s"]):
        if not lo <= round_ms <= hi:
            continue
        snd = rounds[rounds["round"] == r]
        dur = (snd["end_s"] - snd["start_s"]) * 1e3
        slow = snd.loc[dur.idxmax()]
        if dur.max() < RTO_SHARE * rto_ms:
            continue
        by_port = {p: _increase(sr, s, e) for p, sr in drops.items()}
        port = max(by_port, key=by_port.get) if by_port and max(by_port.values()) > 0 else ""
        rows.append((int(r), float(round_ms), str(slow["sender"]), float(dur.max()), port, by_port.get(port, 0.0)))
    return pd.DataFrame(rows, columns=cols)


def incast_sentences(rounds: pd.DataFrame, queues: pd.DataFrame, ideal_ms: float | None, rto_ms: float | None
                     ) -> list[str]:
    """"6 of 40 rounds took 216-226 ms against an ideal 32 ms; each had a sender that waited RTOmin (200 ms) after
    drops at leaf1:h1", or how long the rounds took when none waited for a timeout."""
    rt = m.round_times(rounds)
    ms = rt["round_s"].to_numpy(float) * 1e3
    against = f" against an ideal {_num(ideal_ms)} ms" if ideal_ms else ""
    hit = rto_rounds(rounds, queues, ideal_ms, rto_ms)
    if hit.empty:
        med = m.nearest_rank(ms, 0.5)
        text = f"All {len(ms)} incast rounds took {_span(ms.min(), ms.max())} (median {_num(med)} ms){against}"
        return [text + (f"; none took about one RTOmin ({_num(rto_ms, 0)} ms) longer." if rto_ms else ".")]
    text = f"{len(hit)} of {len(ms)} incast rounds took {_span(hit['round_ms'].min(), hit['round_ms'].max())}{against}"
    ports = hit.loc[hit["drops"] > 0, "drops_port"]
    if len(ports):
        port = ports.value_counts().index[0]
        n_at = int((hit["drops_port"] == port).sum())
        who = "each" if n_at == len(hit) else f"{n_at} of them"
        text += (f"; {who} had a sender that waited RTOmin ({_num(rto_ms, 0)} ms) after drops at {port} "
                 f"({_num(hit.loc[hit['drops_port'] == port, 'drops'].sum(), 0)} drops during those rounds)")
    else:
        text += (f"; each had a sender that took about RTOmin ({_num(rto_ms, 0)} ms) longer, with no drops sampled "
                 "at the switch ports (a loss elsewhere: a host NIC queue, or between samples)")
    rest = np.delete(ms, np.isin(rt["round"].to_numpy(), hit["round"].to_numpy()))
    if len(rest):
        text += f". The other {len(rest)} took {_span(rest.min(), rest.max())}"
    return [text + "."]


# --------------------------------------------------------------------------- collectives

def late_rank(ops: pd.DataFrame, groups: Mapping[str, list[list[int]]] | None = None) -> dict | None:
    """The rank that starts the ops last, when it is late by at least ``LATE_SHARE`` of the median op time:
    ``rank, host, late_ms`` (median over ops of its start minus the first rank's), ``ops`` (ops it was last in),
    ``n_ops``, ``others_wait_share`` (the other ranks' summed wait_s over their summed op time), ``op_ms``.
    ``groups`` (the manifest's ``op_groups``): a grouped op counts once per group, and a rank's lag is behind the
    first rank of its own group (the groups do not wait for each other)."""
    if ops.empty or ops["rank"].nunique() < 2:
        return None
    key = [ops["iteration"], ops["op_index"], pd.Series(m.group_ids(ops, groups), index=ops.index)]
    first = ops["start_s"].groupby(key).transform("min")
    lag = (ops["start_s"] - first) * 1e3
    last_idx = lag.groupby(key).idxmax()
    last = ops.loc[last_idx.to_numpy()]
    # the rank with the largest median lag (in a grouped op every group has a last rank; the late one lags most)
    rank = int(lag.groupby(ops["rank"]).median().idxmax())
    mine = lag[ops["rank"] == rank]
    op_ms = m.nearest_rank(m.op_table(ops)["cct_s"].to_numpy(float) * 1e3, 0.5)
    late_ms = m.nearest_rank(mine.to_numpy(float), 0.5)
    if op_ms <= 0 or late_ms < LATE_SHARE * op_ms:
        return None
    others = ops[ops["rank"] != rank]
    busy = float((others["end_s"] - others["start_s"]).sum())
    host = str(ops.loc[ops["rank"] == rank, "host"].iloc[0]) if "host" in ops.columns else ""
    return {"rank": rank, "host": host, "late_ms": late_ms, "ops": int((last["rank"] == rank).sum()),
            "n_ops": len(last), "op_ms": op_ms,
            "others_wait_share": float(others["wait_s"].clip(lower=0).sum()) / busy if busy > 0 else math.nan}


def collective_sentences(ops: pd.DataFrame, network_clean: bool,
                         groups: Mapping[str, list[list[int]]] | None = None) -> list[str]:
    """The op time split into waiting for a late rank and transfer, the late rank named; or the ops' spread."""
    t = m.op_table(ops)
    ms = t["cct_s"].to_numpy(float) * 1e3
    med = m.nearest_rank(ms, 0.5)
    late = late_rank(ops, groups)
    if late is None:
        return [f"{len(ms)} collective ops took {_span(ms.min(), ms.max())} (median {_num(med)} ms); the "
                "ranks started each op close together (no late rank)."]
    host = f" ({late['host']})" if late["host"] else ""
    share = late["others_wait_share"]
    text = (f"Rank {late['rank']}{host} was late: it started {late['ops']} of {late['n_ops']} ops a median "
            f"{_num(late['late_ms'])} ms after the first rank. An op took a median {_num(med)} ms, of which about "
            f"{_num(min(late['late_ms'], med))} ms was waiting for the late rank and "
            f"{_num(max(med - late['late_ms'], 0))} ms transfer")
    if not math.isnan(share):
        text += f"; the other ranks spent {share:.0%} of their op time waiting"
    text += "."
    if network_clean:
        text += " The cause is the late rank (a straggler), not the network."
    return [text]


# --------------------------------------------------------------------------- the network

def network_sentence(run: Run, qdeltas: pd.DataFrame | None) -> tuple[str, bool]:
    """Drops, ECN marks and PFC pauses (the ports with most), TCP timeouts, faults; and whether the network did
    nothing wrong (no drops, marks, pauses or faults)."""
    parts = []
    if qdeltas is not None and len(qdeltas):
        for counter, what in (("drops", "dropped"), ("marks", "ECN-marked")):
            d = qdeltas[qdeltas[counter] > 0].sort_values(counter, ascending=False, kind="stable")
            if len(d):
                top = [f"{_num(v, 0)} at {n}:{p}" for n, p, v in zip(d["node"], d["port"], d[counter])][:3]
                more = f" and {len(d) - 3} more ports" if len(d) > 3 else ""
                parts.append(f"{what} {_num(d[counter].sum(), 0)} packets ({', '.join(top)}{more})")
    xoff = run.pfc[run.pfc["event"] == "xoff"] if len(run.pfc) else run.pfc
    if len(xoff):
        ports = (xoff["node"] + ":" + xoff["port"]).value_counts()
        parts.append(f"paused their feeders {len(xoff)} times (PFC; most at {ports.index[0]}: {int(ports.iloc[0])})")
    text = ("The switch queues " + "; ".join(parts) + "." if parts else
            "The network dropped, ECN-marked and paused nothing." if qdeltas is not None and len(qdeltas) else "")
    td = m.tcp_deltas(run.tcp) if len(run.tcp) else None
    timeouts = float(td.loc[td["counter"] == "TcpExtTCPTimeouts", "delta"].sum()) if td is not None and len(td) else 0
    if timeouts:
        text += (f" TCP senders timed out {_num(timeouts, 0)} time{'s' if timeouts != 1 else ''} (a timeout waits "
                 "at least RTOmin).")
    if len(run.events):
        text += f" events.csv records {len(run.events)} fault events (table below)."
    return text.strip(), not parts and not len(run.events)


# --------------------------------------------------------------------------- the opening

def _param(run: Run, *names: str) -> float | None:
    params = run.manifest.get("params") if isinstance(run.manifest.get("params"), dict) else {}
    for n in names:
        for src in (params, run.summary or {}):
            v = src.get(n)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return float(v)
    return None


def incast_ideal_ms(run: Run) -> float | None:
    """The ideal round: summary.json's ``round_ms_ideal``, else senders x block at the host rate."""
    ideal = _param(run, "round_ms_ideal")
    if ideal:
        return ideal
    n, block, rate = _param(run, "senders"), _param(run, "block_bytes"), _param(run, "host_rate_mbps")
    return n * block * 8 / (rate * 1e6) * 1e3 if n and block and rate else None


def rto_min_ms(run: Run) -> float | None:
    """The hosts' RTOmin: the ``rto_min_ms`` parameter (0 or absent in a run that sets it: the kernel's 200 ms)."""
    params = run.manifest.get("params") if isinstance(run.manifest.get("params"), dict) else {}
    if "rto_min_ms" not in params:
        return None
    return float(params["rto_min_ms"]) if params["rto_min_ms"] else 200.0


def tell(run: Run, vals: dict, qdeltas: pd.DataFrame | None) -> Story:
    """The run's story (sentences) and its key numbers."""
    net, clean = network_sentence(run, qdeltas)
    uet = {**uet_metrics(run.uet), **trim_metrics(run.trim)} if len(run.uet) else {}
    net, clean = network_note(net, uet), clean and not network_troubled(uet)  # trims and resends are losses
    said: list[str] = []
    if len(run.rounds):
        td = m.tcp_deltas(run.tcp) if len(run.tcp) else None
        no_timeouts = td is not None and (td["counter"] == "TcpExtTCPTimeouts").any() and \
            not td.loc[td["counter"] == "TcpExtTCPTimeouts", "delta"].sum()
        if uet:  # over UET the timeouts are its own timer's expiries (the incast sets its floor to rto_min_ms)
            no_timeouts = not uet["uet_rto_events"]
        # slow rounds without a single TCP timeout were not RTOmin rounds: tell their times only
        said += incast_sentences(run.rounds, run.queues, incast_ideal_ms(run), None if no_timeouts else rto_min_ms(run))
    if len(run.ops):
        said += collective_sentences(run.ops, clean, op_groups(run.manifest))
    if net:
        said.append(net)
    said += uet_sentences(uet, per_port(run.trim))
    if not said:
        said.append(_flows_sentence(run, vals))
    return Story(said, key_numbers(run, vals))


def _flows_sentence(run: Run, vals: dict) -> str:
    """A run without rounds, ops or queue samples (a smoke run): its goodput and TCP's retransmissions."""
    s = run.summary or {}
    good = s.get("goodput_mbps")
    retrans = vals.get("tcp_retrans_segs", (None,))[0]
    parts = []
    if isinstance(good, (int, float)) and not isinstance(good, bool):
        parts.append(f"The flows moved {_num(float(good), 2)} Mbit/s")
    if retrans is not None:
        parts.append(f"TCP sent {_num(float(retrans), 0)} segments again")
    if not parts:
        return "The run recorded no rounds, ops or queue samples to tell a story from; its numbers follow."
    return "; ".join(parts) + " (no rounds, ops or queue samples recorded)."


#: (metric, plain name, unit, digits) of the key numbers, in order; the first six the run has are shown
KEY_NUMBERS = [
    ("round_ms_p50", "incast round time, median", "ms", 1), ("round_ms_p99", "incast round time, p99", "ms", 1),
    ("round_ms_ideal", "ideal round time", "ms", 1), ("round_goodput_mbps", "goodput over the rounds", "Mbit/s", 2),
    ("cct_ms_p50", "collective op time, median", "ms", 1), ("cct_ms_p99", "collective op time, p99", "ms", 1),
    ("step_ms_p50", "training step, median", "ms", 1),
    ("comm_wait_fraction", "share of the step waiting for peers", "%", 0),
    ("busbw_gbps", "bus bandwidth", "Gbit/s", 3), ("goodput_mbps", "goodput", "Mbit/s", 2),
    ("drops", "packets dropped by switch queues", "", 0), ("marks", "packets ECN-marked", "", 0),
    ("pauses", "PFC pauses", "", 0), ("tcp_timeouts", "TCP retransmission timeouts", "", 0),
    ("tcp_retrans_segs", "TCP segments sent again", "", 0),
]


def key_numbers(run: Run, vals: dict, most: int = 6) -> list[tuple[str, str]]:
    """Up to ``most`` numbers with plain names and units (a tail with its sample count)."""
    s = run.summary or {}
    out: list[tuple[str, str]] = []
    counts = {"round_ms": "rounds_n", "cct_ms": "cct_samples", "step_ms": "step_n"}
    for key, name, unit, digits in KEY_NUMBERS:
        v = vals[key][0] if key in vals else s.get(key)
        if key == "round_ms_ideal" and v is None and len(run.rounds):
            v = incast_ideal_ms(run)  # from the parameters when summary.json has none
        if not isinstance(v, (int, float)) or isinstance(v, bool) or math.isnan(float(v)):
            continue
        if key == "goodput_mbps" and "round_goodput_mbps" in vals:
            continue  # the same number twice
        if key in ("marks", "pauses", "tcp_timeouts") and not v:
            continue  # a feature the run did not use, or nothing to say
        if unit == "%":
            v, unit = float(v) * 100, "%"
        prefix, _, tail = key.rpartition("_")
        n_key = counts.get(prefix) if tail in ("p50", "p99") else None
        n = vals.get(n_key, (None,))[0] if n_key else None
        label = f"{name}" + (f" (n={_num(float(n), 0)})" if n else "")
        out.append((label, f"{_num(float(v), digits)} {unit}".strip()))
        if len(out) == most:
            break
    return out


# --------------------------------------------------------------------------- thresholds for the queue plot

def _params(run: Run) -> dict:
    p = run.manifest.get("params")
    return p if isinstance(p, dict) else {}


def pfc_on(params: dict) -> bool:
    """PFC pauses in this run: the collective's ``pfc=on`` or pfc-hol's lossless modes."""
    return params.get("pfc") == "on" or str(params.get("mode", "")).startswith("lossless")


def queue_thresholds(run: Run) -> list[tuple[str, float]]:
    """The levels at which the run's switch queues act, from its parameters: the buffer (drop-tail drops above
    it), ECN K (step marking) or RED's min (K) and max (min(3K, buffer)), PFC XOFF and XON."""
    p = _params(run)
    out: list[tuple[str, float]] = []
    buf = p.get("buffer_bytes")
    if isinstance(buf, (int, float)) and buf > 0:
        out.append(("buffer", float(buf)))
    k = p.get("k_bytes")
    disc = p.get("discipline")
    if p.get("mode") == "lossless_ecn" and disc == "droptail":
        disc = "step"  # pfc-hol's lossless_ecn turns droptail into step marking
    if isinstance(k, (int, float)) and k > 0:
        if disc == "step":
            out.append(("ECN K", float(k)))
        elif disc == "red":
            out += [("RED min (K)", float(k)), ("RED max", float(min(3 * k, buf or 3 * k)))]
    if pfc_on(p):
        for name, keys in (("PFC XOFF", ("pfc_xoff_bytes", "xoff_bytes")), ("PFC XON", ("pfc_xon_bytes", "xon_bytes"))):
            v = next((p[x] for x in keys if isinstance(p.get(x), (int, float))), None)
            if v is not None:
                out.append((name, float(v)))
    return out[:4]
