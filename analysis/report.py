"""One run directory -> ``report.html`` (one self-contained file) and ``report.md`` (text tables + PNG files).

Thin layer over :mod:`analysis.load`, :mod:`analysis.metrics`, :mod:`analysis.correlate` and
:mod:`analysis.plots`; like the rest of ``analysis`` it reads only the run folder (no kernel, pure pandas).

The report holds, for whatever the run has (a smoke run has only manifest/summary/tcp.csv; an incast run
rounds/queues; a collective run ops):

* a banner when the manifest's ``complete`` is not true, and every load warning;
* the summary table (``summary.json``) and key metrics recomputed from the data (:func:`key_metrics`),
  with sample counts beside tails;
* the run's configuration: scenario, params, seed, kernel, lab VM, git commit, wall times, versions;
* row counts per file (absent / empty / N rows);
* CDFs of collective completion time and of incast round time, queue occupancy over time with op (or
  round) phases shaded, the PFC pause timeline when ``pfc.csv`` has rows;
* the "explain the slowest op" sentence (:func:`analysis.correlate.explain_slowest`) when ops exist;
* when the run made a packet capture (``wire_*`` keys in ``summary.json``, see :mod:`analysis.capture`): the
  wire's counts beside the end hosts' counters that should tell the same story (:func:`wire_table`).

Queue series are downsampled for plotting (per port, the maximum backlog in each of at most
:data:`PLOT_POINTS` time bins, so peaks survive); metrics always use every row.

This module orders the report and draws its queue plot; the sections that stand alone are in
:mod:`analysis.sections`, the HTML and Markdown writers (and :func:`fmt`, :func:`md_table`) in :mod:`analysis.render`.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from . import metrics as m
from . import summary as summ
from .correlate import correlate_run, explain_slowest, explain_slowest_step
from .faults import events_table, fault_intervals
from .load import IncompleteRunWarning, Run, load_run
from .render import Block, fmt, md_table, render_html, render_markdown
from .sections import config_blocks, fidelity_blocks, long_tables, metric_table, wire_table

__all__ = ["PLOT_POINTS", "Block", "build_blocks", "downsample_queues", "fmt", "key_metrics", "md_table", "render_html",
           "render_markdown", "wire_table", "write_report"]

#: time bins per port when plotting queue occupancy (each keeps its maximum backlog)
PLOT_POINTS = 2000
#: most shaded phases drawn (closer phases are merged beyond this)
MAX_PHASES = 400
#: folder (inside the output folder) for the report's PNG files
FILES_DIR = "report_files"


# --------------------------------------------------------------------------- metrics from the data

def key_metrics(run: Run, *, queue_stats: pd.DataFrame | None = None,
                port_deltas: pd.DataFrame | None = None) -> dict[str, float]:
    """Every metric the run's CSVs support, recomputed from them (not from summary.json):
    :func:`analysis.summary.data_metrics`, the one definition summary.json, the report and compare share.
    ``queue_stats`` / ``port_deltas``: precomputed :func:`metrics.queue_stats` / :func:`metrics.port_counter_deltas`
    of ``run.queues`` (they are the expensive part on a long run)."""
    return summ.data_metrics(run, queue_stats=queue_stats, port_deltas=port_deltas)


# --------------------------------------------------------------------------- plot helpers

def downsample_queues(queues: pd.DataFrame, points: int = PLOT_POINTS, ports: Iterable[str] | None = None
                      ) -> pd.DataFrame:
    """Backlog summed over classes per (node, port, t_s), then per port at most ``points`` time bins, each
    holding the bin's maximum backlog at the bin's first sample time. Returns queues-shaped rows (class
    ``"*"``) that :func:`analysis.plots.plot_queue_occupancy` accepts; ``ports`` (``"node:port"``) limits it."""
    if queues.empty:
        return queues
    node_codes, node_names = pd.factorize(queues["node"], sort=False)
    port_codes, port_names = pd.factorize(queues["port"], sort=False)
    key = node_codes.astype(np.int64) * max(len(port_names), 1) + port_codes
    if ports is not None:
        want = set(ports)
        keep_keys = [i * max(len(port_names), 1) + j for i, nd in enumerate(node_names)
                     for j, pt in enumerate(port_names) if f"{nd}:{pt}" in want]
        mask = np.isin(key, keep_keys)
    else:
        mask = np.ones(len(key), dtype=bool)
    t = queues["t_s"].to_numpy(dtype=float)[mask]
    frame = pd.DataFrame({"key": key[mask], "t_s": t,
                          "backlog_bytes": queues["backlog_bytes"].to_numpy(dtype=np.int64)[mask]})
    if frame.empty:
        return queues.iloc[:0]
    per_t = frame.groupby(["key", "t_s"], sort=False)["backlog_bytes"].sum().reset_index()
    tt = per_t["t_s"].to_numpy(dtype=float)
    lo, hi = float(tt.min()), float(tt.max())
    width = (hi - lo) / points if hi > lo else 1.0
    per_t["bin"] = np.minimum(((tt - lo) / width).astype(np.int64), points - 1)
    out = per_t.groupby(["key", "bin"], sort=True).agg(t_s=("t_s", "min"), backlog_bytes=("backlog_bytes", "max"))
    out = out.reset_index()
    k = out["key"].to_numpy()
    n_ports = max(len(port_names), 1)
    out["node"] = np.asarray(node_names, dtype=object)[k // n_ports]
    out["port"] = np.asarray(port_names, dtype=object)[k % n_ports]
    out["class"] = "*"
    return out[["t_s", "node", "port", "class", "backlog_bytes"]]


def _phases(intervals: pd.DataFrame, max_phases: int = MAX_PHASES) -> pd.DataFrame:
    """Union of overlapping [start_s, end_s] intervals (back-to-back phases stay apart); when more than
    ``max_phases`` remain, close gaps until they fit."""
    if intervals.empty:
        return pd.DataFrame({"start_s": [], "end_s": []})
    iv = sorted(zip(intervals["start_s"].astype(float), intervals["end_s"].astype(float)))
    span = max(e for _, e in iv) - iv[0][0]
    gap = 0.0
    while True:
        merged: list[list[float]] = []
        for s, e in iv:
            if merged and (s < merged[-1][1] or (gap > 0 and s <= merged[-1][1] + gap)):
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        if len(merged) <= max_phases or span <= 0:
            break
        gap = span / max_phases if gap == 0 else gap * 2
    return pd.DataFrame(merged[:max_phases], columns=["start_s", "end_s"])


def _plot_occupancy(ds: pd.DataFrame, path: Path, ports: list[str], phases: pd.DataFrame | None,
                    t0: float | None, what: str, faults: pd.DataFrame | None = None) -> Path:
    """Backlog over time per port (``ds`` from :func:`downsample_queues`) with phases shaded in alternating
    colours, so back-to-back ops or rounds stay distinguishable (plots.plot_queue_occupancy shades them all
    alike)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    t0 = float(ds["t_s"].min()) if t0 is None else t0
    if phases is not None and len(phases):
        for i, (s, e) in enumerate(zip(phases["start_s"], phases["end_s"])):
            ax.axvspan(s - t0, e - t0, color="tab:blue" if i % 2 == 0 else "tab:green", alpha=0.10, linewidth=0)
    from .plots import shade_faults

    shade_faults(ax, faults, t0)
    label = ds["node"].astype(str) + ":" + ds["port"].astype(str)
    for port in ports:
        d = ds[label == port].sort_values("t_s")
        ax.step(d["t_s"] - t0, d["backlog_bytes"] / 1e3, where="post", label=port, linewidth=1)
    ax.set_xlabel("time since run start (s)")
    ax.set_ylabel("backlog (kB)")
    ax.set_title("queue occupancy" + (f"  (shaded: {what}, alternating colours)" if what else ""))
    ax.grid(True, alpha=0.3)
    if ports:
        ax.legend(loc="upper right", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def build_blocks(run: Run, files_dir: Path, rel_dir: str = FILES_DIR) -> list[Block]:
    """The report as a list of :class:`Block`; PNGs are written into ``files_dir`` (``img`` blocks carry
    ``(absolute path, path relative to the report)``).

    Order: what happened (headline numbers, the slowest op and what the fabric did during it, the per-rank
    timeline), the plots, every other metric (each metric once, with one value: :func:`analysis.summary.summarize`),
    then the long tables (the wire, the 10 slowest ops, queues, host counters, pauses), configuration and files.
    """
    files_dir.mkdir(parents=True, exist_ok=True)
    qstats = m.queue_stats(run.queues) if len(run.queues) else None
    qdeltas = m.port_counter_deltas(run.queues) if len(run.queues) else None
    data = key_metrics(run, queue_stats=qstats, port_deltas=qdeltas)
    vals = summ.summarize(run, data=data)
    b = [*_opening(run, data), *fidelity_blocks(run)]
    head = [k for k in summ.HEADLINE if k in vals]
    ops_tab = m.op_table(run.ops) if len(run.ops) else None
    start, end = run.time_window()
    fiv = fault_intervals(run.events, None if math.isnan(end) else end) if len(run.events) else None
    corr = correlate_run(run) if ops_tab is not None else None
    t0 = None if (start is None or math.isnan(start)) else start
    return [*b, *_what_happened(run, vals, head, corr, fiv, start, files_dir, rel_dir),
            *_plots(run, ops_tab, qstats, fiv, t0, end, files_dir, rel_dir),
            *_all_metrics(run, vals, head, data), *_wire(run),
            *long_tables(run, corr, qstats, qdeltas, start, end), *config_blocks(run)]


def _opening(run: Run, data: dict[str, float]) -> list[Block]:
    """Title, run directory, the incomplete-run banner and every warning (load warnings, stale summary.json keys)."""
    scen = run.manifest.get("scenario", "?")
    b = [Block("h1", f"testbed run report: {scen} ({run.name})"), Block("p", f"Run directory: {run.path}")]
    if not run.complete:
        b.append(Block("alert", "INCOMPLETE RUN: manifest.json says complete="
                       f"{json.dumps(run.manifest.get('complete'))} (still running or interrupted). "
                       "Every number below may be partial."))
    notes = list(run.warnings)
    for k, stored, recomputed in summ.stale_keys(run, data):
        notes.append(f"summary.json's {k} ({fmt(stored)}) differs from the value recomputed from the files "
                     f"({fmt(recomputed)}); the report shows the recomputed one (summary.json written by an older "
                     "version, or edited)")
    if notes:
        b.append(Block("h2", "Warnings"))
        b.append(Block("list", notes))
    return b


def _what_happened(run: Run, vals: dict, head: list[str], corr: pd.DataFrame | None, fiv: pd.DataFrame | None,
                   start: float, files_dir: Path, rel_dir: str) -> list[Block]:
    """Headline numbers, the faults, the slowest op and step in a sentence each, and the per-rank timeline."""
    b = [Block("h2", "What happened")]
    if head:
        b.append(Block("table", metric_table(vals, head, run.summary or {}),
                       "headline numbers; percentiles are nearest-rank, and p99 of fewer than 100 samples is the max "
                       "(sample counts: *_samples, *_n)"))
    elif not run.summary:
        b.append(Block("p", "No summary.json (or it is empty), and no rounds, ops, queue, TCP, PFC or CPU rows to "
                       "compute from."))
    if fiv is not None:
        b.append(Block("h2", "Faults (events.csv)"))
        b.append(Block("table", events_table(run.events, start), "each fault's changes and routing's reactions, "
                       "seconds from the run's start; drawn hatched on the timelines below"))
    if corr is not None:
        from . import plots  # matplotlib only when a report draws (see _plots)

        b.append(Block("p", "The slowest op: " + explain_slowest(run, table=corr) + "."))
        b.append(Block("p", "The slowest step: " + explain_slowest_step(run) + "."))
        p = plots.plot_rank_timeline(run.ops, files_dir / "timeline.png", faults=fiv, t0=start)
        b.append(Block("img", (Path(p), f"{rel_dir}/{Path(p).name}"),
                       "Per-rank timeline: compute, communication and waiting for peers, one row per rank, "
                       "iteration ends marked (a straggler is the row with long compute; the others wait)"))
    return b


def _plots(run: Run, ops_tab: pd.DataFrame | None, qstats: pd.DataFrame | None, fiv: pd.DataFrame | None,
           t0: float | None, end: float, files_dir: Path, rel_dir: str) -> list[Block]:
    """CDFs of op and incast round times, queue occupancy with phases shaded, the PFC pause timeline."""
    # matplotlib is imported when a report draws, not with analysis.report: fmt and md_table callers (sweep, audit,
    # compare, the CLI) draw nothing, and analysis.plots' matplotlib took `import analysis.report` from 0.30 s to
    # 0.52 s (medians of 12 interpreter starts each, ratio 95% interval 1.62-1.80, on a shared 2-CPU machine).
    from . import plots

    figs: list[tuple[Path, str]] = []
    if ops_tab is not None:
        p = plots.plot_cdf({"CCT": ops_tab["cct_s"] * 1e3}, files_dir / "cdf_cct.png",
                           xlabel="collective completion time (ms)", title="CCT CDF")
        figs.append((p, "Collective completion time CDF"))
    rt = m.round_times(run.rounds) if len(run.rounds) else None
    if rt is not None:
        p = plots.plot_cdf({"round": rt["round_s"] * 1e3}, files_dir / "cdf_round.png",
                           xlabel="incast round time (ms)", title="round-time CDF")
        figs.append((p, "Incast round time CDF"))
    if len(run.queues):
        top = qstats.sort_values("max_bytes", ascending=False, kind="stable").head(8)
        ports = [f"{n}:{p}" for n, p in zip(top["node"], top["port"])]
        ds = downsample_queues(run.queues, ports=ports)
        phases, what = None, ""
        if ops_tab is not None:
            phases, what = _phases(ops_tab), "ops"
        elif rt is not None:
            phases, what = _phases(rt), "incast rounds"
        p = _plot_occupancy(ds, files_dir / "queues.png", ports, phases, t0, what, fiv)
        figs.append((p, "Queue occupancy over time (backlog summed over classes; shaded: "
                     f"{what or 'no phases'}; top {len(ports)} ports by peak)"))
    if len(run.pfc):
        p = plots.plot_pause_timeline(run.pfc, files_dir / "pauses.png",
                                      run_end=None if math.isnan(end) else end, t0=t0)
        figs.append((p, "PFC pause timeline"))
    if not figs:
        return []
    return [Block("h2", "Plots"), *(Block("img", (Path(path), f"{rel_dir}/{Path(path).name}"), caption)
                                    for path, caption in figs)]


def _all_metrics(run: Run, vals: dict, head: list[str], data: dict[str, float]) -> list[Block]:
    """Every metric not in the headline, once: recomputed from the files, or as summary.json recorded it."""
    b = [Block("h2", "All metrics")]
    rest = [k for k in vals if k not in head]
    text = {k: v for k, v in (run.summary or {}).items() if k not in vals}
    if not run.summary:
        b.append(Block("p", "No summary.json (or it is empty)."))
    if not data:
        b.append(Block("p", "No rounds, ops, queue, TCP, PFC or CPU rows to compute from."))
    if rest or text:
        t = metric_table(vals, rest, run.summary or {})
        if text:
            t = pd.concat([t, pd.DataFrame({"metric": list(text), "value": [fmt(v) for v in text.values()],
                                            "from": "summary.json"})], ignore_index=True)
        b.append(Block("table", t, "from the files: recomputed from the CSVs (analysis.summary); from summary.json: "
                       "what the run recorded that is in no file (kernel counters read before/after, parameters)"))
    return b


def _wire(run: Run) -> list[Block]:
    """The packet capture's counts beside the end hosts' counters, when the run made a capture."""
    wt = wire_table(run.summary or {})
    if not len(wt):
        return []
    port = run.summary.get("wire_capture_port", "?")
    drops = run.summary.get("wire_capture_kernel_drops")
    return [Block("h2", f"The wire at {port} (packet capture)"),
            Block("p", f"Decoded from {run.summary.get('wire_capture_file', 'the capture')} "
                  f"({fmt(run.summary.get('wire_packets'))} packets; tcpdump's kernel drops: {fmt(drops)}). "
                  "The capture sees one port, the end-host counters every host."),
            Block("table", wt)]


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``report.html`` (self-contained) and ``report.md`` (+ ``report_files/*.png``) for one run.

    ``out_dir`` defaults to the run directory itself. Returns ``(html_path, md_path)``. Raises
    :class:`analysis.load.RunDirError` (one line) when the folder is not a readable run directory.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteRunWarning)  # shown in the report itself
        run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.path
    out.mkdir(parents=True, exist_ok=True)
    blocks = build_blocks(run, out / FILES_DIR)
    title = f"testbed report: {run.manifest.get('scenario', '?')} ({run.name})"
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(render_html(blocks, title), encoding="utf-8")
    md_path.write_text(render_markdown(blocks), encoding="utf-8")
    from .trace import write_trace  # the run as a Perfetto / Chrome trace: trace.json beside the report

    write_trace(run, out)
    return html_path, md_path
