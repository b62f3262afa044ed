"""Schedule generators, one module per family, and the registry :func:`make_schedule`.

>>> s = make_schedule("allreduce", ranks=8, message_bytes=1 << 20, chunks=4)            # ring by default
>>> s = make_schedule("allreduce", 8, 1 << 20, algorithm="double_tree")
>>> s = make_schedule("alltoall", 16, 1 << 20, seed=3, skew=1.2)
"""

from __future__ import annotations

import inspect
from typing import Callable

from ..schedule import DTYPES, Schedule, ScheduleError
from .alltoall import moe_splits, pairwise_alltoall
from .broadcast import ring_broadcast
from .halving_doubling import halving_doubling_allreduce
from .hierarchical import hierarchical_allreduce
from .incast import direct_gather
from .pipeline import pipeline_chain
from .ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from .tree import (double_tree_allreduce, heap_tree, nccl_btree, nccl_double_tree, tree_allreduce, tree_broadcast,
                   tree_reduce)

__all__ = [
    "make_schedule",
    "GENERATORS",
    "DEFAULT_ALGORITHM",
    "ALIASES",
    "canonical_collective",
    "algorithms",
    "moe_splits",
    "heap_tree",
    "nccl_btree",
    "nccl_double_tree",
]

#: (collective, algorithm) -> generator(ranks, count, *, dtype, chunks, params, **options)
GENERATORS: dict[tuple[str, str], Callable[..., Schedule]] = {
    ("allreduce", "ring"): ring_allreduce,
    ("allreduce", "tree"): tree_allreduce,
    ("allreduce", "double_tree"): double_tree_allreduce,
    ("allreduce", "halving_doubling"): halving_doubling_allreduce,
    ("allreduce", "hierarchical"): hierarchical_allreduce,
    ("allgather", "ring"): ring_allgather,
    ("reducescatter", "ring"): ring_reduce_scatter,
    ("reduce", "tree"): tree_reduce,
    ("broadcast", "tree"): tree_broadcast,
    ("broadcast", "ring"): ring_broadcast,
    ("alltoall", "pairwise"): pairwise_alltoall,
    ("gather", "direct"): direct_gather,
    ("pipeline", "chain"): pipeline_chain,
}
DEFAULT_ALGORITHM = {
    "allreduce": "ring",
    "allgather": "ring",
    "reducescatter": "ring",
    "reduce": "tree",
    "broadcast": "tree",
    "alltoall": "pairwise",
    "gather": "direct",
    "pipeline": "chain",
}
ALIASES = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "all_to_all": "alltoall",
    "incast": "gather",
    "p2p": "pipeline",
}


def canonical_collective(name: object) -> str:
    """Lower-case, '-' -> '_', apply :data:`ALIASES`; raise :class:`ScheduleError` for unknown names."""
    if not isinstance(name, str):
        raise ScheduleError(f"collective must be a string, got {type(name).__name__}")
    c = name.strip().lower().replace("-", "_")
    c = ALIASES.get(c, c)
    if c not in DEFAULT_ALGORITHM:
        raise ScheduleError(f"unknown collective {name!r}; known: {', '.join(sorted(DEFAULT_ALGORITHM))} "
                            f"(aliases: {', '.join(sorted(ALIASES))})")
    return c


def algorithms(collective: str) -> list[str]:
    """The algorithms available for ``collective`` (default first)."""
    c = canonical_collective(collective)
    algs = [a for (cc, a) in GENERATORS if cc == c]
    return sorted(algs, key=lambda a: (a != DEFAULT_ALGORITHM[c], a))


def _plain_int(what: str, v: object, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ScheduleError(f"{what} must be an integer, got {type(v).__name__} {v!r}")
    if v < minimum:
        raise ScheduleError(f"{what} must be >= {minimum}, got {v}")
    return v


def make_schedule(collective: str, ranks: int, message_bytes: int, chunks: int = 1, seed: int = 0,
                  **opts: object) -> Schedule:
    """Generate and validate a schedule.

    ``message_bytes`` is each rank's input size (must be a multiple of the dtype's size); ``chunks`` cuts
    every transfer into that many pipelined pieces (pieces that would be empty are dropped).  Options:
    ``algorithm`` (see :data:`GENERATORS`), ``dtype`` (default float32), ``root`` (broadcast, reduce,
    gather; default 0), ``skew`` (alltoall, default 0: even), ``non_power_of_two`` (halving_doubling:
    ``prepost`` or ``error``).  Raises :class:`ScheduleError` on any bad argument.
    """
    c = canonical_collective(collective)
    n = _plain_int("ranks", ranks, 2)
    size = _plain_int("message_bytes", message_bytes, 1)
    chunks = _plain_int("chunks", chunks, 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ScheduleError(f"seed must be an integer, got {type(seed).__name__} {seed!r}")
    opts = dict(opts)
    dtype = opts.pop("dtype", "float32")
    if dtype not in DTYPES:
        raise ScheduleError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    itemsize = DTYPES[dtype]  # type: ignore[index]
    if size % itemsize:
        raise ScheduleError(f"message_bytes {size} is not a multiple of the {dtype} element size {itemsize}")
    algorithm = opts.pop("algorithm", DEFAULT_ALGORITHM[c])
    gen = GENERATORS.get((c, algorithm))  # type: ignore[arg-type]
    if gen is None:
        raise ScheduleError(f"unknown algorithm {algorithm!r} for {c}; known: {', '.join(algorithms(c))}")
    accepted = set(inspect.signature(gen).parameters) - {"ranks", "count", "dtype", "chunks", "params"}
    for key in opts:
        if key not in accepted:
            raise ScheduleError(f"unknown option {key!r} for {c}/{algorithm}"
                                + (f"; accepted: {', '.join(sorted(accepted))}" if accepted else ""))
    kwargs = dict(opts)
    if "seed" in accepted:
        kwargs["seed"] = seed
    if "root" in accepted:
        root = kwargs.setdefault("root", 0)
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < n:
            raise ScheduleError(f"root must be a rank in 0..{n - 1}, got {root!r}")
    params: dict[str, object] = {"message_bytes": size, "chunks": chunks, "seed": seed}
    params.update({k: v for k, v in kwargs.items()})
    for k, v in params.items():
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise ScheduleError(f"option {k!r} must be a number, string or bool, got {type(v).__name__}")
    schedule = gen(n, size // itemsize, dtype=dtype, chunks=chunks, params=params, **kwargs)
    return schedule.validate()
