#!/usr/bin/env python3
"""PFC alone vs PFC + DCQCN on a lossless RDMA incast, repeated, compared with analysis.stats (docs/dcqcn.md,
"What it shows"). Runs in the lab VM (rxe, sch_red, sch_fq):

    testbed vm -- .venv/bin/python scripts/dcqcn_compare.py --runs 5 --out results/dcqcn-compare
    testbed vm -- .venv/bin/python scripts/dcqcn_compare.py --runs 3 --set time_scale=400 --modes dcqcn

A fabric per run (testbed.workloads.dcqcn_incast: h3, h4 on leaf2 write 1.5 MiB each to h1 on leaf1 through a 5 Mbit/s
downlink), the modes alternated run by run so that a drift of the shared machine hits both alike. Each run's
numbers are appended to OUT/runs.jsonl; the medians with their 95% intervals and each metric's comparison are
printed over every run there with the same settings (so the runs can be made in several shorter invocations).
``--set`` takes testbed.workloads.dcqcn.DcqcnSettings' fields (time_scale, cnp_interval_ms, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.stats import compare, estimate  # noqa: E402
from testbed.errors import UsageError  # noqa: E402
from testbed.params import resolve  # noqa: E402
from testbed.workloads.dcqcn import DCQCN_PARAMS, DcqcnSettings  # noqa: E402

METRICS = ("pause_events", "switch_pause_events", "paused_ms", "peak_backlog_bytes", "cct_s", "utilisation")


def settings_of(sets: list[str]) -> DcqcnSettings:
    return DcqcnSettings.from_params(resolve(DCQCN_PARAMS, [f"dcqcn_{s}" for s in sets]))


def summarize(log: Path, sets: list[str]) -> None:
    """Medians with 95% intervals per mode, and PFC + DCQCN against PFC alone, over every run in `log` made with
    the same settings (earlier invocations into the same folder included)."""
    rows = [r for r in map(json.loads, log.read_text().splitlines()) if r.get("settings") == sets]
    by = {m: [r for r in rows if r["mode"] == m] for m in ("pfc", "dcqcn")}
    for m, runs in by.items():
        for k in (*METRICS, "dcqcn_rate_cuts", "jain_last", "dcqcn_cnp_sent", "lossless_drops", "base_rtt_ms"):
            vals = [r[k] for r in runs if isinstance(r.get(k), (int, float)) and r[k] == r[k]]
            if vals:
                print(f"{m:6s} {k:20s} {estimate(vals).text()}  min {min(vals):.4g} max {max(vals):.4g}")
    if by["pfc"] and by["dcqcn"]:
        for k in METRICS:
            d = compare([r.get(k, math.nan) for r in by["dcqcn"]], [r.get(k, math.nan) for r in by["pfc"]])
            print(f"dcqcn/pfc {k:20s} ratio {d.ratio:.3f} [{d.ratio_low:.3f}, {d.ratio_high:.3f}] "
                  f"p={d.p_value:.3g} {d.verdict}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per mode")
    ap.add_argument("--out", default="results/dcqcn-compare")
    ap.add_argument("--modes", default="pfc,dcqcn", help="comma list of pfc (PFC alone) and dcqcn (PFC + DCQCN)")
    ap.add_argument("--set", action="append", default=[], help="a DCQCN setting, e.g. time_scale=400")
    a = ap.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    try:
        if a.runs < 1 or not modes or set(modes) - {"pfc", "dcqcn"}:
            raise UsageError("--runs must be >= 1 and --modes a list of pfc, dcqcn")
        from testbed.workloads import dcqcn_incast as inc

        settings = settings_of(a.set)
        settings.params(inc.HOST_MBPS)  # refused here, in one line, before anything is built
    except UsageError as e:
        print(f"dcqcn_compare: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with open(out / "runs.jsonl", "a") as log:
        for i in range(a.runs):
            for m in modes:
                n = inc.run_incast(out / f"{m}-{i}", settings, react=m == "dcqcn")
                row = {k: v for k, v in n.items() if k not in ("rates", "counters", "started")}
                row.update(mode=m, run=i, settings=a.set)
                log.write(json.dumps(row, default=str) + "\n")
                log.flush()
                print(json.dumps(row, default=str), flush=True)
                results[m].append(n)
    summarize(out / "runs.jsonl", a.set)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
