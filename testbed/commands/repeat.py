"""Repeats: one configuration run N times with seeds seed .. seed+N-1 into a repeat folder (analysis.repeats).

A run is one sample of a noisy process: the kernel's timers, the scheduler of a shared machine and the seed's
ECMP hash make two runs of one configuration differ. Every answer from runs is therefore a median over repeats
with a confidence interval (analysis.stats), and this module makes the repeats:

* :func:`repeat` — the Lab-script helper and what ``--repeat N`` runs: ``experiment(out_dir, seed)`` is called
  once per seed with ``OUT/seed-<seed>/`` (a run that raises is recorded and the others go on), then
  ``OUT/repeat.json`` is written. In a Lab script::

      from testbed.commands.repeat import repeat
      from testbed.lab import Lab

      def one(out, seed):
          with Lab(DumbbellTopo(...), out=out, seed=seed, name="incast-look") as lab:
              lab.summary = {"round_ms_p99": lab.burst(...).percentiles_ms().p99}

      rep = repeat(one, runs=5, out="results/look-x5", seed=1)
      print(rep.estimate("round_ms_p99").text())     # median [low, high] (5 runs, 94% CI)

* ``testbed.commands.runner.run_repeats`` — the same for a scenario (``testbed run SCENARIO --repeat N``, each
  sweep/audit point).
* :func:`print_repeats` — the table ``testbed run --repeat`` prints: each metric's median, interval, n and CV.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from testbed.errors import RunFailed, UsageError
from testbed.params import SEED_MAX
from analysis.repeats import seed_dir, summarize, values
from analysis.report import fmt
from analysis.stats import estimate
from testbed.rundir import check_out_dir

__all__ = ["RepeatResult", "check_repeat", "print_repeats", "repeat"]


@dataclass
class RepeatResult:
    """What :func:`repeat` made: the folder, repeat.json's content and the runs that raised (name, why)."""
    path: Path
    summary: dict
    failed: list[tuple[str, str]] = field(default_factory=list)

    def values(self, metric: str) -> list[float]:
        """The metric over the complete, faithful runs (analysis.repeats.values)."""

        return values(self.path, metric)

    def estimate(self, metric: str):
        """The metric's median with its confidence interval (an analysis.stats.Estimate; n = 0 when no run has it)."""

        return estimate(self.values(metric))


def check_repeat(runs: int, seed: int) -> None:
    """UsageError (one line, exit 2) unless ``runs`` >= 1 and every seed seed .. seed+runs-1 is a valid seed."""
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
        raise UsageError(f"--repeat takes a whole number of runs >= 1 (got {runs!r})")
    if seed + runs - 1 > SEED_MAX:
        raise UsageError(f"--repeat {runs} from seed {seed}: the last seed would pass {SEED_MAX}")


def say_stderr(msg: str) -> None:
    print(f"testbed repeat: {msg}", file=sys.stderr, flush=True)


def repeat(experiment: Callable[[Path, int], Any], runs: int, out: str | Path, seed: int = 1,
           scenario: str | None = None, say: Callable[[str], None] | None = say_stderr) -> RepeatResult:
    """Call ``experiment(out/seed-<s>, s)`` for s = seed .. seed+runs-1, then write ``out/repeat.json``
    (analysis.repeats.summarize) and return a :class:`RepeatResult`. A run that raises is recorded (and is
    ``incomplete`` in repeat.json: its manifest never said complete) and the next one runs; Ctrl-C and usage
    errors stop the repeats, after repeat.json is written for the runs made so far."""

    check_repeat(runs, seed)
    out = check_out_dir(out)
    say = say or (lambda _msg: None)
    failed: list[tuple[str, str]] = []
    t_start = time.monotonic()
    try:
        for i, s in enumerate(range(seed, seed + runs), 1):
            d = out / seed_dir(s)
            t0 = time.monotonic()
            say(f"[{i}/{runs}] seed {s} -> {d}")
            try:
                experiment(d, s)
            except (KeyboardInterrupt, UsageError):
                raise
            except Exception as e:  # noqa: BLE001 - record the run, make the others
                why = str(e) if isinstance(e, RunFailed) else f"{type(e).__name__}: {e}"
                why = " ".join(why.split()) or type(e).__name__
                failed.append((d.name, why))
                say(f"[{i}/{runs}] seed {s} failed after {time.monotonic() - t0:.1f} s: {why}")
                continue
            say(f"[{i}/{runs}] seed {s} done in {time.monotonic() - t0:.1f} s")
    finally:
        summary = summarize(out, scenario)  # also after Ctrl-C: the runs made so far
    left = summary["unfaithful"] + summary["incomplete"]
    say(f"{runs - len(failed)}/{runs} runs in {time.monotonic() - t_start:.1f} s"
        + (f"; left out of the statistics: {', '.join(left)}" if left else "") + f"; {out / 'repeat.json'}")
    return RepeatResult(out, summary, failed)


def print_repeats(result: RepeatResult, table: Sequence[tuple[str, str]] = ()) -> None:
    """Each metric over the repeats: median [CI], n, the CI's real coverage and the CV. ``table``: (key, label)
    pairs shown first (a scenario's table), then every other metric that varies between runs; metrics with one
    value on every run (mostly parameters) are one line below."""
    from rich.console import Console
    from rich.table import Table


    metrics = result.summary.get("metrics", {})
    varies = [k for k, e in metrics.items() if e["low"] != e["high"]]
    keys = [k for k, _ in table if k in varies] + [k for k in varies if k not in dict(table)]
    labels = dict(table)
    t = Table(title=f"{result.summary.get('scenario') or 'repeats'}: {result.path} "
                    f"({len(result.summary.get('runs', []))} runs)")
    for col in ("metric", "median", "CI", "n", "coverage", "CV"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for k in keys:
        e = metrics[k]
        t.add_row(labels.get(k, k), fmt(e["median"]), f"[{fmt(e['low'])}, {fmt(e['high'])}]", str(e["n"]),
                  f"{e['coverage']:.1%}", "-" if e["cv"] is None else f"{e['cv']:.2f}")
    Console(width=None if sys.stdout.isatty() else 200).print(t)
    same = [f"{labels.get(k, k)} {fmt(e['median'])}" for k, e in metrics.items() if k not in varies]
    if same:
        print(f"the same on every run: {', '.join(same)}")
    for kind in ("unfaithful", "incomplete"):
        if result.summary.get(kind):
            print(f"{kind} (left out of the statistics): {', '.join(result.summary[kind])}")
    for name, why in result.failed:
        print(f"{name} failed: {why}")
