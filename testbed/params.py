"""Scenario parameters: name, unit, default, allowed range, parsed from `--set name=value`.

Validation happens here, before anything is created on the system; a bad value is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Sequence

from testbed.errors import UsageError

_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}

#: a run's ``--seed``: it seeds numpy/random (schedules, placement, jitter) and the multipath hash seed
#: (net.ipv4.fib_multipath_hash_seed, a u32), so it is an integer 0..2**32-1
SEED_MAX = 2**32 - 1
SEED_HELP = f"an integer 0..{SEED_MAX}"


def parse_seed(text: str) -> int:
    """argparse ``type=`` of ``--seed`` (testbed run, testbed sweep): a decimal integer 0..2**32-1; anything
    else is argparse's one-line error, exit status 2."""
    t = str(text).strip()
    if not t.isdigit() or not t.isascii():  # no sign, no 0x, no 1e3, no 1_000: the value as the manifest records it
        raise argparse.ArgumentTypeError(f"a seed is {SEED_HELP} (got {text!r})")
    v = int(t)
    if v > SEED_MAX:
        raise argparse.ArgumentTypeError(f"a seed is {SEED_HELP} (got {text!r})")
    return v


def parse_number(text: str, integer: bool) -> float | int:
    """'1500', '64K', '1M', '2.5', '1Mi' -> number (K/M/G decimal, Ki/Mi/Gi binary)."""
    t = text.strip().lower().rstrip("b")
    mult = 1
    for suf in ("ki", "mi", "gi", "k", "m", "g"):
        if t.endswith(suf):
            mult, t = _SUFFIX[suf], t[: -len(suf)]
            break
    v = float(t) * mult
    if not math.isfinite(v):  # NaN passes every range check; int(inf) raises OverflowError
        raise ValueError(text)
    if integer:
        if v != int(v):
            raise ValueError(text)
        return int(v)
    return v


@dataclass(frozen=True)
class Param:
    name: str
    kind: type  # int, float, str, bool
    default: Any
    unit: str = ""
    help: str = ""
    min: float | None = None
    max: float | None = None
    choices: Sequence[str] | None = None

    def parse(self, text: str) -> Any:
        try:
            if self.kind is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    v: Any = True
                elif text.lower() in ("0", "false", "no", "off"):
                    v = False
                else:
                    raise ValueError(text)
            elif self.kind in (int, float):
                v = parse_number(text, self.kind is int)
            else:
                v = text
        except ValueError:
            raise UsageError(f"{self.name}: not a valid {self.kind.__name__} ({text!r})") from None
        self.check(v)
        return v

    def check(self, v: Any) -> None:
        if self.choices is not None and v not in self.choices:
            raise UsageError(f"{self.name}: must be one of {', '.join(self.choices)} (got {v!r})")
        if self.min is not None and v < self.min:
            raise UsageError(f"{self.name}: must be >= {self.min:g}{self.unit and ' ' + self.unit} (got {v!r})")
        if self.max is not None and v > self.max:
            raise UsageError(f"{self.name}: must be <= {self.max:g}{self.unit and ' ' + self.unit} (got {v!r})")

    def describe(self) -> str:
        rng = ""
        if self.choices:
            rng = "one of " + "|".join(self.choices)
        elif self.min is not None or self.max is not None:
            lo = "" if self.min is None else f"{self.min:g}"
            hi = "" if self.max is None else f"{self.max:g}"
            rng = f"{lo}..{hi}"
        unit = f" [{self.unit}]" if self.unit else ""
        return f"  {self.name}{unit}: {self.help} (default {self.default}{', ' + rng if rng else ''})"


def resolve(params: Sequence[Param], sets: Sequence[str]) -> dict[str, Any]:
    """Defaults overridden by `name=value` strings; unknown names and bad values raise UsageError."""
    by_name = {p.name: p for p in params}
    out = {p.name: p.default for p in params}
    for s in sets:
        if "=" not in s:
            raise UsageError(f"--set takes name=value (got {s!r})")
        k, v = s.split("=", 1)
        k = k.strip().replace("-", "_")
        if k not in by_name:
            raise UsageError(f"unknown parameter {k!r} (known: {', '.join(sorted(by_name))})")
        out[k] = by_name[k].parse(v)
    return out
