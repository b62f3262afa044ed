"""A jobs file's values checked (testbed.commands.jobsfile): the checks every kind of entry shares, each refusal a
UsageError of one line naming the entry (``where``) and the key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from testbed.errors import UsageError
from testbed.params import Param

#: the latest start an entry may ask for, seconds after the jobs' common t = 0
MAX_START_S = 600.0


def typed(q: Param, v: Any, where: str) -> Any:
    """``v`` checked against the parameter ``q`` (type, range, choices); an int for a float becomes a float."""
    if q.kind is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, q.kind) or (q.kind is not bool and isinstance(v, bool)):
        raise UsageError(f"{where}: {q.name}: not a valid {q.kind.__name__} ({v!r})")
    try:
        q.check(v)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return v


def number(entry: dict, key: str, where: str, default: float | None, low: float, high: float,
           low_open: bool = False) -> float:
    v = entry.get(key, default)
    if v is None:
        raise UsageError(f"{where}: {key} is required")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UsageError(f"{where}: {key}: a number (got {v!r})")
    if v < low or (low_open and v == low) or v > high:
        raise UsageError(f"{where}: {key}: must be {'>' if low_open else '>='} {low:g} and <= {high:g} (got {v!r})")
    return float(v)


def host_list(entry: dict, key: str, where: str, known: set[str]) -> tuple[str, ...]:
    v = entry.get(key)
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(h, str) for h in v):
        raise UsageError(f"{where}: {key}: a list of host names, e.g. [\"h1\", \"h2\"] (got {v!r})")
    for h in v:
        if h not in known:
            raise UsageError(f"{where}: {key}: unknown host {h!r} (hosts: {', '.join(sorted(known, key=_order))})")
    if len(set(v)) != len(v):
        raise UsageError(f"{where}: {key}: a host is listed twice ({v!r})")
    return tuple(v)


def _order(h: str) -> tuple:
    m = re.match(r"^([a-z]+)(\d+)$", h)
    return (m.group(1), int(m.group(2))) if m else (h, 0)


def unknown(entry: dict, allowed, where: str) -> None:
    extra = [k for k in entry if k not in allowed]
    if extra:
        raise UsageError(f"{where}: unknown key {extra[0]!r} (known: {', '.join(sorted(allowed))})")


def relative(value: str, base: Path) -> str:
    return value if not value or Path(value).is_absolute() else str((base / value).resolve())
