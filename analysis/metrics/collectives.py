"""Collective metrics from ops.csv (one row per rank and op): per-op CCT and bandwidth, step times per rank and
per iteration, the communication-wait fraction, each op's arrival skew and transfer (its CCT taken apart), the
per-rank timeline; and incast rounds from rounds.csv."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from .bandwidth import algbw, busbw_factor, goodput
from .samples import _union_length


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


def op_arrivals(ops: pd.DataFrame) -> pd.DataFrame:
    """When each collective op's ranks arrived, and what its completion time is made of: one row per
    ``(iteration, op_index)`` with ``first_arrival_s`` / ``last_arrival_s`` (the earliest / latest rank's
    ``start_s``: when its agent entered the op), ``end_s`` (the last rank's completion), ``cct_s`` =
    end_s - first_arrival_s (as :func:`op_table`), ``arrival_skew_s`` = last_arrival_s - first_arrival_s (the part
    of the CCT no network can shorten: a synchronous collective cannot finish before its last rank joins it) and
    ``transfer_s`` = end_s - last_arrival_s (the part the network and the transport take once every rank is in).
    ``cct_s == arrival_skew_s + transfer_s``.

    ops.csv records no communicator: an ``(iteration, op_index)`` whose ranks form several independent groups (a
    tensor-parallel op run by each group at once) is taken as one op, so its skew spans the groups."""
    cols = ["iteration", "op_index", "op", "first_arrival_s", "last_arrival_s", "end_s", "cct_s", "arrival_skew_s",
            "transfer_s"]
    if ops.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c == "op" else
                                          ("int64" if c in ("iteration", "op_index") else "float64")) for c in cols})
    t = (ops.groupby(["iteration", "op_index"], sort=True)
         .agg(op=("op", "first"), first_arrival_s=("start_s", "min"), last_arrival_s=("start_s", "max"),
              end_s=("end_s", "max")).reset_index())
    t["cct_s"] = t["end_s"] - t["first_arrival_s"]
    t["arrival_skew_s"] = t["last_arrival_s"] - t["first_arrival_s"]
    t["transfer_s"] = t["end_s"] - t["last_arrival_s"]
    return t[cols]


def group_ids(ops: pd.DataFrame, groups: Mapping[str, Sequence[Sequence[int]]] | None = None) -> np.ndarray:
    """Per row of ops.csv, the communicator its rank ran the op in: the index of the rank's group in ``groups``
    (op name -> disjoint lists of ranks: the manifest's ``op_groups``, e.g. every tensor-parallel group's
    all-reduce of a layer at once), -1 where the op has no groups (all its ranks are one communicator)."""
    gid = {(str(name), int(r)): i for name, gs in (groups or {}).items() for i, g in enumerate(gs) for r in g}
    return np.array([gid.get((str(o), int(r)), -1) for o, r in zip(ops["op"], ops["rank"])], dtype="int64")


def rank_op_split(ops: pd.DataFrame, groups: Mapping[str, Sequence[Sequence[int]]] | None = None) -> pd.DataFrame:
    """Each rank's time in each op, split in two: ``arrival_wait_s`` (from this rank's arrival to the last rank's
    arrival at the same op: waiting for the slowest peer to join; 0 for the last rank) and ``transfer_s`` (from
    then to this rank's completion: moving data with every peer present). The split is clipped to the rank's
    own op, so ``arrival_wait_s + transfer_s == end_s - start_s`` always (a rank that finished before the last
    arrival, e.g. a broadcast root whose data fit in the socket buffers, spent all of it waiting).
    ``groups`` (:func:`group_ids`): a grouped op's peers are the ranks of the rank's own group; the groups do not
    wait for each other, so a rank never waits for another group's last arrival.
    Columns: rank, iteration, op_index, op, start_s, end_s, last_arrival_s, arrival_wait_s, transfer_s.

    This differs from ops.csv's ``wait_s`` (the agent's time blocked in the transport with a receive
    outstanding): that also counts waiting for bytes on the wire, ~all of a ring step's time in a run without a
    straggler, so it cannot tell a late peer from a busy network."""
    cols = ["rank", "iteration", "op_index", "op", "start_s", "end_s", "last_arrival_s", "arrival_wait_s",
            "transfer_s"]
    if ops.empty:
        return pd.DataFrame({c: pd.Series([], dtype=object if c == "op" else
                                          ("int64" if c in ("rank", "iteration", "op_index") else "float64"))
                             for c in cols})
    gid = pd.Series(group_ids(ops, groups), index=ops.index)
    last = ops["start_s"].groupby([ops["iteration"], ops["op_index"], gid]).transform("max")
    dur = (ops["end_s"] - ops["start_s"]).clip(lower=0.0)
    wait = (last - ops["start_s"]).clip(lower=0.0).clip(upper=dur)
    out = ops.assign(last_arrival_s=last, arrival_wait_s=wait, transfer_s=dur - wait)
    return out[cols].sort_values(["rank", "iteration", "op_index"], kind="stable").reset_index(drop=True)


def cct_split_vs_bound(ops: pd.DataFrame, bound_s: Mapping[str, float]) -> dict[str, float]:
    """``cct_vs_bound`` taken apart: the mean over ops of ``arrival_skew_s / bound`` (``arrival_skew_vs_bound``:
    time lost to a rank arriving late, e.g. a straggler's compute) and of ``transfer_s / bound``
    (``transfer_vs_bound``: the network's and transport's share; near 1 on an uncongested fabric), which add up to
    the mean CCT / bound; plus ``arrival_skew_ms_mean`` and ``transfer_ms_mean``. ``bound_s``: the alpha-beta
    bound per op name (seconds); ops without a positive bound are left out. {} when no op has one."""
    t = op_arrivals(ops)
    b = t["op"].map(lambda o: float(bound_s.get(o, math.nan)))
    t = t[b > 0]
    b = b[b > 0]
    if t.empty:
        return {}
    return {"arrival_skew_vs_bound": float((t["arrival_skew_s"] / b).mean()),
            "transfer_vs_bound": float((t["transfer_s"] / b).mean()),
            "arrival_skew_ms_mean": float(t["arrival_skew_s"].mean() * 1e3),
            "transfer_ms_mean": float(t["transfer_s"].mean() * 1e3)}


def rank_timeline(ops: pd.DataFrame, groups: Mapping[str, Sequence[Sequence[int]]] | None = None) -> pd.DataFrame:
    """What each rank did, as intervals for a per-rank timeline: one row per (rank, iteration, kind, start_s,
    end_s) with kind ``compute`` (from the rank's previous iteration end, or its origin, to its first op start
    of the iteration: compute phase plus any host-side gap), ``wait`` (from the rank's arrival at an op to the
    last rank's arrival: waiting for the slowest peer to join, :func:`rank_op_split`) and ``transfer`` (from the
    last arrival to this rank's completion of the op: data moving with every peer present). Per rank, the
    intervals cover its origin to its last op end; an op's wait + transfer is its duration. ``groups``: as
    :func:`rank_op_split` (a grouped op's wait is for the rank's own group)."""
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
    for o in rank_op_split(ops, groups).itertuples(index=False):
        split = float(o.start_s + o.arrival_wait_s)
        if o.arrival_wait_s > 0:
            rows.append((int(o.rank), int(o.iteration), "wait", float(o.start_s), split))
        if o.transfer_s > 0:
            rows.append((int(o.rank), int(o.iteration), "transfer", split, float(o.end_s)))
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
