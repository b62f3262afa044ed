"""Grading a classroom lab's runs against its expected outcomes (labs/*/lab.toml's ``[[expect]]`` statements), on
the evidence of repeated runs.

A statement is a band on one metric of one lab run, or on the ratio of two lab runs' values ("the p99 round time
with RTOmin 200 ms is at least 1.8x the one with 5 ms"): ``metric``, ``run``, optionally ``over`` (the ratio's
denominator run) and ``per`` (divide by another metric of the same run), ``min`` and/or ``max``. The metric is what
:func:`analysis.summary.summarize` gives for a run directory, so a statement means what the report and ``testbed
compare`` show.

A lab run is a *repeat folder* (``RUN/seed-<seed>/`` run directories, ``RUN/repeat.json``: :mod:`analysis.evidence`)
or, as before repeats, one run directory. A statement grades the distribution, with :mod:`analysis.stats`:

* on one run's metric: ``min`` means "the median is at least min with 95% confidence": the one-sided 95% lower
  bound of the median (the low end of its distribution-free 90% interval, :func:`analysis.stats.estimate`) is
  ``>= min``; ``max`` likewise with the upper bound. With 5 runs that bound is the smallest run (its coverage,
  1 - 2^-5 = 96.9%); with 4 or fewer no bound reaches 95% and the check says ``not enough evidence``;
* on a ratio (``over``): :func:`analysis.stats.compare` of A against B scaled by the bound: ``min`` holds when A >
  min x B (the ratio's 95% interval lies above min *and* the Mann-Whitney test rejects "same distribution" at 5%),
  ``max`` when A < max x B. The rank test needs 4 runs a side to reach 5%; a ``min`` of 0 on a ratio of
  non-negative metrics holds by itself.

Each check is ``pass``, ``FAIL`` (the evidence lies on the wrong side of the bound, with the same confidence) or
``not enough evidence`` (n runs; with about how many runs would tell, where analysis.stats can say). Nothing is
re-run. Only complete and faithful runs (manifest ``complete``, summary ``fidelity_ok`` not false) are graded; the
others are listed with the verdicts. A lab run of one run directory (an old hand-in, or ``--repeat 1``) is still
graded on its one value, marked ``1 run``.

Run folders are matched to the lab's runs by folder name (``<lab out>/<run name>/``), else by scenario and
parameters. A run made with other parameters or faults than the lab asks for is reported as such and not graded:
its numbers answer another question. This module reads run folders only."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import stats
from .evidence import Evidence, candidates, evidence_of, manifest_of

PASS, FAIL, UNSURE, MISSING, DIFFERENT, NO_VALUE = ("pass", "FAIL", "not enough evidence", "missing", "different",
                                                   "no value")
#: the one-sided confidence of a statement on one run's metric: the two-sided interval at 1 - 2 x (1 - 0.95)
ONE_SIDED = 0.95


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

    def runs(self) -> list[str]:
        return [self.run] + ([self.over] if self.over else [])


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
    value: float | None = None  # the median (a ratio: of medians; 1 run: its value)
    low: float | None = None  # the value's confidence bounds, where there are repeats
    high: float | None = None
    runs: str = ""  # "5 runs", "5 vs 5 runs", "1 run"
    note: str = ""

    @property
    def label(self) -> str:
        """The status as printed: ``not enough evidence (3 runs)``."""
        return f"{self.status} ({self.runs})" if self.status == UNSURE and self.runs else self.status


@dataclass
class Matched:
    """Lab run name -> its folder (a run directory or a repeat folder); runs found but made differently -> why."""

    dirs: dict[str, Path] = field(default_factory=dict)
    different: dict[str, str] = field(default_factory=dict)


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


def _folder_differences(want: WantedRun, folder: Path) -> list[str]:
    """A folder's differences from `want`: of its run directory, or of any run of a repeat folder."""
    for run in evidence_of(folder).runs:
        diff = differences(want, manifest_of(run.path) or {})
        if diff:
            return diff
    return []


def match_runs(wanted: list[WantedRun], paths: list[Path]) -> Matched:
    """Find each wanted run among the run directories and repeat folders under `paths`: by folder name, else by
    scenario and parameters."""
    found = Matched()
    cands = candidates(paths)
    for w in wanted:
        named = [p for p in cands if p.name == w.name]
        if named:
            diff = _folder_differences(w, named[0])
            if diff:
                found.different[w.name] = f"{named[0]}: " + "; ".join(diff)
            else:
                found.dirs[w.name] = named[0]
            continue
        same = [p for p in cands if not _folder_differences(w, p)]
        if same:
            found.dirs[w.name] = same[0]
    return found


def _values(ev: Evidence, e: Expect) -> list[float]:
    """The statement's metric (over ``per``) in each graded run of one lab run."""
    out = []
    for run in ev.graded:
        v = run.metric(e.metric)
        if v is not None and e.per:
            d = run.metric(e.per)
            v = None if d is None or d == 0 else v / d
        if v is not None:
            out.append(v)
    return out


def _one_value(e: Expect, a: list[float], b: list[float] | None) -> Verdict:
    """The old grading, on one run a side: the value (or ratio) against the band."""
    v = a[0] if b is None else (None if b[0] == 0 else a[0] / b[0])
    if v is None:
        return Verdict(e, NO_VALUE, runs="1 run", note=f"{e.per or e.metric} of {e.over} is 0: no ratio")
    ok = (e.min is None or v >= e.min) and (e.max is None or v <= e.max)
    return Verdict(e, PASS if ok else FAIL, v, runs="1 run", note="" if ok else e.hint)


def _combine(parts: list[str]) -> str:
    return FAIL if FAIL in parts else PASS if all(p == PASS for p in parts) else UNSURE


def _on_one_run(e: Expect, a: list[float]) -> Verdict:
    """min / max on the median of one lab run's repeats, at one-sided 95% (module docstring)."""
    est = stats.estimate(a, level=1 - 2 * (1 - ONE_SIDED))
    enough = est.coverage >= 1 - 2 * (1 - ONE_SIDED) - 1e-12
    parts = []
    if e.min is not None:
        parts.append(PASS if est.low >= e.min else FAIL if est.high < e.min else UNSURE)
    if e.max is not None:
        parts.append(PASS if est.high <= e.max else FAIL if est.low > e.max else UNSURE)
    status = _combine(parts) if enough else UNSURE
    note = "" if enough else f"{est.n} runs give a median bound of {est.coverage / 2 + 0.5:.1%} one-sided (5 needed)"
    if status == FAIL:
        note = e.hint
    return Verdict(e, status, est.median, est.low, est.high, f"{est.n} run" + ("s" if est.n != 1 else ""), note)


def _on_a_ratio(e: Expect, a: list[float], b: list[float]) -> Verdict:
    """min / max on the ratio of two lab runs' medians: analysis.stats.compare against the scaled bound."""
    shown = stats.compare(a, b)
    parts, need = [], []
    for bound, above in ((e.min, True), (e.max, False)):
        if bound is None:
            continue
        if above and bound <= 0 and min(a + b) >= 0:
            parts.append(PASS)
            continue
        d = stats.compare(a, [bound * x for x in b])
        holds, breaks = ("A > B", "A < B") if above else ("A < B", "A > B")
        parts.append(PASS if d.verdict == holds else FAIL if d.verdict == breaks else UNSURE)
        if d.runs_needed:
            need.append(d.runs_needed)
    status = _combine(parts)
    runs = f"{len(a)} run" + ("s" if len(a) != 1 else "") if len(a) == len(b) else f"{len(a)} vs {len(b)} runs"
    note = e.hint if status == FAIL else ""
    if status == UNSURE:
        note = f"p = {shown.p_value:.2g}" + (f"; about {max(need)} runs a side would tell" if need else "")
    return Verdict(e, status, shown.ratio, shown.ratio_low, shown.ratio_high, runs, note)


def grade_one(e: Expect, evidence: dict[str, Evidence]) -> Verdict:
    """One statement against the lab runs' evidence (each a graded set of runs)."""
    a = _values(evidence[e.run], e)
    b = _values(evidence[e.over], e) if e.over else None
    if not a or (b is not None and not b):
        some = [r for r in e.runs() if evidence[r].graded]
        if len(some) < len(e.runs()):
            bad = "; ".join(evidence[r].describe() for r in e.runs() if not evidence[r].graded)
            return Verdict(e, UNSURE, runs="0 runs", note=f"no complete, faithful run: {bad}")
        names = e.metric + (f" or {e.per}" if e.per else "")
        return Verdict(e, NO_VALUE, note=f"{names} is not in the runs' summary or data (or divides by 0)")
    single = all(not evidence[r].repeat or len(evidence[r].runs) == 1 for r in e.runs())  # made as 1 run
    if single and len(a) == 1 and (b is None or len(b) == 1):
        return _one_value(e, a, b)
    return _on_one_run(e, a) if b is None else _on_a_ratio(e, a, b)


def grade(expects: list[Expect], matched: Matched) -> list[Verdict]:
    """One verdict per statement."""
    evidence = {name: evidence_of(path) for name, path in matched.dirs.items()}
    out = []
    for e in expects:
        diff = [matched.different[r] for r in e.runs() if r in matched.different]
        if diff:
            out.append(Verdict(e, DIFFERENT, note="not graded, made differently: " + " | ".join(diff)))
            continue
        missing = [r for r in e.runs() if r not in matched.dirs]
        if missing:
            out.append(Verdict(e, MISSING, note=f"no run directory for {', '.join(missing)}"))
            continue
        out.append(grade_one(e, evidence))
    return out


def exit_status(verdicts: list[Verdict]) -> int:
    """0: every statement passed; 1: one failed (or had no value); 3: none failed but some could not be graded
    (a run missing or made with other parameters, or not enough evidence)."""
    if any(v.status in (FAIL, NO_VALUE) for v in verdicts):
        return 1
    if any(v.status != PASS for v in verdicts):
        return 3
    return 0


__all__ = ["DIFFERENT", "Expect", "FAIL", "MISSING", "Matched", "NO_VALUE", "PASS", "UNSURE", "Verdict",
           "WantedRun", "differences", "exit_status", "grade", "grade_one", "match_runs"]
