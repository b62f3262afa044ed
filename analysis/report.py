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
"""

from __future__ import annotations

import base64
import html
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from . import metrics as m
from . import summary as summ
from .faults import events_table, fault_intervals
from .load import SCHEMAS, IncompleteRunWarning, Run, load_run

__all__ = ["PLOT_POINTS", "Block", "build_blocks", "downsample_queues", "fmt", "key_metrics", "render_html",
           "render_markdown", "wire_table", "write_report"]

#: time bins per port when plotting queue occupancy (each keeps its maximum backlog)
PLOT_POINTS = 2000
#: most shaded phases drawn (closer phases are merged beyond this)
MAX_PHASES = 400
#: folder (inside the output folder) for the report's PNG files
FILES_DIR = "report_files"


# --------------------------------------------------------------------------- formatting

def fmt(v: Any) -> str:
    """A value as short text: ints plain, floats with up to 4 decimals (or 4 significant digits when tiny),
    nan/None as ``-``, bools as ``true``/``false``."""
    if v is None:
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        x = float(v)
        if math.isnan(x):
            return "-"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x == int(x) and abs(x) < 1e15:
            return str(int(x))
        if abs(x) >= 1:
            return f"{x:.4f}".rstrip("0").rstrip(".")
        return f"{x:.4g}"
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, default=str, sort_keys=True)
    return str(v)


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


# --------------------------------------------------------------------------- report content

@dataclass
class Block:
    """One piece of the report. kind: ``h1``, ``h2``, ``p``, ``alert``, ``list``, ``table``, ``img``, ``pre``."""

    kind: str
    content: Any = None
    caption: str = ""


#: (what, wire key, end-host counter key in summary.json or None, what the end-host counter counts)
WIRE_PAIRS = [
    ("RoCE packets sent again (go-back-N)", "wire_roce_retransmitted_packets", None,
     "rxe counts no retransmitted packets (sent_pkts includes them; duplicate_request counts only the replayed "
     "packets a responder had already accepted)"),
    ("go-back-N replays", "wire_roce_replays", "rdma_completer_retry_err",
     "rxe requesters: retransmission rounds started (all hosts)"),
    ("NAKs (PSN sequence error)", "wire_roce_nak_seq_err", "rdma_out_of_seq_request",
     "rxe responders: out-of-sequence requests NAKed (all hosts)"),
    ("PSN gaps (lost before the capture point)", "wire_roce_psn_gaps", None, ""),
    ("RNR NAKs", "wire_roce_rnr_naks", "rdma_send_rnr_err", "rxe responders: RNR NAKs sent (all hosts)"),
    ("TCP segments sent again", "wire_tcp_retransmitted_segments", "tcp_retrans_segs",
     "kernel TcpRetransSegs (all hosts)"),
    ("CE-marked packets", "wire_ce_marked_packets", None, ""),
]


def wire_table(summary: dict) -> pd.DataFrame:
    """The capture's counts beside the end hosts' (rows only for wire keys the summary has). The capture sees
    one port; the host counters are summed over every host, so they bound the wire's numbers, not equal them."""
    rows = []
    for what, wk, hk, hwhat in WIRE_PAIRS:
        if wk not in summary:
            continue
        have = hk is not None and hk in summary
        rows.append({"what": what, "wire": fmt(summary[wk]), "end hosts": fmt(summary[hk]) if have else "-",
                     "end-host counter": hwhat if have or hk is None else ""})
    return pd.DataFrame(rows, columns=["what", "wire", "end hosts", "end-host counter"])


def _kv_table(d: dict) -> pd.DataFrame:
    return pd.DataFrame({"name": list(d.keys()), "value": [fmt(v) for v in d.values()]})


def _file_rows(run: Run) -> pd.DataFrame:
    rows = []
    for name in ("manifest.json", "summary.json"):
        p = run.path / name
        rows.append({"file": name, "status": "present" if p.exists() else "absent",
                     "rows": "-", "bytes": p.stat().st_size if p.exists() else 0})
    for table in SCHEMAS:
        fname = f"{table}.csv"
        p = run.path / fname
        if not p.exists():
            rows.append({"file": fname, "status": "absent", "rows": "-", "bytes": 0})
            continue
        n = len(getattr(run, table))
        rows.append({"file": fname, "status": "empty" if n == 0 else "present", "rows": str(n),
                     "bytes": p.stat().st_size})
    known = {r["file"] for r in rows} | {"report.html", "report.md"}
    for p in sorted(run.path.iterdir()):
        if p.name in known or not p.is_file():
            continue
        n = _csv_rows(p) if p.suffix == ".csv" else None
        rows.append({"file": p.name, "status": "other", "rows": "-" if n is None else str(n),
                     "bytes": p.stat().st_size})
    return pd.DataFrame(rows, columns=["file", "status", "rows", "bytes"])


def _csv_rows(path: Path) -> int:
    """Data rows of a CSV not described in docs/rundir.md: lines after the header (counted, not parsed)."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    if last != b"\n":
        lines += 1  # no newline after the last line
    return max(lines - 1, 0)


def _config(run: Run) -> tuple[pd.DataFrame, dict, dict]:
    man = run.manifest
    general = {
        "scenario": man.get("scenario"),
        "complete": "true" if run.complete else f"FALSE (manifest says {json.dumps(man.get('complete'))})",
        "seed": man.get("seed"),
        "kernel_release": man.get("kernel_release"),
        "in_lab_vm": man.get("in_lab_vm"),
        "git_commit": man.get("git_commit"),
        "started_wall": man.get("started_wall"),
        "ended_wall": man.get("ended_wall"),
        "t0_monotonic": man.get("t0_monotonic"),
    }
    topo = man.get("topology")
    if isinstance(topo, dict):
        general["topology"] = topo.get("kind", "(see manifest.json)")
    elif topo is not None:
        general["topology"] = topo
    known = set(general) | {"params", "versions", "doctor"}
    for k, v in man.items():  # anything else a newer writer adds
        if k not in known and not isinstance(v, (dict, list)):
            general[k] = v
    params = man.get("params") if isinstance(man.get("params"), dict) else {}
    versions = man.get("versions") if isinstance(man.get("versions"), dict) else {}
    return _kv_table(general), params, versions


def _metric_table(vals: dict[str, tuple[float, str]], names: Iterable[str], summary: dict) -> pd.DataFrame:
    """metric | value | from; a summary.json value is shown as written (``true``, not 1)."""
    names = list(names)
    return pd.DataFrame({"metric": names,
                         "value": [fmt(summary[k] if vals[k][1] == "summary" else vals[k][0]) for k in names],
                         "from": ["the files" if vals[k][1] == "data" else "summary.json" for k in names]})


def _long_tables(run: Run, corr: pd.DataFrame | None, qstats, qdeltas, start: float, end: float) -> list[Block]:
    """The raw tables at the end: the 10 slowest ops, queues per port, host TCP counters, PFC pauses per link."""
    b: list[Block] = []
    if corr is not None:
        b.append(Block("h2", "The 10 slowest ops"))
        worst = corr.sort_values("cct_ms", ascending=False).head(10)
        cols = ["iteration", "op_index", "op", "collective", "cct_ms", "peak_backlog_bytes", "peak_port", "drops",
                "marks", "paused_ms", "worst_port"]
        b.append(Block("table", worst[cols], "the 10 slowest ops and what the fabric did during each"))
    if len(run.queues):
        b.append(Block("h2", "Queues per port"))
        qs = qstats.merge(qdeltas, on=["node", "port"], how="left")
        cols = ["node", "port", "n", "mean_bytes", "p90_bytes", "max_bytes", "drops", "marks", "sent_packets"]
        b.append(Block("table", qs[cols], "backlog statistics (sample based) and counter increases"))
    if len(run.tcp):
        td = m.tcp_deltas(run.tcp)
        if len(td):
            b.append(Block("h2", "Host TCP counters (after - before)"))
            piv = td.pivot_table(index="counter", columns="host", values="delta", aggfunc="sum").reset_index()
            piv.columns = [str(c) for c in piv.columns]
            b.append(Block("table", piv))
    if len(run.pfc):
        b.append(Block("h2", "PFC pauses per link"))
        b.append(Block("table", m.pause_fraction(run.pfc, start, end)))

    return b


def _fidelity_blocks(run: Run) -> list[Block]:
    """Did the emulation keep up: the run's verdict and reasons, and the ports judged while backlogged."""
    from .fidelity import BACKLOGGED_MIN_S, PORT_RATE_MIN, SAMPLER_GAP_MAX_S, SAMPLER_LATE_MAX_MS

    s = run.summary or {}
    out: list[Block] = []
    if "fidelity_ok" in s:
        out.append(Block("h2", "Fidelity"))
        why = s.get("fidelity_reasons") or ""
        why = "; ".join(why) if isinstance(why, list) else why
        out.append(Block("alert", f"This run is not faithful: {why or 'see fidelity.csv'}") if s["fidelity_ok"] is False
                   else Block("p", "The emulation kept up: every check passed (docs/analysis.md lists them)."))
    timing = [f"{label} {s[k]:.1f} ms" for k, label in (("sampler_interval_ms", "median interval"),
                                                        ("sampler_gap_p99_ms", "p99 gap"),
                                                        ("sampler_gap_max_ms", "worst gap"),
                                                        ("sampler_late_ms_p99", "p99 lateness"))
              if s.get(k) is not None]
    if timing:
        out.append(Block("p", f"Queue sampler: {', '.join(timing)} (a worst gap over {SAMPLER_GAP_MAX_S * 1e3:.0f} ms "
                              f"is a stall; a p99 lateness over {SAMPLER_LATE_MAX_MS:.0f} ms, late timers)."))
    if s.get("pfc_enabled") and s.get("pfc_reaction_ms_max") is not None:
        out.append(Block("p", f"PFC reaction: up to {s['pfc_reaction_ms_max']:.1f} ms; the headroom needed for it "
                              f"{s.get('pfc_headroom_needed_bytes')} bytes of {s.get('pfc_headroom_bytes')}."))
    path = run.path / "fidelity.csv"
    if path.exists():
        t = pd.read_csv(path)
        t = t[t["backlogged_s"] >= BACKLOGGED_MIN_S].sort_values("ratio").head(10)
        if len(t):
            out.append(Block("table", t.reset_index(drop=True),
                             f"ports backlogged for at least {BACKLOGGED_MIN_S:g} s: the rate they achieved meanwhile "
                             f"against the configured one (below {PORT_RATE_MIN:g}: the shaper or the CPU did not "
                             "keep up)"))
    return out


def build_blocks(run: Run, files_dir: Path, rel_dir: str = FILES_DIR) -> list[Block]:
    """The report as a list of :class:`Block`; PNGs are written into ``files_dir`` (``img`` blocks carry
    ``(absolute path, path relative to the report)``).

    Order: what happened (headline numbers, the slowest op and what the fabric did during it, the per-rank
    timeline), the plots, every other metric (each metric once, with one value: :func:`analysis.summary.summarize`),
    then the long tables (the wire, the 10 slowest ops, queues, host counters, pauses), configuration and files.
    """
    from . import plots  # matplotlib only when a report is made
    from .correlate import correlate_run, explain_slowest, explain_slowest_step

    files_dir.mkdir(parents=True, exist_ok=True)
    b: list[Block] = []
    scen = run.manifest.get("scenario", "?")
    b.append(Block("h1", f"testbed run report: {scen} ({run.name})"))
    b.append(Block("p", f"Run directory: {run.path}"))
    if not run.complete:
        b.append(Block("alert", "INCOMPLETE RUN: manifest.json says complete="
                       f"{json.dumps(run.manifest.get('complete'))} (still running or interrupted). "
                       "Every number below may be partial."))
    qstats = m.queue_stats(run.queues) if len(run.queues) else None
    qdeltas = m.port_counter_deltas(run.queues) if len(run.queues) else None
    data = key_metrics(run, queue_stats=qstats, port_deltas=qdeltas)
    vals = summ.summarize(run, data=data)
    notes = list(run.warnings)
    for k, stored, recomputed in summ.stale_keys(run, data):
        notes.append(f"summary.json's {k} ({fmt(stored)}) differs from the value recomputed from the files "
                     f"({fmt(recomputed)}); the report shows the recomputed one (summary.json written by an older "
                     "version, or edited)")
    if notes:
        b.append(Block("h2", "Warnings"))
        b.append(Block("list", notes))
    b += _fidelity_blocks(run)

    # -- what happened
    b.append(Block("h2", "What happened"))
    head = [k for k in summ.HEADLINE if k in vals]
    if head:
        b.append(Block("table", _metric_table(vals, head, run.summary or {}),
                       "headline numbers; percentiles are nearest-rank, and p99 of fewer than 100 samples is the max "
                       "(sample counts: *_samples, *_n)"))
    elif not run.summary:
        b.append(Block("p", "No summary.json (or it is empty), and no rounds, ops, queue, TCP, PFC or CPU rows to "
                       "compute from."))
    ops_tab = m.op_table(run.ops) if len(run.ops) else None
    corr = None
    start, end = run.time_window()
    fiv = fault_intervals(run.events, None if math.isnan(end) else end) if len(run.events) else None
    if fiv is not None:
        b.append(Block("h2", "Faults (events.csv)"))
        b.append(Block("table", events_table(run.events, start), "each fault's changes and routing's reactions, "
                       "seconds from the run's start; drawn hatched on the timelines below"))
    if ops_tab is not None:
        corr = correlate_run(run)
        b.append(Block("p", "The slowest op: " + explain_slowest(run, table=corr) + "."))
        b.append(Block("p", "The slowest step: " + explain_slowest_step(run) + "."))
        p = plots.plot_rank_timeline(run.ops, files_dir / "timeline.png", faults=fiv)
        b.append(Block("img", (Path(p), f"{rel_dir}/{Path(p).name}"),
                       "Per-rank timeline: compute, communication and waiting for peers, one row per rank, "
                       "iteration ends marked (a straggler is the row with long compute; the others wait)"))

    # -- plots
    t0 = None if (start is None or math.isnan(start)) else start
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
    if figs:
        b.append(Block("h2", "Plots"))
        for path, caption in figs:
            b.append(Block("img", (Path(path), f"{rel_dir}/{Path(path).name}"), caption))

    # -- every other metric, once
    b.append(Block("h2", "All metrics"))
    rest = [k for k in vals if k not in head]
    text = {k: v for k, v in (run.summary or {}).items() if k not in vals}
    if not run.summary:
        b.append(Block("p", "No summary.json (or it is empty)."))
    if not data:
        b.append(Block("p", "No rounds, ops, queue, TCP, PFC or CPU rows to compute from."))
    if rest or text:
        t = _metric_table(vals, rest, run.summary or {})
        if text:
            t = pd.concat([t, pd.DataFrame({"metric": list(text), "value": [fmt(v) for v in text.values()],
                                            "from": "summary.json"})], ignore_index=True)
        b.append(Block("table", t, "from the files: recomputed from the CSVs (analysis.summary); from summary.json: "
                       "what the run recorded that is in no file (kernel counters read before/after, parameters)"))
    wt = wire_table(run.summary or {})
    if len(wt):
        port = run.summary.get("wire_capture_port", "?")
        b.append(Block("h2", f"The wire at {port} (packet capture)"))
        drops = run.summary.get("wire_capture_kernel_drops")
        b.append(Block("p", f"Decoded from {run.summary.get('wire_capture_file', 'the capture')} "
                       f"({fmt(run.summary.get('wire_packets'))} packets; tcpdump's kernel drops: {fmt(drops)}). "
                       "The capture sees one port, the end-host counters every host."))
        b.append(Block("table", wt))

    # -- long tables from the data
    b += _long_tables(run, corr, qstats, qdeltas, start, end)

    # -- configuration and files
    b.append(Block("h2", "Configuration (manifest.json)"))
    general, params, versions = _config(run)
    b.append(Block("table", general))
    b.append(Block("h2", "Parameters"))
    if params:
        b.append(Block("table", _kv_table(params).rename(columns={"name": "parameter"})))
    else:
        b.append(Block("p", "No params in the manifest."))
    if versions:
        b.append(Block("h2", "Versions"))
        b.append(Block("table", _kv_table(versions).rename(columns={"name": "component", "value": "version"})))
    b.append(Block("h2", "Files"))
    b.append(Block("table", _file_rows(run)))
    return b


# --------------------------------------------------------------------------- rendering

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1100px;color:#222;
padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.alert{background:#fde2e2;border:2px solid #c00;color:#900;padding:.7em 1em;font-weight:bold}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
caption{caption-side:bottom;font-size:.85em;color:#555;text-align:left}
.false{color:#c00;font-weight:bold}
"""


def _is_num(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _html_table(df: pd.DataFrame, caption: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in df.columns)
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for v in rec:
            t = fmt(v)
            cls = ' class="num"' if _is_num(t) else (' class="false"' if t.startswith("FALSE") else "")
            cells.append(f"<td{cls}>{e(t)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{e(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def render_html(blocks: list[Block], title: str) -> str:
    """One self-contained HTML page (inline CSS, PNGs as base64 data URIs, no scripts)."""
    e = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{e(title)}</title><style>{_CSS}</style></head><body>"]
    for b in blocks:
        if b.kind in ("h1", "h2"):
            out.append(f"<{b.kind}>{e(b.content)}</{b.kind}>")
        elif b.kind == "p":
            out.append(f"<p>{e(b.content)}</p>")
        elif b.kind == "alert":
            out.append(f'<div class="alert" role="alert">{e(b.content)}</div>')
        elif b.kind == "list":
            out.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in b.content) + "</ul>")
        elif b.kind == "table":
            out.append(_html_table(b.content, b.caption))
        elif b.kind == "img":
            data = base64.b64encode(Path(b.content[0]).read_bytes()).decode("ascii")
            out.append(f'<figure><img alt="{e(b.caption)}" src="data:image/png;base64,{data}">'
                       f"<figcaption>{e(b.caption)}</figcaption></figure>")
        elif b.kind == "pre":
            out.append(f"<pre>{e(b.content)}</pre>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    """A DataFrame as a GitHub-flavoured Markdown table (values through :func:`fmt`)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(_md_cell(c) for c in cols) + " |",
             "|" + "|".join("---:" if df[c].dtype.kind in "iuf" else "---" for c in df.columns) + "|"]
    for rec in df.itertuples(index=False):
        lines.append("| " + " | ".join(_md_cell(fmt(v)) for v in rec) + " |")
    return "\n".join(lines)


def render_markdown(blocks: list[Block]) -> str:
    """The same blocks as Markdown; images link to their PNG files by relative path."""
    out: list[str] = []
    for b in blocks:
        if b.kind == "h1":
            out.append(f"# {b.content}")
        elif b.kind == "h2":
            out.append(f"## {b.content}")
        elif b.kind == "p":
            out.append(str(b.content))
        elif b.kind == "alert":
            out.append(f"> **{b.content}**")
        elif b.kind == "list":
            out.append("\n".join(f"- {x}" for x in b.content))
        elif b.kind == "table":
            out.append(md_table(b.content) + (f"\n\n*{b.caption}*" if b.caption else ""))
        elif b.kind == "img":
            out.append(f"![{b.caption}]({b.content[1]})\n\n*{b.caption}*")
        elif b.kind == "pre":
            out.append(f"```\n{b.content}\n```")
    return "\n\n".join(out) + "\n"


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
    return html_path, md_path
