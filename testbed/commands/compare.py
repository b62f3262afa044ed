"""`testbed compare`: the terminal side of analysis.compare.

* :func:`sides` — A and B, each a run directory or a repeat folder: one row per metric with each side's median
  and confidence interval, the ratio A/B with its interval and the verdict (analysis.stats.compare); the runs
  left out (unfaithful, incomplete) are named above the table; metrics with one value on every run (mostly the
  configuration's parameters) are listed on one line, not as rows.
* :func:`runs` — several run directories' metrics side by side with ratios to the first (no verdict: one run a
  side cannot tell a real difference from noise, and the output says so).

This module may import ``analysis``; the fabric never does.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["runs", "sides"]


def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)  # a pipe or log file: do not cut numbers


def _num(v) -> str:
    from analysis.report import fmt

    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt(v)


def _interval(median, low, high, n) -> str:
    if not n:
        return "no runs"
    if n == 1:
        return f"{_num(median)} (1 run)"
    return f"{_num(median)} [{_num(low)}, {_num(high)}]"


def _runs_to_tell(need) -> str:
    if need is None or (isinstance(need, float) and math.isnan(need)):
        return "-"
    return "> 1000 a side" if need > 1000 else f"~{int(need)} a side"


def _cv(cv) -> str:
    return "-" if cv is None or (isinstance(cv, float) and math.isnan(cv)) else f"{cv:.2f}"


def sides(a: Path, b: Path, out: str | None, level: float) -> int:
    """Print the comparison of A and B (see the module docstring); write compare.csv/.md/.png with ``out``."""
    from rich.table import Table

    from analysis.compare import compare_sides, constant_metrics

    df, sa, sb = compare_sides(a, b, out=out, level=level)
    for s in (sa, sb):
        print(s.describe())
    constant = set(constant_metrics(df, sa, sb))
    t = Table(title=f"A vs B: medians with {level:.0%} CIs, ratio A/B with its CI")
    for col, just in (("metric", "left"), ("A", "right"), ("B", "right"), ("A/B", "right"), ("verdict", "left"),
                      ("runs to tell", "right"), ("cv A", "right"), ("cv B", "right")):
        t.add_column(col, justify=just, no_wrap=col == "metric")
    for _, r in df.iterrows():
        if r["metric"] in constant:
            continue
        ratio = "-" if math.isnan(r["ratio"]) else (
            f"{_num(r['ratio'])}" + ("" if math.isnan(r["ratio_low"]) else
                                     f" [{_num(r['ratio_low'])}, {_num(r['ratio_high'])}]"))
        t.add_row(str(r["metric"]), _interval(r["A_median"], r["A_low"], r["A_high"], r["A_n"]),
                  _interval(r["B_median"], r["B_low"], r["B_high"], r["B_n"]), ratio, str(r["verdict"]),
                  _runs_to_tell(r["runs_needed"]), _cv(r["A_cv"]), _cv(r["B_cv"]))
    _console().print(t)
    if constant:
        print(f"the same on every run of both sides: {', '.join(m for m in df['metric'] if m in constant)}")
    if min(len(sa.used), len(sb.used)) < 4:
        print("fewer than 4 runs a side: no rank test can reach 95% (make repeat folders with --repeat N)")
    if out:
        for name in ("compare.csv", "compare.md", "compare_distributions.png"):
            if (Path(out) / name).exists():
                print(Path(out) / name)
    return 0


def runs(dirs: Sequence[Path], out: str | None) -> int:
    """Print several run directories' metrics side by side (analysis.compare.compare)."""
    from rich.table import Table

    from analysis.compare import compare
    from analysis.report import fmt

    df = compare(dirs, out=out)
    labels = [c for c in df.columns[2:] if "/" not in c]
    t = Table(title=f"{len(labels)} runs; x first = ratio to {labels[0]}")
    t.add_column("metric", no_wrap=True)
    t.add_column("from")
    for c in df.columns[2:]:
        t.add_column(c if "/" not in c else f"{c.split('/')[0]} x first", justify="right")
    for _, r in df.iterrows():
        cells = [fmt(r[c]) if not (isinstance(r[c], float) and math.isnan(r[c])) else "-" for c in df.columns[2:]]
        t.add_row(str(r["metric"]), str(r["source"]), *cells)
    _console().print(t)
    if len(labels) >= 2:
        print("one run a side: these ratios carry no verdict (a run is one sample of a noisy process); compare "
              "repeat folders (--repeat N) to know whether a difference is real")
    if out:
        print(Path(out) / "compare.csv")
        print(Path(out) / "compare.md")
    return 0
