"""What every part of a schedule shares: its error, the names it accepts (collectives, dtypes, actions) and the
integer helpers (checked integers, even splits, seeded shuffles) that keep generated schedules deterministic."""

from __future__ import annotations

import random
from typing import Any, Sequence

import numpy as np


class ScheduleError(ValueError):
    """A schedule, its parameters or its JSON form is invalid.  The message is always a single line."""

    def __init__(self, message: object) -> None:
        super().__init__(" ".join(str(message).split()))


#: Collectives whose result :func:`expected_outputs` knows.  ``custom`` schedules (e.g. imported traces) can be
#: validated and simulated but have no first-principles expected result.
COLLECTIVES = (
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "broadcast",
    "reduce",
    "gather",
    "pipeline",
    "custom",
)
#: Collectives with a distinguished root rank (the ``root`` field is required).
ROOTED_COLLECTIVES = ("broadcast", "reduce", "gather")
#: Supported element types -> bytes per element (numpy names).
DTYPES: dict[str, int] = {"float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8}
#: What a receive (or local operation) does with the data: overwrite or sum into the destination.
ACTIONS = ("copy", "reduce")


def is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_int(what: str, v: object, minimum: int | None = None) -> int:
    if not is_int(v):
        raise ScheduleError(f"{what} must be an integer, got {type(v).__name__} {v!r}")
    v = int(v)  # type: ignore[arg-type]
    if minimum is not None and v < minimum:
        raise ScheduleError(f"{what} must be >= {minimum}, got {v}")
    return v


def split_evenly(total: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous pieces of ``total`` elements; the remainder goes one each to the first pieces."""
    total = check_int("total", total, 0)
    parts = check_int("parts", parts, 1)
    base, rem = divmod(total, parts)
    return [base + (1 if i < rem else 0) for i in range(parts)]


def offsets_of(sizes: Sequence[int]) -> list[int]:
    """Start offsets of consecutive pieces with the given sizes (exclusive prefix sums)."""
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out

def check_splits(splits: object, n: int, count: int) -> tuple[tuple[int, ...], ...]:
    rows = tuple(tuple(row) for row in splits)  # type: ignore[union-attr]
    if len(rows) != n or any(len(r) != n for r in rows):
        raise ScheduleError(f"splits must be a {n}x{n} matrix")
    out = []
    for i, row in enumerate(rows):
        vals = tuple(check_int(f"splits[{i}]", v, 0) for v in row)
        if sum(vals) != count:
            raise ScheduleError(f"splits[{i}] sums to {sum(vals)}, must equal count {count}")
        out.append(vals)
    return tuple(out)



# ---------------------------------------------------------------------------------------------- determinism


def stable_rng(seed: int) -> random.Random:
    """A seeded generator whose ``random()`` stream Python guarantees across versions (use only ``random()``)."""
    return random.Random(check_int("seed", seed))


def stable_shuffle(rng: random.Random, items: Sequence[Any]) -> list[Any]:
    """Fisher-Yates on ``rng.random()`` only, so the result never changes across Python/NumPy versions."""
    out = list(items)
    for i in range(len(out) - 1, 0, -1):
        j = min(int(rng.random() * (i + 1)), i)
        out[i], out[j] = out[j], out[i]
    return out
