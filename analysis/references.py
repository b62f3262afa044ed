"""What a report's plots draw besides the data: each port's own queue limits, the events to tick on its backlog, and
the alpha-beta bound of the ops.

* :func:`port_limits`: per ``node:port``, the levels at which *that* port's queue acts, in the unit its buffer is
  sized in (a pfifo of ``buffer_packets`` drops by packet count, a bfifo by bytes): the buffer, ECN K (step
  marking) or RED's min and max, and PFC XOFF/XON on the switch queues of a lossless run. Taken from the manifest's
  topology (the port's tier queue from ports.csv, or a per-port override), so a 64 kB bottleneck buffer is drawn on
  the leaf's host-facing port and not on a 256 kB uplink; without a topology description, the run's parameters
  (:func:`analysis.story.queue_thresholds`) for every port, as before.
* :func:`queue_ticks`: drops and ECN marks (where queues.csv's counters rose), PFC pauses (pfc.csv: the queue that
  crossed XOFF and the feeder port it paused) and the senders that waited a retransmission timeout (an incast's
  RTOmin rounds, :func:`analysis.story.rto_rounds`), each with the port it belongs to.
* :func:`op_bounds_ms`: the alpha-beta bound per op name (sweep.csv's ``bound_us``, else summary.json's
  ``bound_ms``), the time no network could beat.

Pure: reads a loaded :class:`analysis.load.Run` (and sweep.csv beside it); no plotting.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from . import metrics as m
from .load import Run
from .story import event_times, incast_ideal_ms, pfc_on, queue_thresholds, rto_min_ms, rto_rounds

__all__ = ["PortLimits", "TICK_COLUMNS", "op_bounds_ms", "port_limits", "queue_ticks"]

#: columns of :func:`queue_ticks`: when, the ``node:port`` it belongs to, what (drops, marks, pause, rto), how many
TICK_COLUMNS = ["t_s", "port", "kind", "count"]


@dataclass
class PortLimits:
    """One port's queue limits: ``lines`` are ``(name, level)`` in ``unit`` (``bytes`` or ``packets``);
    ``avpkt_bytes`` converts packets to bytes (the queue's typical packet); ``source`` says where they come from
    (``topology``: the port's own queue; ``parameters``: the run's, the port's own not known)."""

    unit: str = "bytes"
    lines: list[tuple[str, float]] = field(default_factory=list)
    avpkt_bytes: float = 1500.0
    source: str = "topology"

    @property
    def buffer(self) -> float | None:
        return next((v for k, v in self.lines if k == "buffer"), None)


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def _queue_spec(run: Run) -> tuple[dict, dict]:
    """(tier -> queue spec, (node, port) -> a per-port override's queue spec) from the manifest's topology."""
    topo = run.manifest.get("topology") if isinstance(run.manifest.get("topology"), dict) else {}
    tiers = topo.get("queues") if isinstance(topo.get("queues"), dict) else {}
    own = {}
    for o in topo.get("ports") or []:
        if isinstance(o, dict) and isinstance(o.get("queue"), dict) and ":" in str(o.get("port", "")):
            own[tuple(str(o["port"]).split(":", 1))] = o["queue"]
    return tiers, own


def _lossless_class(run: Run) -> dict:
    """The lossless traffic class of the topology (its xoff/xon), or {}."""
    topo = run.manifest.get("topology") if isinstance(run.manifest.get("topology"), dict) else {}
    return next((c for c in topo.get("classes") or [] if isinstance(c, dict) and c.get("lossless")), {})


def _own_lines(q: dict) -> PortLimits:
    """A queue spec's buffer and marking levels, in the unit its buffer is sized in."""
    avpkt = _num(q.get("avpkt_bytes")) or 1500.0
    unit = "packets" if _num(q.get("buffer_packets")) and not _num(q.get("buffer_bytes")) else "bytes"

    def conv(v_bytes: float | None, v_packets: float | None) -> float | None:
        if unit == "packets":
            return v_packets or (v_bytes / avpkt if v_bytes else None)
        return v_bytes or (v_packets * avpkt if v_packets else None)

    lines = [("buffer", conv(_num(q.get("buffer_bytes")), _num(q.get("buffer_packets"))))]
    disc = q.get("discipline")
    if disc == "step":
        lines.append(("ECN K", conv(_num(q.get("k_bytes")), _num(q.get("k_packets")))))
    elif disc == "red":
        lines += [("RED min", conv(_num(q.get("min_bytes")), None)), ("RED max", conv(_num(q.get("max_bytes")), None))]
    return PortLimits(unit, [(k, v) for k, v in lines if v], avpkt)


def port_limits(run: Run, labels: list[str]) -> dict[str, PortLimits]:
    """Each ``node:port`` of ``labels`` with its own queue's limits (module docstring)."""
    params = run.manifest.get("params") if isinstance(run.manifest.get("params"), dict) else {}
    tiers, own = _queue_spec(run)
    tier_of = {f"{n}:{p}": str(t) for n, p, t in zip(run.ports["node"], run.ports["port"], run.ports["tier"])}
    fallback = [(k, v) for k, v in queue_thresholds(run) if not k.startswith("PFC")]
    cls = _lossless_class(run)
    xoff = _num(cls.get("xoff_bytes")) or _num(params.get("pfc_xoff_bytes")) or _num(params.get("xoff_bytes"))
    xon = _num(cls.get("xon_bytes")) or _num(params.get("pfc_xon_bytes")) or _num(params.get("xon_bytes"))
    crossing = set()
    if len(run.pfc):
        ev = run.pfc[run.pfc["event"].isin(["above_xoff", "below_xon"])]
        crossing = {f"{n}:{p}" for n, p in zip(ev["node"], ev["port"])}
    lossless = pfc_on(params) or bool(cls)
    out = {}
    for label in labels:
        node, _, port = label.partition(":")
        tier = tier_of.get(label)
        q = own.get((node, port)) or (tiers.get(tier) if tier else None)
        switch = tier is not None and tier != "host_nic"
        lim = _own_lines(q) if isinstance(q, dict) else PortLimits("bytes", list(fallback),
                                                                                  source="parameters")
        pfc_here = label in crossing if crossing else (switch or tier is None)
        if lossless and pfc_here:
            for name, v in (("PFC XOFF", xoff), ("PFC XON", xon)):
                if v:
                    lim.lines.append((name, v / lim.avpkt_bytes if lim.unit == "packets" else v))
        out[label] = lim
    return out


def queue_ticks(run: Run) -> pd.DataFrame:
    """Events to tick on the queue plot (:data:`TICK_COLUMNS`): ``drops`` and ``marks`` where a port's counter rose
    (the sample that saw it), ``pause`` where pfc.csv has a queue crossing XOFF (on that queue) or a feeder paused
    (on the paused port), ``rto`` where an incast sender that waited RTOmin finished (its timeout fired shortly
    before; on the port that dropped in its round, "" when none did)."""
    parts = [event_times(run.queues, k).assign(kind=k) for k in ("drops", "marks")] if len(run.queues) else []
    if len(run.pfc):
        p = run.pfc[run.pfc["event"].isin(["above_xoff", "xoff"])]
        parts.append(pd.DataFrame({"t_s": p["t_s"].astype(float), "port": p["node"] + ":" + p["port"],
                                   "kind": "pause", "count": 1.0}))
    parts.append(_rto_ticks(run))
    parts = [x[TICK_COLUMNS] for x in parts if len(x)]
    if not parts:
        return pd.DataFrame({"t_s": pd.Series([], dtype=float), "port": pd.Series([], dtype=object),
                             "kind": pd.Series([], dtype=object), "count": pd.Series([], dtype=float)})
    return pd.concat(parts, ignore_index=True).sort_values("t_s", kind="stable").reset_index(drop=True)


def _rto_ticks(run: Run) -> pd.DataFrame:
    """The end of each RTOmin round's slowest sender (only when TCP did record timeouts, or tcp.csv says nothing)."""
    if not len(run.rounds):
        return pd.DataFrame(columns=TICK_COLUMNS)
    td = m.tcp_deltas(run.tcp) if len(run.tcp) else None
    if td is not None and (td["counter"] == "TcpExtTCPTimeouts").any() and \
            not td.loc[td["counter"] == "TcpExtTCPTimeouts", "delta"].sum():
        return pd.DataFrame(columns=TICK_COLUMNS)
    hit = rto_rounds(run.rounds, run.queues, incast_ideal_ms(run), rto_min_ms(run))
    rows = []
    for h in hit.itertuples(index=False):
        snd = run.rounds[(run.rounds["round"] == h.round) & (run.rounds["sender"] == h.sender)]
        if len(snd):
            rows.append((float(snd["end_s"].max()), h.drops_port, "rto", 1.0))
    return pd.DataFrame(rows, columns=TICK_COLUMNS)


def op_bounds_ms(run: Run) -> dict[str, float]:
    """The alpha-beta bound per op name in ms: sweep.csv's ``bound_us`` (the collective scenario writes it), else
    summary.json's ``bound_ms`` under the name ``"*"`` (every op); {} when the run has neither."""
    path = run.path / "sweep.csv"
    if path.is_file():
        try:
            sw = pd.read_csv(path, usecols=["op", "bound_us"])
        except (ValueError, OSError, pd.errors.ParserError):
            sw = None
        if sw is not None:
            out = {str(o): float(b) / 1e3 for o, b in zip(sw["op"], sw["bound_us"])
                   if isinstance(b, (int, float)) and math.isfinite(b) and b > 0}
            if out:
                return out
    b = _num((run.summary or {}).get("bound_ms"))
    return {"*": b} if b else {}
