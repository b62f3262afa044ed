"""Several run directories side by side: each run's metrics and each run's ratio to the first.

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
from pathlib import Path
from typing import Sequence

import pandas as pd

from .load import IncompleteRunWarning, Run, load_run
from .report import fmt, md_table
from .summary import numeric as numeric_summary
from .summary import summarize

__all__ = ["compare", "numeric_summary", "run_labels"]


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

