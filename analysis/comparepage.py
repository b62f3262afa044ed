"""compare.html and compare.md: two sides (or several runs) as one page that leads with what differs.

In this order, for ``testbed compare``'s two forms (:func:`sides_page`: A and B, each one run or a repeat folder;
:func:`runs_page`: several run directories):

1. who is compared, and the runs left out (unfaithful, incomplete) in red;
2. **what differs**: every configuration value not the same on both sides (:func:`analysis.compare.param_diff`:
   the scenario, each parameter, text ones such as ``cc`` or ``discipline`` included, host or lab VM, kernel, commit);
3. **the verdicts that matter**: the metrics whose difference is real (``A > B`` / ``A < B``, the Mann-Whitney test
   and the ratio's bootstrap interval of :func:`analysis.stats.compare`), largest change first; without any, the
   largest changes seen with how many runs would tell them. One run a side carries no verdict, and the page says so;
4. pictures of both sides overlaid: per metric, each side's runs as a box with every run a dot
   (:func:`analysis.stripplot.plot_distributions`, repeat folders), and the empirical CDF of the samples inside the
   runs (:func:`run_samples`: incast round times, collective op times (CCT), training step times, the busiest port's
   sampled backlog), pooled over each side's counting runs (:func:`analysis.plots.plot_cdf`);
5. every metric, ordered as the CSV is (the size of the change).

The page is :mod:`analysis.render`'s (one self-contained HTML file, PNGs inline); compare.md is the same blocks with
the PNGs beside it. The tables' text (:func:`sides_table`, :func:`runs_table`) is also what the terminal prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from . import metrics as m
from .load import Run
from .render import Block, fmt, render_html, render_markdown
from .stats import MIN_RUNS_FOR_VERDICT
from .summary import headline_ops

__all__ = ["SAMPLES", "TOLD", "RunSamples", "runs_page", "runs_table", "run_samples", "sides_page", "sides_table"]

#: per-sample series a run may hold: name -> what the CDF's x axis shows
SAMPLES = {"round_ms": "incast round time (ms)", "cct_ms": "collective op time, CCT (ms)",
           "step_ms": "training step time (ms)",
           "backlog_bytes": "sampled backlog at the busiest port (most drops, else highest peak; bytes)"}
#: the verdicts that say a difference is real
TOLD = ("A > B", "A < B")
#: the rows the "largest changes" table shows when there is no verdict to lead with
LARGEST = 8


@dataclass
class RunSamples:
    """One run's samples per :data:`SAMPLES` name (those it has), its busiest port (the most drops, else the highest
    sampled backlog; backlog summed over classes: ``backlog_bytes`` is that port's samples) and its backlog over time
    (``trace_s``: seconds since the port's first sample, ``trace_bytes``)."""
    samples: dict[str, list[float]]
    port: str = ""
    trace_s: list[float] = field(default_factory=list)
    trace_bytes: list[float] = field(default_factory=list)


def run_samples(run: Run) -> RunSamples:
    """See :class:`RunSamples`."""
    out: dict[str, list[float]] = {}
    if len(run.rounds):
        out["round_ms"] = (m.round_times(run.rounds)["round_s"] * 1e3).tolist()
    if len(run.ops):
        out["cct_ms"] = (m.op_table(headline_ops(run.ops))["cct_s"] * 1e3).tolist()
        out["step_ms"] = (m.step_times(run.ops)["step_s"] * 1e3).tolist()
    if not len(run.queues):
        return RunSamples(out)
    per_t = run.queues.groupby(["node", "port", "t_s"])["backlog_bytes"].sum()
    peak = per_t.groupby(level=[0, 1]).max().rename("peak").reset_index()
    busiest = peak.merge(m.port_counter_deltas(run.queues), on=["node", "port"], how="left").fillna({"drops": 0})
    top = busiest.sort_values(["drops", "peak"], ascending=False, kind="stable").iloc[0]
    node, port = top["node"], top["port"]
    trace = per_t.loc[(node, port)].astype(float)
    out["backlog_bytes"] = trace.tolist()
    t = trace.index.to_numpy(dtype=float)
    return RunSamples(out, f"{node}:{port}", (t - t[0]).tolist(), trace.tolist())


# --------------------------------------------------------------------------- table text (terminal, md, html)

def _num(v) -> str:
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


def sides_table(df: pd.DataFrame, skip: set[str] | frozenset = frozenset()) -> pd.DataFrame:
    """:func:`analysis.compare.compare_sides`'s rows as text, in its order (``skip``: metrics left out): metric,
    each side's median [CI], ``A/B`` (the ratio [CI], or the ``change`` from or to 0), verdict, runs to tell and
    each side's CV."""
    rows = []
    for _, r in df.iterrows():
        if r["metric"] in skip:
            continue
        ratio = f"{_num(r['ratio'])}" + ("" if math.isnan(r["ratio_low"]) else
                                         f" [{_num(r['ratio_low'])}, {_num(r['ratio_high'])}]")
        rows.append([str(r["metric"]), _interval(r["A_median"], r["A_low"], r["A_high"], r["A_n"]),
                     _interval(r["B_median"], r["B_low"], r["B_high"], r["B_n"]), r["change"] or ratio,
                     str(r["verdict"]),
                     _runs_to_tell(r["runs_needed"]), _num(r["A_cv"]) if r["A_n"] >= 2 else "-",
                     _num(r["B_cv"]) if r["B_n"] >= 2 else "-"])
    return pd.DataFrame(rows, columns=["metric", "A", "B", "A/B", "verdict", "runs to tell", "cv A", "cv B"])


def runs_table(df: pd.DataFrame, changes: Mapping[str, Sequence[str]]) -> pd.DataFrame:
    """:func:`analysis.compare.compare`'s rows as text, in its order: each ratio column shows ``changes``
    (``{metric: [text per later run]}``, :func:`analysis.compare.change_text`)."""
    labels = [c for c in df.columns[2:] if "/" not in c]
    out = pd.DataFrame({"metric": df["metric"].astype(str), "from": df["source"].astype(str)})
    for lab in labels:
        out[lab] = [_num(v) for v in df[lab]]
    for k, lab in enumerate(labels[1:]):
        out[f"{lab} vs first"] = [changes[metric][k] for metric in df["metric"]]
    return out


# --------------------------------------------------------------------------- pictures

def _cdfs(series: Mapping[str, Mapping[str, list[float]]], ports: Mapping[str, str], out: Path,
          title: str) -> list[Block]:
    """One overlaid CDF per :data:`SAMPLES` name any side has: ``{side label: {name: samples}}``; the backlog's
    series name each side's port (``ports``)."""
    from .plots import plot_cdf

    blocks = []
    for name, what in SAMPLES.items():
        sides = {(f"{label} at {ports.get(label) or '?'}" if name == "backlog_bytes" else label): s[name]
                 for label, s in series.items() if s.get(name)}
        if not sides:
            continue
        png = plot_cdf(sides, out / f"compare_cdf_{name}.png", xlabel=what, title=title)
        blocks.append(Block("img", (png, png.name), f"{what}: the CDF of every sample of each side"))
    return blocks


def _traces(traces: Mapping[str, RunSamples], out: Path, title: str) -> list[Block]:
    """The busiest port's backlog over time, one line per side (``{label: its run's samples}``), each from its
    port's first sample: which side builds a standing queue, and when."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    shown = {label: r for label, r in traces.items() if r.trace_s}
    if not shown:
        return []
    fig = Figure(figsize=(7.0, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, r in shown.items():
        ax.step(r.trace_s, r.trace_bytes, where="post", linewidth=0.8, alpha=0.8, label=f"{label} at {r.port}")
    ax.set_xlabel("time since the port's first queue sample (s)")
    ax.set_ylabel("backlog (bytes)")
    ax.set_title(title, fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize="small", frameon=False)  # below the axes
    path = out / "compare_queue_trace.png"
    fig.tight_layout()
    fig.savefig(path, format="png")
    return [Block("img", (path, path.name), "the busiest port's sampled backlog over time, each side's own port "
                  "(a repeat folder: its first counting run)")]


def _side_series(side) -> tuple[str, dict[str, list[float]], str]:
    label = f"{side.label} ({len(side.used)} runs pooled)" if side.repeat else side.label
    ports = sorted(set(side.ports))
    return label, side.samples, ports[0] if len(ports) == 1 else "each run's busiest port"


def _diff_block(diff: Sequence[tuple[str, list[str]]], labels: Sequence[str], scenario: str) -> list[Block]:
    if not diff:
        return [Block("h2", "What differs"),
                Block("p", f"Nothing in the configuration: the same scenario ({scenario}), parameters, machine "
                      "(host or lab VM), kernel and commit on every side. Only the seeds differ.")]
    table = pd.DataFrame([[name, *texts] for name, texts in diff], columns=["parameter", *labels])
    return [Block("h2", "What differs"), Block("table", table, "every configuration value that is not the same "
                                               "on every side (manifest.json: scenario, params, where it ran)")]


def _write(blocks: list[Block], out: Path, title: str) -> tuple[Path, Path]:
    html_path, md_path = out / "compare.html", out / "compare.md"
    html_path.write_text(render_html(blocks, title), encoding="utf-8")
    md_path.write_text(render_markdown(blocks), encoding="utf-8")
    return html_path, md_path


def sides_page(df: pd.DataFrame, a, b, diff: Sequence[tuple[str, list[str]]], out: Path, level: float, *,
               constant: set[str], echoes: set[str], distributions: Path | None) -> tuple[Path, Path]:
    """compare.html / compare.md of two sides (:class:`analysis.compare.Side`); see the module docstring."""
    blocks = [Block("h1", f"{a.label} = {a.path.name} vs {b.label} = {b.path.name}"),
              Block("list", [a.describe(), b.describe()])]
    blocks += [Block("alert", f"{s.label}: runs left out (unfaithful or incomplete), see above")
               for s in (a, b) if s.unfaithful or s.incomplete]
    blocks += _diff_block(diff, [a.label, b.label], a.scenario)
    shown = set(df["metric"]) - constant - echoes
    told = df[df["verdict"].isin(TOLD) & df["metric"].isin(shown)]
    fewest = min(len(a.used), len(b.used))
    blocks.append(Block("h2", "Verdicts"))
    if fewest <= 1:
        blocks.append(Block("p", "One run a side cannot tell whether a difference is real: a run is one sample of a "
                            "noisy process, and the next pair of runs may order them the other way. These are the "
                            "largest changes seen, not verdicts; make repeat folders (--repeat 5) to know."))
    elif fewest < MIN_RUNS_FOR_VERDICT:
        blocks.append(Block("p", f"Fewer than {MIN_RUNS_FOR_VERDICT} runs a side: no rank test can reach "
                            f"{level:.0%}, so no difference here is a verdict (make repeat folders with --repeat 5)."))
    if len(told):
        blocks.append(Block("p", f"{len(told)} of {len(shown)} metrics differ beyond the noise of these runs "
                            f"({level:.0%} level), largest change first:"))
        blocks.append(Block("table", sides_table(told).drop(columns=["runs to tell", "cv A", "cv B"])))
    else:
        if fewest >= MIN_RUNS_FOR_VERDICT:
            blocks.append(Block("p", f"No metric differs beyond the noise of these runs ({level:.0%} level); "
                                "\"not distinguishable\" is not \"equal\". The largest changes seen, with about how "
                                "many runs a side would tell them:"))
        rest = df[df["metric"].isin(shown)].head(LARGEST)
        blocks.append(Block("table", sides_table(rest).drop(columns=["cv A", "cv B"])))
    if distributions is not None:
        blocks += [Block("h2", "Distributions over the runs"), Block("img", (distributions, distributions.name),
                                                                     "distributions"),
                   Block("p", "Per metric a box per side, every run a dot, the median's confidence interval beside "
                         "it: one number a side hides the spread that decides the verdict.")]
    series = [_side_series(a), _side_series(b)]
    title = f"{a.label} = {a.path.name} vs {b.label} = {b.path.name}"
    cdfs = _cdfs({lab: s for lab, s, _ in series}, {lab: port for lab, _, port in series}, out, title)
    cdfs += _traces({(f"{s.label} ({s.trace_run})" if s.repeat else s.label): s.trace
                     for s in (a, b) if s.trace is not None}, out, title)
    if cdfs:
        blocks += [Block("h2", "Samples inside the runs")] + cdfs
    blocks += [Block("h2", "Every metric"),
               Block("table", sides_table(df, constant),
                     f"medians with {level:.0%} CIs; ratio = median {a.label} / median {b.label} with its bootstrap "
                     "interval, or the change from or to 0; rows with a verdict first, then by the size of the "
                     "change; rows that only echo a parameter last")]
    if constant:
        blocks.append(Block("p", "The same on every run of both sides: "
                            + ", ".join(x for x in df["metric"] if x in constant)))
    blocks.append(Block("p", f"Each side: the median over its runs with a {level:.0%} confidence interval "
                        "(distribution-free; with few runs it is [min, max] and its real coverage is lower), n runs "
                        "and the coefficient of variation. A verdict is stated only when a Mann-Whitney U test "
                        "rejects \"same distribution\" and the ratio's interval excludes 1; \"runs to tell\" is about "
                        "how many runs a side would tell a difference of the size seen. compare.csv has every "
                        "number. See docs/analysis.md."))
    return _write(blocks, out, f"compare {a.path.name} vs {b.path.name}")


def runs_page(df: pd.DataFrame, runs: Sequence[Run], labels: Sequence[str], samples: Sequence[RunSamples],
              diff: Sequence[tuple[str, list[str]]], changes: Mapping[str, Sequence[str]], out: Path,
              echoes: set[str]) -> tuple[Path, Path]:
    """compare.html / compare.md of several run directories (:func:`analysis.compare.compare`)."""
    table = runs_table(df, changes)
    blocks = [Block("h1", "Runs compared: " + " vs ".join(labels)),
              Block("list", [f"{lab} = {r.path} ({r.manifest.get('scenario', '?')}; complete: {fmt(r.complete)})"
                             for lab, r in zip(labels, runs)])]
    blocks += [Block("alert", f"{lab}: INCOMPLETE RUN") for lab, r in zip(labels, runs) if not r.complete]
    blocks += _diff_block(diff, labels, str(runs[0].manifest.get("scenario", "?")))
    if len(labels) >= 2:
        moved = table[~table["metric"].isin(echoes)]
        blocks += [Block("h2", "Largest changes"),
                   Block("p", "One run a side cannot tell whether a difference is real: a run is one sample of a "
                         "noisy process. These ratios (each run against the first) carry no verdict; compare "
                         "repeat folders (--repeat 5) to know."),
                   Block("table", moved.head(LARGEST))]
    cdfs = _cdfs({lab: r.samples for lab, r in zip(labels, samples)},
                 {lab: r.port for lab, r in zip(labels, samples)}, out, " vs ".join(labels))
    cdfs += _traces(dict(zip(labels, samples)), out, " vs ".join(labels))
    if cdfs:
        blocks += [Block("h2", "Samples inside the runs")] + cdfs
    blocks += [Block("h2", "Every metric"),
               Block("table", table, "ratios are each run's value / the first run's, or the change from or to 0; "
                     "rows by the size of the change, rows that only echo a parameter last")]
    return _write(blocks, out, "compare " + " vs ".join(labels))
