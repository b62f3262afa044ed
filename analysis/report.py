"""One run directory -> ``report.html`` (one self-contained file) and ``report.md`` (text tables + PNG files).

Thin layer over :mod:`analysis.load`, :mod:`analysis.metrics`, :mod:`analysis.correlate` and
:mod:`analysis.plots`; like the rest of ``analysis`` it reads only the run folder (no kernel, pure pandas).

The report holds, for whatever the run has (a smoke run has only manifest/summary/tcp.csv; an incast run
rounds/queues; a collective run ops):

* a banner when the manifest's ``complete`` is not true, and every load warning (folded);
* the run's story first (:func:`analysis.story.tell`): what happened and why in sentences computed from the files,
  3-6 key numbers with plain names and units, the fidelity verdict in one line;
* the faults (events.csv), the "explain the slowest op" sentence (:func:`analysis.correlate.explain_slowest`)
  and the per-rank timeline when ops exist;
* CDFs of collective completion time and of incast round time (the latter with the ideal and ideal + RTOmin
  drawn), queue occupancy of the busiest ports with the buffer / K / XOFF-XON levels, drops and marks at their
  times and phases shaded, the PFC pause timeline when ``pfc.csv`` has rows, DCQCN's rates and Jain's index over
  time when ``dcqcn_rates.csv`` has rows (:mod:`analysis.dcqcn`), the UET panel when ``uet.csv`` has rows (each host's
  losses by how they were found and the trimmed headers it received; with ``trim.csv`` each switch port's trims and
  virtual-queue peak: :mod:`analysis.uetplot`);
* fidelity details; when the run made a packet capture (``wire_*`` keys in ``summary.json``, see
  :mod:`analysis.capture`): the wire's counts beside the end hosts' counters (:func:`wire_table`);
* the long tables (the slowest ops when they stand out, queues, host counters that moved, pauses), the run's
  configuration (parameters of features left off omitted), versions and files folded, every metric folded last.

Queue series are downsampled for plotting (per port, the maximum backlog in each of at most
:data:`PLOT_POINTS` time bins, so peaks survive); metrics always use every row.

This module orders the report and chooses what its plots draw; the sections that stand alone are in
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
from .correlate import correlate_run, explain_slowest, explain_slowest_step, op_groups
from .faults import events_table, fault_intervals
from .load import IncompleteRunWarning, Run, load_run
from .render import Block, fmt, md_table, render_html, render_markdown
from .sections import config_blocks, fidelity_blocks, fidelity_line, long_tables, metric_table, wire_table
from .story import incast_ideal_ms, rto_min_ms, tell

__all__ = ["PLOT_POINTS", "Block", "build_blocks", "downsample_queues", "fmt", "key_metrics", "md_table", "render_html",
           "render_markdown", "wire_table", "write_report"]

#: time bins per port when plotting queue occupancy (each keeps its maximum backlog)
PLOT_POINTS = 2000
#: most shaded phases drawn (closer phases are merged beyond this)
MAX_PHASES = 400
#: most ports drawn on the queue plot (more lines than this are unreadable; the table lists every port)
QUEUE_PORTS = 4
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
    """Backlog (bytes, and packets when queues.csv has them) summed over classes per (node, port, t_s), then per port
    at most ``points`` time bins, each holding the bin's maximum backlog at the bin's first sample time. Returns
    queues-shaped rows (class ``"*"``) that :func:`analysis.queueplot.plot_queue_ports` and
    :func:`analysis.plots.plot_queue_occupancy` accept; ``ports`` (``"node:port"``) limits it."""
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
    cols = ["backlog_bytes"] + (["backlog_packets"] if "backlog_packets" in queues.columns else [])
    frame = pd.DataFrame({"key": key[mask], "t_s": t, **{c: queues[c].to_numpy(dtype=np.int64)[mask] for c in cols}})
    if frame.empty:
        return queues.iloc[:0]
    per_t = frame.groupby(["key", "t_s"], sort=False)[cols].sum().reset_index()
    tt = per_t["t_s"].to_numpy(dtype=float)
    lo, hi = float(tt.min()), float(tt.max())
    width = (hi - lo) / points if hi > lo else 1.0
    per_t["bin"] = np.minimum(((tt - lo) / width).astype(np.int64), points - 1)
    out = per_t.groupby(["key", "bin"], sort=True).agg(t_s=("t_s", "min"), **{c: (c, "max") for c in cols})
    out = out.reset_index()
    k = out["key"].to_numpy()
    n_ports = max(len(port_names), 1)
    out["node"] = np.asarray(node_names, dtype=object)[k // n_ports]
    out["port"] = np.asarray(port_names, dtype=object)[k % n_ports]
    out["class"] = "*"
    return out[["t_s", "node", "port", "class", *cols]]


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


def build_blocks(run: Run, files_dir: Path, rel_dir: str = FILES_DIR) -> list[Block]:
    """The report as a list of :class:`Block`; PNGs are written into ``files_dir`` (``img`` blocks carry
    ``(absolute path, path relative to the report)``).

    Order: the run's story (:func:`analysis.story.tell`: what happened and why, in sentences), its key numbers
    with plain names, the fidelity verdict in one line; the faults, the slowest op and the per-rank timeline; the
    plots; then the details: fidelity, the wire, the long tables (the slowest ops when they stand out, queues, the
    host counters that moved, pauses), configuration, and every metric folded at the end.
    """
    files_dir.mkdir(parents=True, exist_ok=True)
    qstats = m.queue_stats(run.queues) if len(run.queues) else None
    qdeltas = m.port_counter_deltas(run.queues) if len(run.queues) else None
    data = key_metrics(run, queue_stats=qstats, port_deltas=qdeltas)
    vals = summ.summarize(run, data=data)
    ops_tab = m.op_table(run.ops) if len(run.ops) else None
    start, end = run.time_window()
    fiv = fault_intervals(run.events, None if math.isnan(end) else end) if len(run.events) else None
    corr = correlate_run(run) if ops_tab is not None else None
    t0 = None if (start is None or math.isnan(start)) else start
    fid = fidelity_blocks(run)
    return [*_opening(run, data), *_story(run, vals, qdeltas, bool(fid)),
            *_what_happened(run, corr, fiv, start, files_dir, rel_dir),
            *_plots(run, ops_tab, qstats, fiv, t0, end, files_dir, rel_dir), *fid, *_wire(run),
            *long_tables(run, corr, qstats, qdeltas, start, end), *config_blocks(run), *_all_metrics(run, vals, data)]


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
        b.append(Block("details", (f"Warnings ({len(notes)})", [Block("list", notes)])))
    return b


def _story(run: Run, vals: dict, qdeltas: pd.DataFrame | None, fidelity_details: bool) -> list[Block]:
    """What happened and why (sentences from the files), the key numbers, the fidelity verdict in one line."""
    st = tell(run, vals, qdeltas)
    b = [Block("h2", "What happened"), *(Block("story", x) for x in st.sentences)]
    if st.numbers:
        b.append(Block("table", pd.DataFrame(st.numbers, columns=["what", "value"]),
                       "percentiles are nearest-rank; a p99 of fewer than 100 samples is the max"))
    elif not run.summary:
        b.append(Block("p", "No summary.json (or it is empty), and no rounds, ops, queue, TCP, PFC or CPU rows to "
                       "compute from."))
    line = fidelity_line(run, fidelity_details)
    return b + ([line] if line is not None else [])


def _what_happened(run: Run, corr: pd.DataFrame | None, fiv: pd.DataFrame | None, start: float, files_dir: Path,
                   rel_dir: str) -> list[Block]:
    """The faults, the slowest op and step in a sentence each, and the per-rank timeline."""
    b: list[Block] = []
    if fiv is not None:
        b.append(Block("h2", "Faults (events.csv)"))
        b.append(Block("table", events_table(run.events, start), "each fault's changes and routing's reactions, "
                       "seconds from the run's start; drawn hatched on the timelines below"))
    if corr is not None:
        from . import plots  # matplotlib only when a report draws (see _plots)

        b.append(Block("p", "The slowest op: " + explain_slowest(run, table=corr) + "."))
        b.append(Block("p", "The slowest step: " + explain_slowest_step(run) + "."))
        p = plots.plot_rank_timeline(run.ops, files_dir / "timeline.png", faults=fiv, t0=start,
                                     groups=op_groups(run.manifest))
        b.append(Block("img", (Path(p), f"{rel_dir}/{Path(p).name}"),
                       "Per-rank timeline, one row per rank, on the queue plot's clock: compute (green), waiting "
                       "for the last rank to arrive (red) and transfer (blue); a straggler is the row with long "
                       "compute and no red, the others wait for it. trace.json holds the same in Perfetto's format "
                       "(`testbed trace`)."))
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
        bounds = _bound_lines(run, ops_tab)
        p = plots.plot_cdf({"CCT": ops_tab["cct_s"] * 1e3}, files_dir / "cdf_cct.png",
                           xlabel="collective completion time (ms)", title="CCT CDF", lines=bounds)
        figs.append((p, "Collective completion time CDF" + (f" (vertical lines: {', '.join(bounds)}: the time no "
                                                            "network could beat)" if bounds else "")))
    rt = m.round_times(run.rounds) if len(run.rounds) else None
    if rt is not None:
        lines = _round_lines(run)
        p = plots.plot_cdf({"round": rt["round_s"] * 1e3}, files_dir / "cdf_round.png",
                           xlabel="incast round time (ms)", title="round-time CDF", lines=lines)
        figs.append((p, "Incast round time CDF" + (f" (vertical lines: {', '.join(lines)})" if lines else "")))
    if len(run.queues):
        figs.append(_queue_plot(run, qstats, ops_tab, rt, fiv, t0, files_dir))
    if len(run.pfc):
        p = plots.plot_pause_timeline(run.pfc, files_dir / "pauses.png",
                                      run_end=None if math.isnan(end) else end, t0=t0)
        figs.append((p, "PFC pause timeline"))
    if len(run.dcqcn_rates):
        from .dcqcn import plot_rates

        p = plot_rates(run.dcqcn_rates, files_dir / "dcqcn.png", t0=t0)
        figs.append((p, "DCQCN: the current rate Rc of each QP that received CNPs (top) and Jain's index over "
                        "those flows per 0.5 s (bottom; 1 = equal shares)"))
    if len(run.uet):
        from .uetplot import uet_panel

        figs.append(uet_panel(run, files_dir / "uet.png"))
    from . import topopicture

    if (p := topopicture.draw_topology(run, files_dir / "topology.png")) is not None:
        figs.append((p, "The fabric: each egress port coloured by its peak backlog (the hottest labelled)"))
    if not figs:
        return []
    return [Block("h2", "Plots"), *(Block("img", (Path(path), f"{rel_dir}/{Path(path).name}"), caption)
                                    for path, caption in figs)]


def _bound_lines(run: Run, ops_tab: pd.DataFrame, most: int = 3) -> dict[str, float]:
    """The alpha-beta bound of the plotted ops (ms): one line when they share it, else one per op name (the first
    ``most`` distinct bounds)."""
    from .references import op_bounds_ms

    b = op_bounds_ms(run)
    if "*" in b:
        return {"alpha-beta bound": round(b["*"], 2)}
    mine = {o: b[o] for o in dict.fromkeys(ops_tab["op"].astype(str)) if o in b}
    if len({round(v, 3) for v in mine.values()}) == 1:
        return {"alpha-beta bound": round(next(iter(mine.values())), 2)}
    out: dict[str, float] = {}
    for o, v in sorted(mine.items(), key=lambda kv: kv[1]):
        if round(v, 2) not in out.values() and len(out) < most:
            out[f"bound {o}"] = round(v, 2)
    return out


def _round_lines(run: Run) -> dict[str, float]:
    """The ideal round and ideal + RTOmin (ms), where the run's files give them."""
    ideal, rto = incast_ideal_ms(run), rto_min_ms(run)
    out = {"ideal": round(ideal, 1)} if ideal else {}
    if ideal and rto:
        out["ideal + RTOmin"] = round(ideal + rto, 1)
    return out


def _queue_plot(run: Run, qstats: pd.DataFrame, ops_tab: pd.DataFrame | None, rt: pd.DataFrame | None,
                fiv: pd.DataFrame | None, t0: float | None, files_dir: Path) -> tuple[Path, str]:
    """Backlog of the busiest ports (most drops, then highest peak; at most :data:`QUEUE_PORTS`), a panel each with
    that port's own limits (buffer, K, XOFF/XON) in its buffer's unit and its drops, marks, pauses and RTOs as ticks
    (:mod:`analysis.queueplot`), phases shaded, on the run's clock."""
    from .queueplot import plot_queue_ports
    from .references import port_limits, queue_ticks

    busy = qstats.merge(m.port_counter_deltas(run.queues)[["node", "port", "drops"]], on=["node", "port"], how="left")
    top = busy.sort_values(["drops", "max_bytes"], ascending=False, kind="stable").head(QUEUE_PORTS)
    ports = [f"{n}:{p}" for n, p in zip(top["node"], top["port"])]
    ds = downsample_queues(run.queues, ports=ports)
    phases, what = None, ""
    if ops_tab is not None:
        phases, what = _phases(ops_tab), "ops"
    elif rt is not None:
        phases, what = _phases(rt), "incast rounds"
    limits = port_limits(run, ports)
    p = plot_queue_ports(ds, files_dir / "queues.png", ports=ports, limits=limits, ticks=queue_ticks(run),
                         ops=phases, t0=t0, faults=fiv, phase_name=f"{what}, alternating colours" if what else "")
    more = len(qstats) - len(ports)
    in_packets = [k for k, v in limits.items() if v.unit == "packets"]
    return p, ("Queue occupancy over time, one panel per port (backlog summed over classes; shaded: "
               f"{what or 'no phases'}; the {len(ports)} busiest ports by drops, then peak"
               + (f", {more} quieter ports in the table below" if more > 0 else "")
               + "; horizontal lines: each port's own buffer, ECN K or RED levels and PFC XOFF/XON"
               + (f"; in packets where the buffer is ({', '.join(in_packets)})" if in_packets else "")
               + "; ticks at the top: drops (red), ECN marks (orange), PFC pauses (purple), a sender that waited a "
               "retransmission timeout finishing (black x))")


def _all_metrics(run: Run, vals: dict, data: dict[str, float]) -> list[Block]:
    """Every metric once, folded: recomputed from the files, or as summary.json recorded it."""
    b: list[Block] = []
    rest = list(vals)
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
    return [Block("details", (f"All metrics ({len(rest) + len(text)})", b))]


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


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, slides: bool = False) -> tuple[Path, Path]:
    """Write ``report.html`` (self-contained) and ``report.md`` (+ ``report_files/*.png``) for one run, trace.json
    beside them, and with ``slides`` also ``slides.html`` (:mod:`analysis.slides`: a few full-screen slides for a
    projector, from the same blocks).

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
    from .trace import TRACE_FILE, write_trace  # the run as a Perfetto / Chrome trace: trace.json beside the report

    write_trace(run, out / TRACE_FILE)
    if slides:
        from .slides import SLIDES_FILE, render_slides

        page = render_slides(run, blocks, f"{run.manifest.get('scenario', '?')}: {run.name}", files_dir=out / FILES_DIR)
        (out / SLIDES_FILE).write_text(page, encoding="utf-8")
    return html_path, md_path
