"""Repeated runs of one configuration: a *repeat folder*, read and summarized.

One run is one sample of a noisy process (a round that loses its tail waits for a 200 ms timer or does not; the
scheduler of a shared machine runs a sender late or not), so an answer comes from several runs of one
configuration with different seeds. `testbed run|sweep|audit --repeat N` and the Lab-script helper
(:mod:`testbed.commands.repeat`) write them as::

    OUT/seed-<seed>/   one normal run directory per seed (seeds seed .. seed+N-1)
    OUT/repeat.json    {"kind": "repeat", "scenario": ..., "seeds": [...], "runs": ["seed-1", ...],
                        "metrics": {name: analysis.stats.Estimate.as_dict()},
                        "unfaithful": [run names], "incomplete": [run names]}

``metrics`` holds every numeric value of the runs' ``summary.json`` (bools as 0/1) over the runs that count: a
run counts when it is *complete* (its manifest says ``complete: true``) and *faithful* (its summary does not say
``fidelity_ok: false``: the machine kept up). The others are listed by name, never averaged in: an unfaithful
run's numbers say more about this machine than about the fabric.

This module reads folders only (no testbed import): :func:`is_repeat_folder`, :func:`run_dirs`,
:func:`run_infos`, :func:`values`, :func:`metric_values`, :func:`summarize` (writes repeat.json).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .stats import estimate
from .summary import numeric

__all__ = ["REPEAT_JSON", "RunInfo", "is_repeat_folder", "metric_values", "run_dirs", "run_infos", "seed_dir",
           "summarize", "values"]

REPEAT_JSON = "repeat.json"
_SEED_DIR = re.compile(r"^seed-(\d+)$")
#: summary values that describe the run's bookkeeping, not the fabric: never a metric over repeats
NOT_METRICS = frozenset({"fidelity_ok", "seed"})


def seed_dir(seed: int) -> str:
    """The folder name of one repeat's run directory."""
    return f"seed-{seed}"


def run_dirs(path: str | Path) -> list[Path]:
    """The run directories of a repeat folder (``seed-<n>/`` holding a manifest.json), in seed order."""
    path = Path(path)
    if not path.is_dir():
        return []
    found = []
    for d in path.iterdir():
        m = _SEED_DIR.match(d.name)
        if m and d.is_dir() and (d / "manifest.json").is_file():
            found.append((int(m.group(1)), d))
    return [d for _, d in sorted(found)]


def is_repeat_folder(path: str | Path) -> bool:
    """A folder of repeats: it has repeat.json or ``seed-<n>/`` run directories, and is not itself a run directory."""
    path = Path(path)
    if not path.is_dir() or (path / "manifest.json").is_file():
        return False
    return (path / REPEAT_JSON).is_file() or bool(run_dirs(path))


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class RunInfo:
    """One repeat: its folder, seed, whether it counts (complete and faithful) and its numeric summary values."""
    path: Path
    seed: int | None
    complete: bool
    faithful: bool
    reasons: str = ""                       # why it is not faithful (summary.json's fidelity_reasons)
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def counts(self) -> bool:
        return self.complete and self.faithful


def _reasons(summary: dict) -> str:
    r = summary.get("fidelity_reasons") or ""
    return "; ".join(map(str, r)) if isinstance(r, list) else str(r)


def run_info(run_dir: str | Path) -> RunInfo:
    """Read one run directory's manifest and summary.json (an unreadable or missing summary: not complete)."""
    run_dir = Path(run_dir)
    manifest = _read_json(run_dir / "manifest.json") or {}
    summary = _read_json(run_dir / "summary.json")
    seed = manifest.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):  # a manifest without it: the folder's name says it
        m = _SEED_DIR.match(run_dir.name)
        seed = int(m.group(1)) if m else None
    complete = manifest.get("complete") is True and summary is not None
    summary = summary or {}
    faithful = summary.get("fidelity_ok") is not False
    metrics = {k: v for k, v in numeric(summary).items() if k not in NOT_METRICS}
    return RunInfo(run_dir, seed, complete, faithful, "" if faithful else _reasons(summary), metrics)


def run_infos(path: str | Path) -> list[RunInfo]:
    """Every repeat of the folder, in seed order."""
    return [run_info(d) for d in run_dirs(path)]


def metric_values(infos: list[RunInfo]) -> dict[str, list[float]]:
    """``{metric: [value per counting run]}`` in first-seen order (a run that lacks a metric adds nothing)."""
    out: dict[str, list[float]] = {}
    for info in infos:
        if not info.counts:
            continue
        for k, v in info.metrics.items():
            out.setdefault(k, []).append(v)
    return out


def values(path: str | Path, metric: str) -> list[float]:
    """One metric's values over the folder's complete, faithful runs (seed order)."""
    return metric_values(run_infos(path)).get(metric, [])


def summarize(path: str | Path, scenario: str | None = None) -> dict:
    """Write ``path/repeat.json`` (see the module docstring) from the runs' summary.json files and return it."""
    path = Path(path)
    infos = run_infos(path)
    if scenario is None:
        for d in run_dirs(path):
            scenario = (_read_json(d / "manifest.json") or {}).get("scenario")
            if scenario:
                break
    result = {
        "kind": "repeat",
        "scenario": scenario,
        "seeds": [i.seed for i in infos],
        "runs": [i.name for i in infos],
        "metrics": {k: estimate(v).as_dict() for k, v in metric_values(infos).items()},
        "unfaithful": [i.name for i in infos if i.complete and not i.faithful],
        "incomplete": [i.name for i in infos if not i.complete],
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / REPEAT_JSON).write_text(json.dumps(result, indent=2, allow_nan=True) + "\n", encoding="utf-8")
    return result
