"""The runs behind one lab run: one run directory, or a repeat folder of several (``testbed run --repeat N``,
``testbed lab run``), and which of them may be graded.

A repeat folder (the layout analysis.repeats owns; read here so that grading keeps to it)::

    RUN/seed-<seed>/   one run directory per seed (seeds seed .. seed+N-1)
    RUN/repeat.json    {"kind": "repeat", "scenario", "seeds", "runs": ["seed-1", ...],
                        "metrics": {name: {median, low, high, n, cv, coverage}}, "unfaithful": [...],
                        "incomplete": [...]}

A run is graded only when it is *complete* (its manifest says so: it ran to the end) and *faithful* (its summary's
``fidelity_ok`` is not false: the emulation kept up, analysis.fidelity); the others are reported, never averaged
in. This module reads run folders only (and writes repeat.json)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from . import repeats
from .summary import load_quietly, summarize

__all__ = ["Evidence", "RunInfo", "candidates", "evidence_of", "is_repeat_folder", "manifest_of", "run_dirs",
           "write_repeat_json"]

def _json(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def manifest_of(run: Path) -> dict | None:
    return _json(run / "manifest.json")


def run_dirs(folder: Path) -> list[Path]:
    """A repeat folder's run directories, in seed order (the layout is analysis.repeats')."""
    return repeats.run_dirs(folder)


def is_repeat_folder(path: Path) -> bool:
    return repeats.is_repeat_folder(path) and bool(repeats.run_dirs(path))


def candidates(paths: list[Path]) -> list[Path]:
    """Lab-run folders among `paths`: each path itself when it is a run directory or a repeat folder, else its
    sub-folders that are."""
    out: list[Path] = []
    for p in paths:
        if (p / "manifest.json").is_file() or is_repeat_folder(p):
            out.append(p)
        elif p.is_dir():
            out += sorted(q for q in p.iterdir() if (q / "manifest.json").is_file() or is_repeat_folder(q))
    return out


@dataclass
class RunInfo:
    """One run directory: whether it ran to the end, whether it was faithful, its metrics (computed once)."""

    path: Path
    complete: bool
    fidelity_ok: bool | None  # None: the run does not say
    _values: dict | None = field(default=None, repr=False)

    @classmethod
    def read(cls, path: Path) -> RunInfo:
        summary = _json(path / "summary.json") or {}
        fid = summary.get("fidelity_ok")
        return cls(path, (manifest_of(path) or {}).get("complete") is True, None if fid is None else bool(fid))

    @property
    def graded(self) -> bool:
        return self.complete and self.fidelity_ok is not False

    def metrics(self) -> dict[str, float]:
        if self._values is None:
            vals = summarize(load_quietly(self.path))
            self._values = {k: float(v[0]) for k, v in vals.items() if not math.isnan(float(v[0]))}
        return self._values

    def metric(self, name: str) -> float | None:
        return self.metrics().get(name)


@dataclass
class Evidence:
    """The runs of one lab run: a repeat folder's (``repeat``) or one run directory's."""

    path: Path
    repeat: bool
    runs: list[RunInfo]

    @property
    def graded(self) -> list[RunInfo]:
        return [r for r in self.runs if r.graded]

    def describe(self) -> str:
        """``rto200: 5 runs, complete 5/5, fidelity_ok 4/5 (seed-3 unfaithful: not graded)``."""
        n = len(self.runs)
        done = sum(r.complete for r in self.runs)
        fid = sum(r.fidelity_ok is not False for r in self.runs)
        left = [f"{r.path.name} {'incomplete' if not r.complete else 'unfaithful'}" for r in self.runs
                if not r.graded]
        text = f"{self.path.name}: {n} run{'s' if n != 1 else ''}, complete {done}/{n}, fidelity_ok {fid}/{n}"
        return text + (f" ({', '.join(left)}: not graded)" if left else "")


def evidence_of(path: Path) -> Evidence:
    if (path / "manifest.json").is_file():
        return Evidence(path, False, [RunInfo.read(path)])
    return Evidence(path, True, [RunInfo.read(p) for p in run_dirs(path)])


def write_repeat_json(folder: Path, scenario: str, seeds: list[int]) -> dict:
    """Summarize a repeat folder's runs into ``repeat.json`` (analysis.repeats.summarize: every metric over the
    complete, faithful runs as its median with a 95% interval; the other runs named)."""
    doc = repeats.summarize(folder, scenario)
    if list(seeds) != doc["seeds"]:  # seeds asked for whose run left no folder (it failed before writing one)
        doc["seeds"] = list(seeds)
        (folder / repeats.REPEAT_JSON).write_text(json.dumps(doc, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    return doc
