"""`testbed compare`: the terminal side of analysis.compare.

* :func:`sides` — A and B, each a run directory or a repeat folder: first the configuration values that differ
  (text parameters included), then one row per metric with each side's median and confidence interval, the ratio
  A/B with its interval (or the change from or to 0) and the verdict (analysis.stats.compare), rows with a verdict
  first, then by the size of the change; the runs left out (unfaithful, incomplete) are named above the table;
  metrics with one value on every run (mostly the configuration's parameters) are listed on one line, not as rows.
* :func:`runs` — several run directories' metrics side by side with ratios to the first, ordered the same way (no
  verdict: one run a side cannot tell a real difference from noise, and the output says so).

The rows' text is analysis.comparepage's, so the terminal, compare.md and compare.html read alike.
This module may import ``analysis``; the fabric never does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

__all__ = ["runs", "sides"]


def _console():
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)  # a pipe or log file: do not cut numbers


def _print_table(df, title: str, left: Sequence[str]) -> None:
    from rich.table import Table

    t = Table(title=title)
    for col in df.columns:
        t.add_column(str(col), justify="left" if col in left else "right", no_wrap=col == "metric")
    for rec in df.itertuples(index=False):
        t.add_row(*[str(v) for v in rec])
    _console().print(t)


def _print_diff(diff, labels: Sequence[str]) -> None:
    if not diff:
        print("what differs: nothing in the configuration (scenario, parameters, host or lab VM, kernel, commit)")
        return
    width = max(len(name) for name, _ in diff)
    print("what differs (" + " | ".join(labels) + "):")
    for name, texts in diff:
        print(f"  {name:<{width}}  " + " | ".join(texts))


def _print_paths(out: str | None) -> None:
    if out:
        for name in ("compare.html", "compare.csv", "compare.md", "compare_distributions.png"):
            if (Path(out) / name).exists():
                print(Path(out) / name)


def sides(a: Path, b: Path, out: str | None, level: float) -> int:
    """Print the comparison of A and B (see the module docstring); write compare.html/.csv/.md/.png with ``out``."""
    from analysis.compare import compare_sides, constant_metrics, param_diff
    from analysis.comparepage import sides_table

    df, sa, sb = compare_sides(a, b, out=out, level=level)
    for s in (sa, sb):
        print(s.describe())
    _print_diff(param_diff([sa.params, sb.params]), [sa.label, sb.label])
    constant = set(constant_metrics(df, sa, sb))
    _print_table(sides_table(df, constant), f"A vs B: medians with {level:.0%} CIs, ratio A/B with its CI; "
                 "verdicts first, then the largest change", ("metric", "verdict"))
    if constant:
        print(f"the same on every run of both sides: {', '.join(m for m in df['metric'] if m in constant)}")
    fewest = min(len(sa.used), len(sb.used))
    if fewest <= 1:
        print("one run a side: no difference here is a verdict (a run is one sample of a noisy process); compare "
              "repeat folders (--repeat N) to know whether a difference is real")
    elif fewest < 4:
        print("fewer than 4 runs a side: no rank test can reach 95% (make repeat folders with --repeat N)")
    _print_paths(out)
    return 0


def runs(dirs: Sequence[Path], out: str | None) -> int:
    """Print several run directories' metrics side by side (analysis.compare.compare)."""
    from analysis.compare import compare, param_diff, param_texts, run_changes
    from analysis.comparepage import runs_table

    df = compare(dirs, out=out)
    labels = [c for c in df.columns[2:] if "/" not in c]
    manifests = [json.loads((Path(d) / "manifest.json").read_text(encoding="utf-8")) for d in dirs]  # compare read them
    _print_diff(param_diff([[param_texts(mf)] for mf in manifests]), labels)
    _print_table(runs_table(df, run_changes(df)), f"{len(labels)} runs; vs first = ratio to {labels[0]} (or the "
                 "change from or to 0), the largest change first", ("metric", "from"))
    if len(labels) >= 2:
        print("one run a side: these ratios carry no verdict (a run is one sample of a noisy process); compare "
              "repeat folders (--repeat N) to know whether a difference is real")
    _print_paths(out)
    return 0
