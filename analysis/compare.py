"""Runs side by side, and two sets of runs compared with their uncertainty.

Two questions, two functions:

* :func:`compare_sides` (``testbed compare A B`` when a side is a repeat folder, :mod:`analysis.repeats`): is A
  different from B? Per metric each side's median with its confidence interval, the ratio with its interval, and
  the verdict of :func:`analysis.stats.compare` (``A > B``, ``A < B``, ``not distinguishable (n runs)`` with about
  how many runs would tell); unfaithful and incomplete runs are named and left out; the distributions are drawn
  (compare_distributions.png). One number a side cannot say whether a difference is real.
* :func:`compare`: several run directories' numbers in one table, each with its ratio to the first (no verdict).

Both lead with what differs (the vocabulary of :mod:`analysis.changes`): :func:`param_diff` lists every parameter
(manifest ``params``, text ones included: ``cc``, ``discipline``, ...), the scenario and where the runs ran (host or
lab VM, kernel, commit) whose value is not the same on every side; rows are ordered by the size of the change
(:func:`change_order`: verdicts first, then ``|log ratio|``, a change from or to 0 counting as the largest, rows that
only echo a parameter last); a change from or to 0 reads ``0 -> 664 (new)`` / ``664 -> 0 (gone)``
(:func:`change_text`), never a ratio ``-``. With ``out`` both also write compare.html
(:mod:`analysis.comparepage`: the verdicts, then the pictures).

``compare(run_dirs, out=None) -> DataFrame`` with one row per metric (one value per run, the same value the
run's report shows: :func:`analysis.summary.summarize`):

* ``metric`` — the name; ``source`` — ``data`` (recomputed from the CSVs by :mod:`analysis.summary`, e.g.
  ``cct_ms_p99`` with ``cct_samples``; a summary.json value of the same name is the same number, or stale) or
  ``summary`` (a numeric ``summary.json`` value no file supports, bools as 0/1);
* one column per run (the run directory's name, made unique with ``#2``, ``#3`` ... when names repeat);
* one ``<run>/<first>`` column per later run: ``value / first run's value`` (nan when either is missing or
  the first is 0 — a ratio to nothing is not a number, even when both are 0).

Rows are the union over runs, ordered by the largest change of any run against the first (:func:`change_order`);
a metric a run lacks is nan. A metric that is ``data`` in one run and ``summary`` in another is one row (``source``
says ``data``). With ``out`` the table is also written as ``out/compare.csv``, ``out/compare.md`` and
``out/compare.html``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd

from . import stats
from .changes import (change_order, change_size, change_text, is_machine_metric, param_diff, param_names,
                      param_texts)
from .load import IncompleteRunWarning, Run, RunDirError, load_run
from .repeats import NOT_METRICS, is_repeat_folder, run_dirs, run_info
from .render import fmt
from .stats import LEVEL
from .stripplot import plot_distributions
from .summary import HEADLINE, load_quietly, summarize
from .summary import numeric as numeric_summary

__all__ = ["Side", "change_order", "change_text", "compare", "compare_sides", "constant_metrics", "load_side",
           "numeric_summary", "param_diff", "param_texts", "run_labels", "write_sides"]


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
    rows, sizes = [], []
    for src, metric in order:
        row: dict[str, object] = {"metric": metric, "source": src}
        values = [vals[metric][0] if metric in vals else math.nan for vals in per_run]
        for lab, v in zip(labels, values):
            row[lab] = v
        for lab, v in zip(labels[1:], values[1:]):
            row[f"{lab}/{labels[0]}"] = _ratio(v, values[0])
        rows.append(row)
        known = [x for x in (change_size(values[0], v) for v in values[1:]) if not math.isnan(x)]
        sizes.append(max(known) if known else math.nan)
    params = param_names([r.manifest for r in runs])
    rows = [rows[i] for i in change_order(sizes, echoes=[r["metric"] in params for r in rows],
                                          machine=[is_machine_metric(r["metric"]) for r in rows])]
    cols = ["metric", "source", *labels, *[f"{lab}/{labels[0]}" for lab in labels[1:]]]
    df = pd.DataFrame(rows, columns=cols)
    for c in cols[2:]:
        df[c] = df[c].astype(float)
    if out is not None:
        write_compare(df, runs, labels, out)
    return df


def write_compare(df: pd.DataFrame, runs: Sequence[Run], labels: Sequence[str], out: str | Path
                  ) -> tuple[Path, Path, Path]:
    """Write ``compare.csv``, ``compare.md`` and ``compare.html`` (:func:`analysis.comparepage.runs_page`: what
    differs, the largest changes, the runs' samples as overlaid CDFs) into ``out``; returns their paths."""
    from .comparepage import run_samples, runs_page

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "compare.csv"
    df.to_csv(csv_path, index=False)
    html_path, md_path = runs_page(df, runs, labels, [run_samples(r) for r in runs],
                                   param_diff([[param_texts(r.manifest)] for r in runs]), run_changes(df), out,
                                   param_names([r.manifest for r in runs]))
    return csv_path, md_path, html_path


def run_changes(df: pd.DataFrame) -> dict[str, list[str]]:
    """``{metric: [change text per later run]}`` of a :func:`compare` table: the ratio to the first run, or the
    change from or to 0 (:func:`change_text`)."""
    labels = [c for c in df.columns[2:] if "/" not in c]
    out = {}
    for _, r in df.iterrows():
        out[r["metric"]] = [change_text(r[labels[0]], r[lab], fmt(r[f"{lab}/{labels[0]}"])) for lab in labels[1:]]
    return out


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
    params: list[dict[str, str]] = field(default_factory=list)   # param_texts of each counting run
    samples: dict[str, list[float]] = field(default_factory=dict)  # comparepage.run_samples, pooled over runs
    ports: list[str] = field(default_factory=list)  # each counting run's busiest port (the backlog samples')
    trace: object = None  # the first counting run's comparepage.RunSamples (its busiest port over time)
    trace_run: str = ""  # and that run's name

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
    from .comparepage import run_samples

    infos = [run_info(d) for d in dirs]
    values: dict[str, list[float]] = {}
    samples: dict[str, list[float]] = {}
    scenario, params, ports, trace, trace_run = "?", [], [], None, ""
    for info in infos:
        if not info.counts:
            continue
        run = load_quietly(info.path)
        scenario = run.manifest.get("scenario", scenario)
        params.append(param_texts(run.manifest))
        for k, (v, _src) in summarize(run).items():
            if k not in NOT_METRICS:
                values.setdefault(k, []).append(v)
        got = run_samples(run)
        for k, v in got.samples.items():
            samples.setdefault(k, []).extend(v)
        ports += [got.port] if got.port else []
        if trace is None:
            trace, trace_run = got, info.name
    return Side(label, path, repeat, [i.name for i in infos], [i.name for i in infos if i.counts],
                [(i.name, i.reasons) for i in infos if i.complete and not i.faithful],
                [i.name for i in infos if not i.complete], values, scenario, params, samples, ports, trace,
                trace_run)


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
                   verdict=d.verdict, runs_needed=d.runs_needed, change=change_text(d.a.median, d.b.median))
        rows.append(row)
    echoes = param_names([{"params": p} for p in a.params + b.params])
    order = change_order([change_size(r[f"{labels[0]}_median"], r[f"{labels[1]}_median"]) for r in rows],
                         told=[r["verdict"] in ("A > B", "A < B") for r in rows],
                         echoes=[r["metric"] in echoes for r in rows],
                         machine=[is_machine_metric(r["metric"]) for r in rows])
    cols = ["metric", *[f"{s}_{k}" for s in labels for k in _SIDE_COLUMNS], "ratio", "ratio_low", "ratio_high",
            "p_value", "verdict", "runs_needed", "change"]
    df = pd.DataFrame([rows[i] for i in order], columns=cols)
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
    """compare.csv, compare.html and compare.md (:func:`analysis.comparepage.sides_page`), and, when a side has
    repeats, compare_distributions.png (the metrics with a verdict first, then the headline ones) in ``out``."""
    from .comparepage import sides_page

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "compare.csv"]
    df.to_csv(paths[0], index=False)
    constant = set(constant_metrics(df, a, b))  # one value on every run: nothing to draw
    echoes = param_names([{"params": p} for p in a.params + b.params]) & set(df["metric"])
    png = None
    if a.repeat or b.repeat:
        drawn = [m for m in df["metric"] if m not in constant | echoes and (a.values.get(m) or b.values.get(m))]
        told = set(df.loc[df["verdict"].isin(("A > B", "A < B")), "metric"])
        panels, seen = [], set()
        for m in dict.fromkeys([m for m in drawn if m in told] + [m for m in HEADLINE if m in drawn] + drawn):
            same = (tuple(a.values.get(m, [])), tuple(b.values.get(m, [])))  # goodput_mbps = round_goodput_mbps
            if same not in seen:
                seen.add(same)
                panels.append(m)
        verdicts = dict(zip(df["metric"], df["verdict"]))
        png = plot_distributions({m: {a.label: a.values.get(m, []), b.label: b.values.get(m, [])}
                                  for m in panels[:PLOT_PANELS]},
                                 out / "compare_distributions.png", verdicts=verdicts,
                                 title=f"{a.label} = {a.path.name}, {b.label} = {b.path.name}")
    diff = param_diff([a.params, b.params])
    html_path, md_path = sides_page(df, a, b, diff, out, level, constant=constant, echoes=echoes,
                                    distributions=png)
    return paths + [md_path, html_path] + ([png] if png else [])
