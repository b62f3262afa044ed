"""Grading a classroom lab's runs against its expected outcomes (labs/*/lab.toml's ``[[expect]]`` statements).

A statement is a band on one metric of one run, or on the ratio of two runs' values of one metric ("the p99 round
time with RTOmin 200 ms is at least 3x the one with 5 ms"): ``metric``, ``run``, optionally ``over`` (the ratio's
denominator run), ``min`` and/or ``max``. The metric is what :func:`analysis.summary.summarize` gives for the run
directory, so a statement means what the report and ``testbed compare`` show.

Run directories are matched to the lab's runs by folder name (``<lab out>/<run name>/``), else by scenario and
parameters. A run made with other parameters or faults than the lab asks for is reported as such and not graded:
its numbers answer another question. This module reads run folders only."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .summary import load_quietly, summarize

PASS, FAIL, MISSING, DIFFERENT, NO_VALUE = "pass", "FAIL", "missing", "different", "no value"


@dataclass(frozen=True)
class Expect:
    """One checkable statement."""

    says: str
    metric: str
    run: str
    over: str | None = None
    per: str | None = None  # another metric of the same run(s): the statement is on metric / per
    min: float | None = None
    max: float | None = None
    hint: str = ""

    def band(self) -> str:
        def one(run: str) -> str:
            return f"{self.metric}({run})" + (f"/{self.per}({run})" if self.per else "")

        what = one(self.run) + (f" / {one(self.over)}" if self.over else "")
        lo = f"{self.min:g} <= " if self.min is not None else ""
        hi = f" <= {self.max:g}" if self.max is not None else ""
        return f"{lo}{what}{hi}"


@dataclass(frozen=True)
class WantedRun:
    """What the lab asks one run to be: its scenario, the parameters it sets, its faults (as written)."""

    name: str
    scenario: str
    params: dict[str, Any]
    faults: tuple[str, ...] = ()


@dataclass
class Verdict:
    expect: Expect
    status: str
    value: float | None = None
    note: str = ""


@dataclass
class Matched:
    """Lab run name -> its run directory; runs found but made differently -> why."""

    dirs: dict[str, Path] = field(default_factory=dict)
    different: dict[str, str] = field(default_factory=dict)


def _manifest(path: Path) -> dict | None:
    try:
        m = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def _candidates(paths: list[Path]) -> list[Path]:
    """Run directories among `paths`: each path itself when it has a manifest, else its sub-folders that do."""
    out: list[Path] = []
    for p in paths:
        if (p / "manifest.json").is_file():
            out.append(p)
        elif p.is_dir():
            out += sorted(q for q in p.iterdir() if (q / "manifest.json").is_file())
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def differences(want: WantedRun, manifest: dict) -> list[str]:
    """What a run directory did differently from `want` (scenario, each parameter the lab sets, the faults)."""
    out = []
    if manifest.get("scenario") != want.scenario:
        out.append(f"scenario {manifest.get('scenario')} (lab: {want.scenario})")
    params = manifest.get("params") or {}
    for k, v in want.params.items():
        if not _same(params.get(k), v):
            out.append(f"{k}={params.get(k)} (lab: {v})")
    got = tuple(str(f) for f in (manifest.get("faults") or []))
    if len(got) != len(want.faults):
        out.append(f"{len(got)} fault(s) (lab: {len(want.faults)})")
    return out


def match_runs(wanted: list[WantedRun], paths: list[Path]) -> Matched:
    """Find each wanted run among the run directories under `paths`: by folder name, else by scenario and
    parameters."""
    found = Matched()
    cands = [(p, _manifest(p)) for p in _candidates(paths)]
    cands = [(p, m) for p, m in cands if m is not None]
    for w in wanted:
        named = [(p, m) for p, m in cands if p.name == w.name]
        if named:
            p, m = named[0]
            diff = differences(w, m)
            if diff:
                found.different[w.name] = f"{p}: " + "; ".join(diff)
            else:
                found.dirs[w.name] = p
            continue
        same = [p for p, m in cands if not differences(w, m)]
        if same:
            found.dirs[w.name] = same[0]
    return found


def _metric(path: Path, metric: str) -> float | None:
    values = summarize(load_quietly(path))
    v = values.get(metric)
    if v is None:
        return None
    x = float(v[0])
    return None if math.isnan(x) else x


def grade(expects: list[Expect], matched: Matched) -> list[Verdict]:
    """One verdict per statement."""
    out = []
    cache: dict[tuple[str, str], float | None] = {}

    def value(run: str, metric: str) -> float | None:
        if (run, metric) not in cache:
            cache[(run, metric)] = _metric(matched.dirs[run], metric)
        return cache[(run, metric)]

    for e in expects:
        runs = [e.run] + ([e.over] if e.over else [])
        diff = [matched.different[r] for r in runs if r in matched.different]
        if diff:
            out.append(Verdict(e, DIFFERENT, note="not graded, made differently: " + " | ".join(diff)))
            continue
        missing = [r for r in runs if r not in matched.dirs]
        if missing:
            out.append(Verdict(e, MISSING, note=f"no run directory for {', '.join(missing)}"))
            continue
        def of(run: str) -> float | None:
            v = value(run, e.metric)
            if v is not None and e.per:
                d = value(run, e.per)
                v = None if d is None or d == 0 else v / d
            return v

        v = of(e.run)
        if v is not None and e.over:
            d = of(e.over)
            v = None if d is None or d == 0 else v / d
        if v is None:
            names = e.metric + (f" or {e.per}" if e.per else "")
            out.append(Verdict(e, NO_VALUE, note=f"{names} is not in the run's summary or data (or divides by 0)"))
            continue
        ok = (e.min is None or v >= e.min) and (e.max is None or v <= e.max)
        out.append(Verdict(e, PASS if ok else FAIL, v, "" if ok else e.hint))
    return out


def exit_status(verdicts: list[Verdict]) -> int:
    """0: every statement passed; 1: one failed (or had no value); 3: none failed but some could not be graded
    (a run missing or made with other parameters)."""
    if any(v.status in (FAIL, NO_VALUE) for v in verdicts):
        return 1
    if any(v.status != PASS for v in verdicts):
        return 3
    return 0


__all__ = ["DIFFERENT", "Expect", "FAIL", "MISSING", "Matched", "NO_VALUE", "PASS", "Verdict", "WantedRun",
           "differences", "exit_status", "grade", "match_runs"]
