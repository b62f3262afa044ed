"""Benchmark (not a test): `testbed report` on a synthetic run directory with 1e6 queues.csv rows.

    .venv/bin/python benchmarks/report_1e6.py [--rows 1000000] [--keep DIR]

Builds a collective-like run: 8 switch ports sampled every 1 ms (rows / 8 samples each, cumulative drop /
mark / sent counters), 4 ranks x 50 iterations x 2 ops in ops.csv, a few PFC pauses, tcp.csv and cpu.csv.
Then times `python -m testbed.cli report RUN_DIR` end to end (a fresh process: imports, loading, metrics,
plots, HTML) and prints the seconds, plus an in-process breakdown (load / key metrics / whole report).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(run: Path, rows: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    run.mkdir(parents=True, exist_ok=True)
    ports = [("leaf1", f"eth{i}") for i in range(4)] + [("spine1", f"eth{i}") for i in range(4)]
    n = rows // len(ports)
    t0 = 1000.0
    t = t0 + np.arange(n) * 1e-3
    frames = []
    for k, (node, port) in enumerate(ports):
        backlog = np.clip(rng.normal(20_000 + 5_000 * k, 15_000, n), 0, 200_000).astype(np.int64)
        frames.append(pd.DataFrame({
            "t_s": np.round(t, 6), "node": node, "port": port, "class": "1:10",
            "backlog_bytes": backlog, "backlog_packets": backlog // 1500,
            "drops": np.cumsum(rng.random(n) < 0.01), "marks": np.cumsum(rng.random(n) < 0.05),
            "sent_bytes": np.cumsum(rng.integers(0, 3000, n)), "sent_packets": np.cumsum(rng.integers(0, 3, n)),
            "overlimits": np.zeros(n, dtype=np.int64)}))
    q = pd.concat(frames).sort_values("t_s", kind="stable")
    q.to_csv(run / "queues.csv", index=False)
    span = n * 1e-3
    ops = []
    iters, per_it = 50, span / 50
    for it in range(iters):
        for op_index, (op, coll) in enumerate((("grad", "allreduce"), ("emb", "allgather"))):
            s = t0 + it * per_it + op_index * per_it / 2
            for rank in range(4):
                st = s + rng.random() * 1e-3
                ops.append((it, op, op_index, coll, rank, f"h{rank}", round(st, 6),
                            round(st + per_it * (0.2 + 0.2 * rng.random()), 6), 1_000_000, 1_000_000,
                            round(rng.random() * 0.01, 6)))
    pd.DataFrame(ops, columns=["iteration", "op", "op_index", "collective", "rank", "host", "start_s", "end_s",
                               "bytes_sent", "bytes_recv", "wait_s"]).to_csv(run / "ops.csv", index=False)
    pfc = [(t0 + span * f, "spine1", "eth1", 3, ev, 50_000) for f, ev in
           ((0.1, "xoff"), (0.12, "xon"), (0.5, "xoff"), (0.53, "xon"), (0.9, "xoff"))]
    pd.DataFrame(pfc, columns=["t_s", "node", "port", "prio", "event", "backlog_bytes"]).to_csv(run / "pfc.csv",
                                                                                                 index=False)
    tcp = [(f"h{i}", ph, c, v) for i in range(4) for ph, c, v in
           (("before", "TcpOutSegs", 0), ("after", "TcpOutSegs", 100_000), ("before", "TcpRetransSegs", 0),
            ("after", "TcpRetransSegs", 50 * (i + 1)))]
    pd.DataFrame(tcp, columns=["host", "phase", "counter", "value"]).to_csv(run / "tcp.csv", index=False)
    pd.DataFrame({"t_s": t[::100], "busy_fraction": rng.random(len(t[::100]))}).to_csv(run / "cpu.csv", index=False)
    (run / "manifest.json").write_text(json.dumps({
        "scenario": "bench-1e6", "params": {"rows": rows}, "seed": seed, "topology": "synthetic",
        "started_wall": 1_700_000_000.0, "ended_wall": 1_700_000_000.0 + span, "t0_monotonic": t0,
        "kernel_release": "synthetic", "versions": {}, "git_commit": None, "complete": True}, indent=2))
    (run / "summary.json").write_text(json.dumps({"queue_rows": int(len(q))}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keep", default=None, help="build the run directory here and keep it")
    a = ap.parse_args()
    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="report-bench-"))
    run = base / "run"
    t = time.perf_counter()
    build(run, a.rows)
    print(f"built {run} ({a.rows} queue rows, {(run / 'queues.csv').stat().st_size / 1e6:.0f} MB) in "
          f"{time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(run)], cwd=ROOT, capture_output=True,
                       text=True)
    cli_s = time.perf_counter() - t
    if r.returncode != 0:
        print(r.stdout, r.stderr, file=sys.stderr)
        return 1
    html = run / "report.html"
    print(f"testbed report: {cli_s:.2f} s (report.html {html.stat().st_size / 1e3:.0f} kB)")

    from analysis.load import load_run
    from analysis.report import key_metrics, write_report

    t = time.perf_counter()
    loaded = load_run(run)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    key_metrics(loaded)
    km_s = time.perf_counter() - t
    t = time.perf_counter()
    write_report(run)
    rep_s = time.perf_counter() - t
    print(f"in process: load_run {load_s:.2f} s, key_metrics {km_s:.2f} s, write_report (incl. load) {rep_s:.2f} s")
    print(f"{cli_s:.2f}")
    if not a.keep:
        import shutil

        shutil.rmtree(base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
