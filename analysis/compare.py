"""Several run directories side by side: key metrics per run and each run's ratio to the first.

``compare(run_dirs, out=None) -> DataFrame`` with one row per metric:

* ``metric`` — the name; ``source`` — ``summary`` (a numeric value of ``summary.json``) or ``data``
  (recomputed from the CSVs by :func:`analysis.report.key_metrics`, e.g. ``cct_ms_p99`` with ``ops_n``);
* one column per run (the run directory's name, made unique with ``#2``, ``#3`` ... when names repeat);
* one ``<run>/<first>`` column per later run: ``value / first run's value`` (nan when either is missing or
  the first is 0 — a ratio to nothing is not a number, even when both are 0).

Rows are the union over runs, in first-seen order (summary rows first); a metric a run lacks is nan.
With ``out`` the table is also written as ``out/compare.csv`` and ``out/compare.md``.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Sequence

import pandas as pd

from .load import IncompleteRunWarning, Run, load_run
from .report import fmt, key_metrics, md_table

__all__ = ["compare", "numeric_summary", "run_labels"]


def numeric_summary(summary: dict) -> dict[str, float]:
    """The numeric values of a summary.json (bools as 0/1; strings, None, lists dropped)."""
    out: dict[str, float] = {}
    for k, v in summary.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


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
    per_run: list[dict[tuple[str, str], float]] = []
    order: list[tuple[str, str]] = []
    for r in runs:
        vals: dict[tuple[str, str], float] = {}
        for k, v in numeric_summary(r.summary).items():
            vals[("summary", k)] = v
        for k, v in key_metrics(r).items():
            vals[("data", k)] = float(v)
        per_run.append(vals)
    for src in ("summary", "data"):
        for vals in per_run:
            for key in vals:
                if key[0] == src and key not in order:
                    order.append(key)
    rows = []
    for src, metric in order:
        row: dict[str, object] = {"metric": metric, "source": src}
        values = [vals.get((src, metric), math.nan) for vals in per_run]
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

