"""A training step's communication from its parallelism: tensor (TP), pipeline (PP), data (DP) and expert (EP)
parallel sizes and a small model description, turned into the ops every rank runs per step (each a grouped
collective: all groups of a dimension at once, traffic.collectives.grouped).

    par = Parallelism(tp=2, dp=4, ep=1, order="tp-dp")
    ops = step_ops(Model(params=1_000_000, layers=2, hidden=256, tokens=64, micro_batches=2), par)

Ranks: ``tp * dp * pp``. With ``order="tp-dp"`` (Megatron's default) rank = tp_index + tp * (dp_index + dp *
pp_stage), so a TP group is consecutive ranks: with ``gpus_per_host = tp`` it sits inside one server, on its scale-up
domain. ``order="dp-tp"`` strides TP groups across the ranks (rank = dp_index + dp * (tp_index + tp * pp_stage)):
the same job with its TP traffic on the fabric. Each pipeline stage holds ``layers / pp`` layers.

Per step (Megatron-style, blocking, in this order; op names say the dimension before the first dot):

* **TP**: per micro-batch, per layer, 2 all-reduces of the layer's activations (tokens x hidden elements) forward
  and 2 backward (attention and MLP blocks), within each TP group;
* **EP** (``experts`` > 0 and ep > 1: every layer is a mixture-of-experts layer): per micro-batch, per layer, an
  all-to-all dispatch and combine of tokens x topk x hidden forward and the same two backward, within each EP group
  (ep consecutive DP indices of one TP index), uneven by ``skew`` (hot experts, traffic.collectives.moe_splits);
* **PP** (pp > 1): per micro-batch, the activations (tokens x hidden elements) forward from stage to stage after
  the stage's layers, and their gradients back from the last stage to the first before the backward layers, in
  every pipeline group (a chain: traffic.collectives' pipeline);
* **DP**: after the backward pass, the gradients (params / (tp x pp) elements) all-reduced within each DP group, in
  buckets of ``bucket_bytes``.

Not modelled: the overlap of communication with compute, and a pipeline schedule's interleaving (1F1B): the stages
move a micro-batch's activations in lockstep, so there is no pipeline bubble (docs/collective.md).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DIMENSIONS", "Model", "Parallelism", "ParallelismError", "StepOp", "groups", "step_ops"]

DIMENSIONS = ("tp", "pp", "ep", "dp")
ORDERS = ("tp-dp", "dp-tp")


class ParallelismError(ValueError):
    """An impossible layout or model: one line."""


@dataclass(frozen=True)
class Model:
    params: int = 1_000_000  # parameters (dense; each TP rank holds params / tp)
    layers: int = 2
    hidden: int = 256
    tokens: int = 64  # tokens per micro-batch on one DP rank
    micro_batches: int = 2
    experts: int = 0  # > 0: every layer is an MoE layer with this many experts
    topk: int = 1
    bucket_bytes: int = 1 << 20
    skew: float = 0.0  # MoE all-to-all skew (0: even)


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    dp: int = 1
    ep: int = 1
    order: str = "tp-dp"
    pp: int = 1

    def __post_init__(self) -> None:
        for k in ("tp", "dp", "ep", "pp"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParallelismError(f"{k} must be an integer >= 1 (got {v!r})")
        if self.dp % self.ep:
            raise ParallelismError(f"ep ({self.ep}) must divide dp ({self.dp}): expert groups are made of DP ranks")
        if self.order not in ORDERS:
            raise ParallelismError(f"order must be one of {', '.join(ORDERS)} (got {self.order!r})")

    @property
    def ranks(self) -> int:
        return self.tp * self.dp * self.pp

    def rank(self, tp_index: int, dp_index: int, stage: int = 0) -> int:
        if self.order == "tp-dp":
            return tp_index + self.tp * (dp_index + self.dp * stage)
        return dp_index + self.dp * (tp_index + self.tp * stage)


def groups(par: Parallelism, dim: str) -> list[list[int]]:
    """The communicators of dimension ``dim``, in every pipeline stage: TP groups (one per DP index), DP groups (one
    per TP index), EP groups (ep consecutive DP indices of one TP index); PP groups (one per TP and DP index: the
    stages in order)."""
    st = range(par.pp)
    if dim == "tp":
        return [[par.rank(t, d, p) for t in range(par.tp)] for p in st for d in range(par.dp)]
    if dim == "dp":
        return [[par.rank(t, d, p) for d in range(par.dp)] for p in st for t in range(par.tp)]
    if dim == "ep":
        return [[par.rank(t, d, p) for d in range(start, start + par.ep)]
                for p in st for t in range(par.tp) for start in range(0, par.dp, par.ep)]
    if dim == "pp":
        return [[par.rank(t, d, p) for p in st] for t in range(par.tp) for d in range(par.dp)]
    raise ParallelismError(f"unknown dimension {dim!r}")


@dataclass(frozen=True)
class StepOp:
    """One op of the step: its name (``dim.what``), dimension, collective, each rank's bytes and the groups."""
    name: str
    dim: str
    collective: str
    size_bytes: int
    groups: tuple[tuple[int, ...], ...]
    skew: float = 0.0


def step_ops(model: Model, par: Parallelism, itemsize: int = 4) -> list[StepOp]:
    """Every op of one training step, in order (module docstring)."""
    m = model
    for k in ("layers", "hidden", "tokens", "micro_batches", "params", "bucket_bytes", "topk"):
        v = getattr(m, k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParallelismError(f"model {k} must be an integer >= 1 (got {v!r})")
    if m.experts and m.experts < par.ep:
        raise ParallelismError(f"experts ({m.experts}) must be >= ep ({par.ep})")
    if m.layers % par.pp:
        raise ParallelismError(f"layers ({m.layers}) must be a multiple of pp ({par.pp}): each stage holds as many")
    layers = m.layers // par.pp
    pp = tuple(map(tuple, groups(par, "pp")))
    pp_back = tuple(tuple(reversed(g)) for g in pp)
    tp = tuple(map(tuple, groups(par, "tp")))
    ep = tuple(map(tuple, groups(par, "ep")))
    dp = tuple(map(tuple, groups(par, "dp")))
    act = m.tokens * m.hidden * itemsize
    moe = m.experts > 0 and par.ep > 1
    a2a = m.tokens * m.topk * m.hidden * itemsize
    ops: list[StepOp] = []
    for mb in range(m.micro_batches):
        for layer in range(layers):
            if par.tp > 1:
                ops += [StepOp(f"tp.l{layer}.mb{mb}.fwd{i}", "tp", "allreduce", act, tp) for i in range(2)]
            if moe:
                ops += [StepOp(f"ep.l{layer}.mb{mb}.{w}", "ep", "alltoall", a2a, ep, m.skew)
                        for w in ("dispatch", "combine")]
        if par.pp > 1:
            ops.append(StepOp(f"pp.mb{mb}.fwd", "pp", "pipeline", act, pp))
            ops.append(StepOp(f"pp.mb{mb}.bwd", "pp", "pipeline", act, pp_back))
        for layer in reversed(range(layers)):
            if moe:
                ops += [StepOp(f"ep.l{layer}.mb{mb}.{w}.bwd", "ep", "alltoall", a2a, ep, m.skew)
                        for w in ("combine", "dispatch")]
            if par.tp > 1:
                ops += [StepOp(f"tp.l{layer}.mb{mb}.bwd{i}", "tp", "allreduce", act, tp) for i in range(2)]
    if par.dp > 1:
        grads = -(-m.params // (par.tp * par.pp)) * itemsize
        n = -(-grads // m.bucket_bytes)
        for b in range(n):
            size = min(m.bucket_bytes, grads - b * m.bucket_bytes)
            ops.append(StepOp(f"dp.bucket{b}", "dp", "allreduce", -(-size // itemsize) * itemsize, dp))
    if not ops:
        raise ParallelismError("this layout communicates nothing (tp = dp = pp = 1)")
    return ops
