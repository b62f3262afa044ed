"""Pure metric functions over the DataFrames of a run directory (see docs/analysis.md for definitions).

Every function takes DataFrames / numbers and returns numbers, small dataclasses or DataFrames; none reads
files or touches global state. Units: seconds, bytes, bytes per second (``_Bps``); fractions in [0, 1].
The lesson these encode: collective tail time, not link bandwidth, sets AI-cluster throughput, so prefer
:func:`percentiles` (p99, with its sample count) and :func:`scaling_efficiency` over means.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "BUSBW_FACTORS",
    "LossRate",
    "Percentiles",
    "ScalingResult",
    "algbw",
    "busbw",
    "busbw_factor",
    "comm_wait_fraction",
    "counter_deltas",
    "cv",
    "ecn_mark_fraction",
    "goodput",
    "incast_loss_rate",
    "nearest_rank",
    "op_table",
    "pause_fraction",
    "pause_intervals",
    "percentiles",
    "port_counter_deltas",
    "queue_stats",
    "retransmit_rate",
    "round_times",
    "scaling_efficiency",
    "scaling_verdict",
    "step_times",
    "rank_step_times",
    "rank_timeline",
    "tcp_deltas",
]

# --------------------------------------------------------------------------- percentiles

PERCENTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99, "p999": 0.999}


def nearest_rank(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile: the ``ceil(q * n)``-th smallest sample (1-based), ``nan`` if empty.

    Always an observed value. With ``n < 1 / (1 - q)`` samples it is the maximum: p99 of 10 samples is
    just the max, p99.9 needs more than 1000 samples to differ from it.
    """
    x = np.sort(np.asarray(list(values) if not isinstance(values, (np.ndarray, pd.Series)) else values,
                           dtype=float))
    x = x[~np.isnan(x)]
    if x.size == 0:
        return math.nan
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    k = max(1, math.ceil(round(q * x.size, 9)))  # round(): 0.95*20 must be 19, not 19.000000000000004
    return float(x[k - 1])


@dataclass(frozen=True)
class Percentiles:
    """Tail summary of a sample: nearest-rank p50/p95/p99/p99.9, max, mean and the sample count ``n``."""

    p50: float
    p95: float
    p99: float
    p999: float
    max: float
    mean: float
    n: int

    def resolves(self, q: float) -> bool:
        """True when the q-percentile is not simply the max, i.e. ``ceil(q * n) < n``."""
        return self.n > 0 and math.ceil(round(q * self.n, 9)) < self.n

    def as_dict(self) -> dict:
        return asdict(self)

    def scaled(self, factor: float) -> "Percentiles":
        """Same summary with every value multiplied (e.g. 1e3 for seconds -> milliseconds)."""
        return Percentiles(self.p50 * factor, self.p95 * factor, self.p99 * factor, self.p999 * factor,
                           self.max * factor, self.mean * factor, self.n)


def percentiles(values: Iterable[float]) -> Percentiles:
    """:class:`Percentiles` of ``values`` (NaNs ignored); all-NaN fields and ``n == 0`` if empty."""
    x = np.asarray(values if isinstance(values, (np.ndarray, pd.Series)) else list(values), dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return Percentiles(math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, 0)
    return Percentiles(*(nearest_rank(x, q) for q in PERCENTILES.values()), float(x.max()), float(x.mean()),
                       int(x.size))


def cv(values: Iterable[float]) -> float:
    """Coefficient of variation ``std / mean`` with the sample std (ddof=1); nan for fewer than 2 values."""
    x = np.asarray(values if isinstance(values, (np.ndarray, pd.Series)) else list(values), dtype=float)
    x = x[~np.isnan(x)]
    if x.size < 2 or x.mean() == 0:
        return math.nan
    return float(x.std(ddof=1) / x.mean())


# --------------------------------------------------------------------------- bandwidth

#: nccl-tests bus-bandwidth factors, as functions of the rank count n. This is the project's only copy
#: (traffic.schedule's cost model and the collective scenario use it through :func:`busbw_factor`).
BUSBW_FACTORS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "pipeline": lambda n: 1.0,
}

#: other spellings of the same collectives (the scenario's aliases): an incast is a gather to one root, a
#: pipeline is a chain of send/recv pairs (nccl-tests' sendrecv)
_COLLECTIVE_ALIASES = {"incast": "gather", "sendrecv": "pipeline"}


def _norm_collective(name: str) -> str:
    key = str(name).lower().replace("_", "").replace("-", "").replace(" ", "")
    return _COLLECTIVE_ALIASES.get(key, key)


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests factor turning algbw into busbw for ``collective`` over ``n`` ranks: ``busbw = algbw * factor``
    with ``algbw = size / time`` and ``size`` the message size nccl-tests prints.

    The factor makes busbw comparable with the link rate: it is the share of ``size`` that the busiest rank's
    link must carry, whatever the algorithm (nccl-tests' PERFORMANCE.md and the ``*GetBw`` function of each
    test in its ``src/``):

    * allreduce ``2(n-1)/n`` (a reduce-scatter then an all-gather);
    * allgather, reducescatter, alltoall ``(n-1)/n`` (every rank receives / sends all but its own share);
    * **gather and scatter ``(n-1)/n``**: nccl-tests' gather.cu / scatter.cu compute ``baseBw = count * nranks *
      typesize / time`` (the *total* gathered or scattered size) and multiply it by ``(nranks-1)/nranks``: the
      root's link carries every rank's part but its own. (An earlier copy here had no gather/scatter and gave nan.)
    * broadcast, reduce ``1``; **pipeline (sendrecv) ``1``**: nccl-tests' sendrecv.cu uses factor 1, every rank
      sends and receives the whole message once.

    Names are matched case-insensitively ignoring ``_``/``-``/spaces, with ``incast`` = gather and ``sendrecv`` =
    pipeline. ``ValueError`` for an unknown collective or ``n < 1``.
    """
    key = _norm_collective(collective)
    if key not in BUSBW_FACTORS:
        raise ValueError(f"no bus-bandwidth factor for collective {collective!r}; known: {sorted(BUSBW_FACTORS)}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"rank count must be an integer >= 1, got {n!r}")
    return float(BUSBW_FACTORS[key](int(n)))


def algbw(size_bytes: float, cct_s: float) -> float:
    """Algorithm bandwidth ``size / CCT`` in bytes/s (nan if CCT <= 0)."""
    return float(size_bytes) / cct_s if cct_s > 0 else math.nan


def busbw(algbw_Bps: float, collective: str, n: int) -> float:
    """Bus bandwidth ``algbw * factor(collective, n)`` in bytes/s."""
    return algbw_Bps * busbw_factor(collective, n)


def goodput(nbytes: float, seconds: float) -> float:
    """Application bytes delivered per second (nan if ``seconds <= 0``)."""
    return float(nbytes) / seconds if seconds > 0 else math.nan


def maxmin_share(victim_cap: float, other_caps: Sequence[float], link: float) -> float:
    """Max-min fair rate of one flow (the victim, capped at ``victim_cap`` by its own bottleneck) on a link of
    capacity ``link`` shared with flows capped at ``other_caps`` (water-filling; any rate unit)."""
    flows = sorted([(c, False) for c in other_caps] + [(victim_cap, True)])
    left = link
    for k, (cap, is_victim) in enumerate(flows):
        rate = min(cap, left / (len(flows) - k))
        if is_victim:
            return rate
        left -= rate
    return 0.0


# --------------------------------------------------------------------------- collectives (ops.csv)

_OP_COLUMNS = ["iteration", "op_index", "op", "collective", "n_ranks", "start_s", "end_s", "cct_s",
               "size_bytes", "algbw_Bps", "busbw_Bps", "wait_s_max"]


def op_table(ops: pd.DataFrame, size_bytes: float | dict | None = None) -> pd.DataFrame:
    """One row per collective op, i.e. per ``(iteration, op_index)`` group of ops.csv.

    Columns: iteration, op_index, op, collective, n_ranks, start_s (first rank's start), end_s (last rank's
    end), cct_s = end_s - start_s, size_bytes, algbw_Bps = size/CCT, busbw_Bps = algbw * nccl factor,
    wait_s_max (largest per-rank wait). Sorted by (iteration, op_index).

    ``size_bytes`` is the nccl-tests message size: a number, a ``{op name or collective: bytes}`` dict, or
    None: then ops.csv's optional ``size_bytes`` column (the writer's exact nccl-tests size of the op) when it
    has one, else inferred as ``max over ranks of max(bytes_sent, bytes_recv) / factor(collective, n)`` (exact
    for ring-style algorithms, where each rank sends factor*size, and for gather/scatter, whose root receives /
    sends factor*size; nan for unknown collectives).
    """
    if ops.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c in ("op", "collective") else
                                          ("int64" if c in ("iteration", "op_index", "n_ranks") else "float64"))
                             for c in _OP_COLUMNS})
    ops = ops.assign(_moved=np.maximum(ops["bytes_sent"].to_numpy(), ops["bytes_recv"].to_numpy()))
    g = ops.groupby(["iteration", "op_index"], sort=True)
    t = g.agg(op=("op", "first"), collective=("collective", "first"), n_ranks=("rank", "nunique"),
              start_s=("start_s", "min"), end_s=("end_s", "max"), sent_max=("_moved", "max"),
              wait_s_max=("wait_s", "max"),
              **({"size_col": ("size_bytes", "max")} if "size_bytes" in ops.columns else {})).reset_index()
    t["cct_s"] = t["end_s"] - t["start_s"]
    sizes, algs, buses = [], [], []
    for row in t.itertuples(index=False):
        try:
            f = busbw_factor(row.collective, int(row.n_ranks))
        except ValueError:
            f = math.nan
        if isinstance(size_bytes, dict):
            s = size_bytes.get(row.op, size_bytes.get(row.collective, math.nan))
        elif size_bytes is not None:
            s = float(size_bytes)
        elif "size_col" in t.columns and not math.isnan(float(row.size_col)):
            s = float(row.size_col)
        else:
            s = row.sent_max / f if f and not math.isnan(f) else math.nan
        a = algbw(s, row.cct_s) if not math.isnan(s) else math.nan
        sizes.append(float(s))
        algs.append(a)
        buses.append(a * f if not math.isnan(f) else math.nan)
    t["size_bytes"], t["algbw_Bps"], t["busbw_Bps"] = sizes, algs, buses
    t["n_ranks"] = t["n_ranks"].astype("int64")
    return t[_OP_COLUMNS].reset_index(drop=True)


def _origins(ops: pd.DataFrame) -> pd.Series:
    """Per rank, when it began its first recorded iteration: ops.csv's optional ``iter_start_s`` (the instant
    the rank started the iteration's compute phase; for the first measured iteration, when it finished its
    warm-up) of that iteration, else its first op start (no compute before the first op is counted)."""
    first_it = ops.groupby("rank")["iteration"].transform("min")
    first = ops[ops["iteration"] == first_it]
    col = "iter_start_s" if "iter_start_s" in ops.columns else "start_s"
    origin = first.groupby("rank")[col].min()
    if col == "iter_start_s":  # a row without it (nan) falls back to the op start
        origin = origin.fillna(first.groupby("rank")["start_s"].min())
    return origin


def rank_step_times(ops: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, iteration): ``end_s`` = the rank's last op end in the iteration, ``step_s`` =
    ``end_s`` minus the rank's previous iteration end; for its first iteration minus its origin (ops.csv's
    ``iter_start_s`` when the writer recorded it: the step then includes that iteration's compute phase, like
    every later one; else its first op start, which leaves the first step's compute out), and ``wait_s`` = the
    time the rank spent waiting for peers in that iteration: the union of its ops' waits, each placed at its op's
    start as the per-rank timeline draws it (a ring rank's send and receive ops run at the same time, and summing
    their waits counted the same wall time twice: a comm-wait fraction of 1.37). ``start_s`` is the rank's first
    op start in the iteration."""
    cols = {"rank": "int64", "iteration": "int64", "start_s": "float64", "end_s": "float64",
            "step_s": "float64", "wait_s": "float64"}
    if ops.empty:
        return pd.DataFrame({c: pd.Series([], dtype=d) for c, d in cols.items()})
    r = (ops.groupby(["rank", "iteration"], sort=True)
         .agg(start_s=("start_s", "min"), end_s=("end_s", "max")).reset_index())
    wait_end = ops["start_s"] + ops["wait_s"].clip(lower=0.0).clip(upper=(ops["end_s"] - ops["start_s"]).clip(lower=0))
    waits = {key: _union_length(list(zip(g["start_s"], wait_end[g.index])), -math.inf, math.inf)
             for key, g in ops.groupby(["rank", "iteration"], sort=True)}
    r["wait_s"] = [waits[(rk, it)] for rk, it in zip(r["rank"], r["iteration"])]
    prev = r.groupby("rank")["end_s"].shift(1)
    r["step_s"] = r["end_s"] - prev.fillna(r["rank"].map(_origins(ops)))
    return r[list(cols)].reset_index(drop=True)


def step_times(ops: pd.DataFrame) -> pd.DataFrame:
    """Per iteration of synchronous training: ``end_s`` = when the slowest rank finished the iteration
    (max end_s), ``step_s = end_s(i) - end_s(i-1)`` (barrier to barrier, so it includes compute). For the
    first recorded iteration ``end_s(-1)`` is the job's measurement origin: the latest rank origin from
    ops.csv's ``iter_start_s`` (when every rank had finished its warm-up, so the first step includes its
    compute like the others), or without that column the first op start (the first step then lacks its
    compute; treat it as warm-up). Warm-up iterations are never in ops.csv.
    Columns: iteration, start_s (first op start), end_s, step_s."""
    if ops.empty:
        return pd.DataFrame({"iteration": pd.Series([], dtype="int64"), "start_s": pd.Series([], dtype=float),
                             "end_s": pd.Series([], dtype=float), "step_s": pd.Series([], dtype=float)})
    it = ops.groupby("iteration", sort=True).agg(start_s=("start_s", "min"), end_s=("end_s", "max")).reset_index()
    origin = float(_origins(ops).max()) if "iter_start_s" in ops.columns else float(it["start_s"].iloc[0])
    it["step_s"] = it["end_s"] - it["end_s"].shift(1).fillna(origin)
    return it


def comm_wait_fraction(ops: pd.DataFrame) -> tuple[float, pd.Series]:
    """Communication-wait fraction: ``sum(wait_s) / sum(step_s)`` over (rank, iteration) using
    :func:`rank_step_times` (each rank's own steps). Returns ``(overall, per_rank Series indexed by rank)``;
    nan when empty."""
    r = rank_step_times(ops)
    if r.empty or r["step_s"].sum() <= 0:
        return math.nan, pd.Series([], dtype=float, name="comm_wait_fraction")
    sums = r.groupby("rank")[["wait_s", "step_s"]].sum()
    per = (sums["wait_s"] / sums["step_s"].where(sums["step_s"] > 0)).rename("comm_wait_fraction")
    return float(r["wait_s"].sum() / r["step_s"].sum()), per


def rank_timeline(ops: pd.DataFrame) -> pd.DataFrame:
    """What each rank did, as intervals for a per-rank timeline: one row per (rank, iteration, kind, start_s,
    end_s) with kind ``compute`` (from the rank's previous iteration end, or its origin, to its first op start
    of the iteration: compute phase plus any host-side gap), ``wait`` (the op's wait_s, drawn from the op's
    start: ops.csv records how long a rank waited for its peers inside an op, not when) and ``comm`` (the rest
    of each op)."""
    cols = ["rank", "iteration", "kind", "start_s", "end_s"]
    if ops.empty:
        return pd.DataFrame({c: pd.Series([], dtype="int64" if c in ("rank", "iteration") else
                                          (object if c == "kind" else float)) for c in cols})
    rows = []
    r = rank_step_times(ops)
    prev_end = r.groupby("rank")["end_s"].shift(1).fillna(r["rank"].map(_origins(ops)))
    for row, p in zip(r.itertuples(index=False), prev_end):
        if row.start_s > p:
            rows.append((int(row.rank), int(row.iteration), "compute", float(p), float(row.start_s)))
    for o in ops.itertuples(index=False):
        w = min(max(float(o.wait_s), 0.0), float(o.end_s - o.start_s))
        if w > 0:
            rows.append((int(o.rank), int(o.iteration), "wait", float(o.start_s), float(o.start_s + w)))
        if o.end_s > o.start_s + w:
            rows.append((int(o.rank), int(o.iteration), "comm", float(o.start_s + w), float(o.end_s)))
    return pd.DataFrame(rows, columns=cols).sort_values(["rank", "start_s"], kind="stable").reset_index(drop=True)


# --------------------------------------------------------------------------- incast rounds

def round_times(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per incast round: start_s (first sender start), end_s (last sender end), round_s, bytes (sum over
    senders), senders, goodput_Bps = bytes / round_s."""
    if rounds.empty:
        return pd.DataFrame({"round": pd.Series([], dtype="int64"), "start_s": pd.Series([], dtype=float),
                             "end_s": pd.Series([], dtype=float), "round_s": pd.Series([], dtype=float),
                             "bytes": pd.Series([], dtype="int64"), "senders": pd.Series([], dtype="int64"),
                             "goodput_Bps": pd.Series([], dtype=float)})
    r = rounds.groupby("round", sort=True).agg(start_s=("start_s", "min"), end_s=("end_s", "max"),
                                               bytes=("bytes", "sum"), senders=("sender", "nunique")).reset_index()
    r["round_s"] = r["end_s"] - r["start_s"]
    r["goodput_Bps"] = [goodput(b, s) for b, s in zip(r["bytes"], r["round_s"])]
    return r[["round", "start_s", "end_s", "round_s", "bytes", "senders", "goodput_Bps"]]


# --------------------------------------------------------------------------- queue counters

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


# --------------------------------------------------------------------------- TCP counters

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


# --------------------------------------------------------------------------- PFC pauses

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


def _union_length(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Total length of the union of intervals clipped to [lo, hi]."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


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


# --------------------------------------------------------------------------- scaling

@dataclass(frozen=True)
class ScalingResult:
    """Scaling efficiency between N and kN ranks with its verdict (poor / marginal / good)."""

    mode: str
    k: float
    efficiency: float
    verdict: str


#: The seed article's bar: 75-80% scaling efficiency.
POOR_BELOW = 0.75
GOOD_ABOVE = 0.80


def scaling_verdict(eff: float) -> str:
    """``poor`` below 0.75, ``marginal`` for 0.75 <= eff <= 0.80, ``good`` above 0.80, ``n/a`` for nan."""
    if eff is None or math.isnan(eff):
        return "n/a"
    if eff < POOR_BELOW:
        return "poor"
    if eff <= GOOD_ABOVE:
        return "marginal"
    return "good"


def scaling_efficiency(t_n: float, t_kn: float, k: float, mode: str = "weak") -> ScalingResult:
    """Scaling efficiency from step times at N ranks (``t_n``) and at kN ranks (``t_kn``).

    Both are ``achieved throughput at kN / (k * throughput at N)``:

    * weak scaling (per-rank work W fixed, throughput = N*W/T): ``eff = T_N / T_kN``
    * strong scaling (total work W fixed, throughput = W/T):    ``eff = T_N / (k * T_kN)``

    Pass a tail-aware statistic of the step time (e.g. the median; compare p99 too).
    """
    if mode not in ("weak", "strong"):
        raise ValueError(f"mode must be 'weak' or 'strong', got {mode!r}")
    if k <= 0:
        raise ValueError(f"k must be > 0, got {k}")
    if not (t_n > 0 and t_kn > 0):
        eff = math.nan
    else:
        eff = t_n / t_kn if mode == "weak" else t_n / (k * t_kn)
    return ScalingResult(mode, float(k), float(eff), scaling_verdict(eff))
