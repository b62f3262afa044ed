"""Runs side by side, and two sets of runs compared with their uncertainty.

Two questions, two functions:

* :func:`compare_sides` (``testbed compare A B`` when a side is a repeat folder, :mod:`analysis.repeats`): is A
  different from B? Per metric each side's median with its confidence interval, the ratio with its interval, and
  the verdict of :func:`analysis.stats.compare` (``A > B``, ``A < B``, ``not distinguishable (n runs)`` with about
  how many runs would tell); unfaithful and incomplete runs are named and left out; the distributions are drawn
  (compare_distributions.png). One number a side cannot say whether a difference is real.
* :func:`compare`: several run directories' numbers in one table, each with its ratio to the first (no verdict).

``compare(run_dirs, out=None) -> DataFrame`` with one row per metric (one value per run, the same value the
run's report shows: :func:`analysis.summary.summarize`):

* ``metric`` — the name; ``source`` — ``data`` (recomputed from the CSVs by :mod:`analysis.summary`, e.g.
  ``cct_ms_p99`` with ``cct_samples``; a summary.json value of the same name is the same number, or stale) or
  ``summary`` (a numeric ``summary.json`` value no file supports, bools as 0/1);
* one column per run (the run directory's name, made unique with ``#2``, ``#3`` ... when names repeat);
* one ``<run>/<first>`` column per later run: ``value / first run's value`` (nan when either is missing or
  the first is 0 — a ratio to nothing is not a number, even when both are 0).

Rows are the union over runs, in first-seen order (summary rows first); a metric a run lacks is nan. A metric
that is ``data`` in one run and ``summary`` in another is one row (``source`` says ``data``).
With ``out`` the table is also written as ``out/compare.csv`` and ``out/compare.md``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from . import stats
from .load import IncompleteRunWarning, Run, RunDirError, load_run
from .repeats import NOT_METRICS, is_repeat_folder, run_dirs, run_info
from .report import fmt, md_table
from .stats import LEVEL
from .stripplot import plot_distributions
from .summary import HEADLINE, load_quietly, summarize
from .summary import numeric as numeric_summary

__all__ = ["Side", "compare", "compare_sides", "constant_metrics", "load_side", "numeric_summary", "run_labels",
           "write_sides"]


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Column labels: the folder names, made unique (``name``, ``name#2`` ...)."""
    seen: dict[str, int] = {}
    labels = []
    for r in runs:
        base = r.name or str(r.path)
        seen[base] = seen.get(base, 0) + 1
        labels.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return labels


def _ratio(v: float, base: float) -> float:
    if v is None or base is None or math.isnan(v) or math.isnan(base) or base == 0:
        return math.nan
    return v / base


def compare(run_dirs: Sequence[str | Path], out: str | Path | None = None) -> pd.DataFrame:
    """Side-by-side key metrics of ``run_dirs`` with ratios to the first; see the module docstring."""
    if not run_dirs:
        raise ValueError("compare needs at least one run directory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteRunWarning)
        runs = [load_run(p) for p in run_dirs]
    labels = run_labels(runs)
    per_run = [summarize(r) for r in runs]
    source = {}
    for vals in per_run:
        for k, (_v, src) in vals.items():
            if source.get(k) != "data":
                source[k] = src
    order: list[tuple[str, str]] = []
    for src in ("summary", "data"):
        for vals in per_run:
            for k in vals:
                if source[k] == src and (src, k) not in order:
                    order.append((src, k))
    rows = []
    for src, metric in order:
        row: dict[str, object] = {"metric": metric, "source": src}
        values = [vals[metric][0] if metric in vals else math.nan for vals in per_run]
        for lab, v in zip(labels, values):
            row[lab] = v
        for lab, v in zip(labels[1:], values[1:]):
            row[f"{lab}/{labels[0]}"] = _ratio(v, values[0])
        rows.append(row)
    cols = ["metric", "source", *labels, *[f"{lab}/{labels[0]}" for lab in labels[1:]]]
    df = pd.DataFrame(rows, columns=cols)
    for c in cols[2:]:
        df[c] = df[c].astype(float)
    if out is not None:
        write_compare(df, runs, labels, out)
    return df


def write_compare(df: pd.DataFrame, runs: Sequence[Run], labels: Sequence[str], out: str | Path
                  ) -> tuple[Path, Path]:
    """Write ``compare.csv`` and ``compare.md`` into ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out / "compare.csv", out / "compare.md"
    df.to_csv(csv_path, index=False)
    lines = ["# Run comparison", "", "| label | run directory | scenario | complete |", "|---|---|---|---|"]
    for lab, r in zip(labels, runs):
        lines.append(f"| {lab} | {r.path} | {r.manifest.get('scenario', '?')} | {fmt(r.complete)} |")
    lines += ["", f"Ratios are each run's value divided by the first run's ({labels[0]}); `-` where either "
              "value is missing or the first is 0.", "", md_table(df), ""]
    md_path.write_text("\n".join(lines), encoding="utf-8")
    return csv_path, md_path



# --------------------------------------------------------------------------- two sides, each one run or repeats

#: the most metrics drawn in compare_distributions.png (the headline ones first)
PLOT_PANELS = 9
_SIDE_COLUMNS = ("n", "median", "low", "high", "cv")


@dataclass
class Side:
    """One side of a comparison: a run directory (one run) or a repeat folder (its runs); ``values`` holds each
    metric over the runs that count (complete and faithful), the others are named in ``unfaithful`` (with why)
    and ``incomplete``."""
    label: str
    path: Path
    repeat: bool
    runs: list[str]
    used: list[str]
    unfaithful: list[tuple[str, str]]
    incomplete: list[str]
    values: dict[str, list[float]]
    scenario: str = "?"

    def describe(self) -> str:
        what = f"repeat folder, {len(self.runs)} runs" if self.repeat else "one run"
        out = f"{self.label} = {self.path} ({self.scenario}; {what}; {len(self.used)} counted)"
        if self.unfaithful:
            out += "; NOT FAITHFUL, left out: " + ", ".join(f"{n} ({why or 'see its fidelity.csv'})"
                                                             for n, why in self.unfaithful)
        if self.incomplete:
            out += "; INCOMPLETE, left out: " + ", ".join(self.incomplete)
        return out


def load_side(path: str | Path, label: str) -> Side:
    """Read one side (RunDirError, one line, when a run cannot be read). Each counting run's metrics are
    :func:`analysis.summary.summarize`'s: the same values its report shows (recomputed from its files)."""
    path = Path(path)
    repeat = is_repeat_folder(path)
    if repeat:
        dirs = run_dirs(path)
        if not dirs:
            raise RunDirError(f"a repeat folder without runs (no seed-N/ run directories): {path}")
    else:
        load_quietly(path)  # a run directory that cannot be read says so here
        dirs = [path]
    infos = [run_info(d) for d in dirs]
    values: dict[str, list[float]] = {}
    scenario = "?"
    for info in infos:
        if not info.counts:
            continue
        run = load_quietly(info.path)
        scenario = run.manifest.get("scenario", scenario)
        for k, (v, _src) in summarize(run).items():
            if k not in NOT_METRICS:
                values.setdefault(k, []).append(v)
    return Side(label, path, repeat, [i.name for i in infos], [i.name for i in infos if i.counts],
                [(i.name, i.reasons) for i in infos if i.complete and not i.faithful],
                [i.name for i in infos if not i.complete], values, scenario)


def _metric_order(a: Side, b: Side) -> list[str]:
    names = list(dict.fromkeys([*a.values, *b.values]))
    head = [m for m in HEADLINE if m in names]
    return head + [m for m in names if m not in head]


def compare_sides(a_path: str | Path, b_path: str | Path, out: str | Path | None = None, level: float = LEVEL,
                  labels: tuple[str, str] = ("A", "B")) -> tuple[pd.DataFrame, Side, Side]:
    """Is A different from B, metric by metric? One row per metric (headline metrics first): each side's
    ``<side>_n/median/low/high/cv`` (:func:`analysis.stats.estimate`), ``ratio`` = median A / median B with its
    bootstrap interval ``ratio_low/high``, the rank test's ``p_value``, the ``verdict`` (``A > B``, ``A < B``,
    ``not distinguishable (n runs)``, ``no runs``) and ``runs_needed`` where it cannot tell.
    With ``out``: compare.csv, compare.md and, when a side has repeats, compare_distributions.png."""
    a, b = load_side(a_path, labels[0]), load_side(b_path, labels[1])
    rows = []
    for metric in _metric_order(a, b):
        d = stats.compare(a.values.get(metric, []), b.values.get(metric, []), level)
        row: dict[str, object] = {"metric": metric}
        for side, e in ((labels[0], d.a), (labels[1], d.b)):
            row.update({f"{side}_{k}": getattr(e, k) for k in _SIDE_COLUMNS})
        row.update(ratio=d.ratio, ratio_low=d.ratio_low, ratio_high=d.ratio_high, p_value=d.p_value,
                   verdict=d.verdict, runs_needed=d.runs_needed)
        rows.append(row)
    cols = ["metric", *[f"{s}_{k}" for s in labels for k in _SIDE_COLUMNS], "ratio", "ratio_low", "ratio_high",
            "p_value", "verdict", "runs_needed"]
    df = pd.DataFrame(rows, columns=cols)
    if out is not None:
        write_sides(df, a, b, out, level)
    return df, a, b


def constant_metrics(df: pd.DataFrame, a: Side, b: Side) -> list[str]:
    """Metrics with one value on every run of both sides (the configuration's parameters, mostly)."""
    out = []
    for metric in df["metric"]:
        vals = a.values.get(metric, []) + b.values.get(metric, [])
        if len(vals) >= 2 and len(set(vals)) == 1:
            out.append(metric)
    return out


def write_sides(df: pd.DataFrame, a: Side, b: Side, out: str | Path, level: float = LEVEL) -> list[Path]:
    """compare.csv, compare.md and (a side with repeats) compare_distributions.png in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "compare.csv", out / "compare.md"]
    df.to_csv(paths[0], index=False)
    lines = ["# Comparison", "", f"- {a.describe()}", f"- {b.describe()}", "",
             f"Each side: the median over its runs with a {level:.0%} confidence interval (distribution-free; with "
             "few runs it is [min, max] and its real coverage is lower), n runs and the coefficient of variation. "
             f"`ratio` = median {a.label} / median {b.label} with a bootstrap interval. A verdict is stated only "
             "when a Mann-Whitney U test rejects \"same distribution\" and the ratio's interval excludes 1; "
             "`runs_needed` is about how many runs a side would tell a difference of the size seen. "
             "See docs/analysis.md.", ""]
    if a.repeat or b.repeat:
        constant = set(constant_metrics(df, a, b))  # one value on every run: nothing to draw
        drawn = [m for m in df["metric"] if m not in constant and (a.values.get(m) or b.values.get(m))]
        panels = ([m for m in drawn if m in HEADLINE] + [m for m in drawn if m not in HEADLINE])[:PLOT_PANELS]
        verdicts = dict(zip(df["metric"], df["verdict"]))
        png = plot_distributions({m: {a.label: a.values.get(m, []), b.label: b.values.get(m, [])} for m in panels},
                                 out / "compare_distributions.png", verdicts=verdicts,
                                 title=f"{a.label} = {a.path.name}, {b.label} = {b.path.name}")
        paths.append(png)
        lines += [f"![distributions]({png.name})", ""]
    lines += [md_table(df), ""]
    paths[1].write_text("\n".join(lines), encoding="utf-8")
    return paths
