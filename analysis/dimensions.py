"""Communication time per parallelism dimension: how much of a step each of a job's communicators (tensor, pipeline,
data, expert parallel) takes, from ops.csv alone.

An op's dimension is its name's prefix before the first dot (``tp.l0.mb1.fwd0``, ``dp.bucket3``, ``ep.l1.mb0.dispatch``:
the names traffic.parallelism gives). Per rank and iteration, a dimension's communication time is the sum of its ops'
durations on that rank (end_s - start_s; a rank runs its ops one after another, so they do not overlap);
``comm_ms_<dim>`` is its mean over (rank, iteration), and ``comm_fraction_<dim>`` the sum over ranks and iterations
divided by the sum of the same ranks' step times (analysis.metrics.rank_step_times)."""

from __future__ import annotations

import pandas as pd

from .metrics import rank_step_times

__all__ = ["DIMENSIONS", "comm_by_dimension", "dimension_of"]

DIMENSIONS = ("tp", "pp", "dp", "ep")


def dimension_of(op: str) -> str:
    """``tp`` for ``tp.l0.mb0.fwd0``; "" for a name without a known dimension prefix."""
    head = str(op).split(".", 1)[0]
    return head if head in DIMENSIONS and "." in str(op) else ""


def comm_by_dimension(ops: pd.DataFrame) -> dict:
    """``comm_ms_<dim>`` and ``comm_fraction_<dim>`` for every dimension present (module docstring); {} when no op
    name carries one."""
    if ops.empty:
        return {}
    dims = ops["op"].map(dimension_of)
    if not (dims != "").any():
        return {}
    d = ops.assign(_dim=dims, _dur=(ops["end_s"] - ops["start_s"]).clip(lower=0.0))
    per = d[d["_dim"] != ""].groupby(["_dim", "rank", "iteration"])["_dur"].sum()
    steps = rank_step_times(ops).set_index(["rank", "iteration"])["step_s"]
    pairs = steps.index
    total_step = float(steps.sum())
    out = {}
    for dim in DIMENSIONS:
        if dim not in per.index.get_level_values(0):
            continue
        s = per.loc[dim].reindex(pairs, fill_value=0.0)
        out[f"comm_ms_{dim}"] = float(s.mean()) * 1e3
        out[f"comm_fraction_{dim}"] = float(s.sum()) / total_step if total_step > 0 else float("nan")
    return out
