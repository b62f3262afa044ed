"""The report's sections that stand on their own: fidelity, the wire beside the end hosts, the long tables (slowest
ops, queues, host TCP counters, pauses), the metric table, configuration and the run's files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import pandas as pd

from . import metrics as m
from .fidelity import BACKLOGGED_MIN_S, PORT_RATE_MIN, SAMPLER_GAP_MAX_S, SAMPLER_LATE_MAX_MS
from .load import SCHEMAS, Run
from .render import Block, fmt


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


def kv_table(d: dict) -> pd.DataFrame:
    return pd.DataFrame({"name": list(d.keys()), "value": [fmt(v) for v in d.values()]})


def file_rows(run: Run) -> pd.DataFrame:
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


def config_tables(run: Run) -> tuple[pd.DataFrame, dict, dict]:
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
    return kv_table(general), params, versions


def metric_table(vals: dict[str, tuple[float, str]], names: Iterable[str], summary: dict) -> pd.DataFrame:
    """metric | value | from; a summary.json value is shown as written (``true``, not 1)."""
    names = list(names)
    return pd.DataFrame({"metric": names,
                         "value": [fmt(summary[k] if vals[k][1] == "summary" else vals[k][0]) for k in names],
                         "from": ["the files" if vals[k][1] == "data" else "summary.json" for k in names]})


#: the "10 slowest ops" table is shown when the slowest op took at least this many times the median op
SLOWEST_APART = 1.2


def slowest_apart(corr: pd.DataFrame | None) -> bool:
    """Do the slowest ops differ meaningfully from the median one (by :data:`SLOWEST_APART` or more)?"""
    if corr is None or corr.empty:
        return False
    med = m.nearest_rank(corr["cct_ms"].to_numpy(float), 0.5)
    return bool(med > 0 and float(corr["cct_ms"].max()) >= SLOWEST_APART * med)


def long_tables(run: Run, corr: pd.DataFrame | None, qstats, qdeltas, start: float, end: float) -> list[Block]:
    """The raw tables at the end: the 10 slowest ops (when they stand out from the median), queues per port, host
    TCP counters (those that moved), PFC pauses per link."""
    b: list[Block] = []
    if slowest_apart(corr):
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
            piv = td.pivot_table(index="counter", columns="host", values="delta", aggfunc="sum")
            zero = piv.index[(piv.fillna(0) == 0).all(axis=1)]
            piv = piv.drop(index=zero).reset_index()
            piv.columns = [str(c) for c in piv.columns]
            if len(piv):
                b.append(Block("table", piv, f"{len(zero)} counters that stayed 0 on every host omitted"
                               if len(zero) else ""))
            else:
                b.append(Block("p", f"All {len(zero)} recorded counters stayed 0 on every host."))
    if len(run.pfc):
        b.append(Block("h2", "PFC pauses per link"))
        b.append(Block("table", m.pause_fraction(run.pfc, start, end)))

    return b


def fidelity_line(run: Run, details: bool = True) -> Block | None:
    """One line: the emulation was faithful (green) or not, with the reason (red); ``details``: the page has a
    Fidelity section further down (:func:`fidelity_blocks`)."""
    s = run.summary or {}
    if "fidelity_ok" not in s:
        return None
    more = "; details under Fidelity below" if details else ""
    if s["fidelity_ok"] is False:
        why = s.get("fidelity_reasons") or ""
        why = "; ".join(why) if isinstance(why, list) else why
        return Block("alert", f"Fidelity: NOT faithful: {why or 'see fidelity.csv'}{more}.")
    return Block("ok", f"Fidelity: faithful, the emulation kept up (every check passed{more}).")


def fidelity_blocks(run: Run) -> list[Block]:
    """Did the emulation keep up, in detail: the sampler's timing, PFC's reaction, the ports judged while
    backlogged (the verdict itself is :func:`fidelity_line`)."""
    s = run.summary or {}
    out: list[Block] = []
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
    return [Block("h2", "Fidelity"), *out] if out else []


def _off(params: dict) -> set[str]:
    """Parameters of features this run left off: PFC's with PFC off, K with drop-tail, the watchdog's restore time
    with no watchdog, the loss host with no loss, the flowlet gap without flowlets, a straggler factor without
    stragglers."""
    off: set[str] = set()
    lossless = params.get("pfc") == "on" or str(params.get("mode", "")).startswith("lossless")
    if not lossless:
        off |= {k for k in params if k.startswith("pfc_")}
        off |= {"xoff_bytes", "xon_bytes", "headroom_bytes", "watchdog_ms", "watchdog_restore_ms", "poll_interval_ms",
                "pause_frames"}
    if params.get("discipline") == "droptail" and params.get("mode") != "lossless_ecn":
        off.add("k_bytes")
    for wd, restore in (("pfc_watchdog_ms", "pfc_watchdog_restore_ms"), ("watchdog_ms", "watchdog_restore_ms")):
        if params.get(wd) in (0, 0.0):
            off.add(restore)
    if params.get("loss_percent") in (0, 0.0):
        off.add("loss_host")
    if params.get("load_balancing") not in (None, "flowlet", "adaptive"):
        off.add("flowlet_gap_ms")
    if params.get("stragglers") in ("", None, 0):
        off.add("straggler_factor")
    if params.get("capture") == "":
        off.add("capture")
    return off & set(params)


def config_blocks(run: Run) -> list[Block]:
    """Configuration (manifest.json), the parameters of the features the run used, versions and the run's files
    (versions and files folded)."""
    general, params, versions = config_tables(run)
    b = [Block("h2", "Configuration (manifest.json)"), Block("table", general), Block("h2", "Parameters")]
    if params:
        off = _off(params)
        shown = {k: v for k, v in params.items() if k not in off}
        b.append(Block("table", kv_table(shown).rename(columns={"name": "parameter"}),
                       f"{len(off)} parameters of features this run left off omitted: {', '.join(sorted(off))}"
                       if off else ""))
    else:
        b.append(Block("p", "No params in the manifest."))
    if versions:
        b.append(Block("details", ("Versions", [Block("table", kv_table(versions).rename(
            columns={"name": "component", "value": "version"}))])))
    b.append(Block("details", ("Files", [Block("table", file_rows(run))])))
    return b
