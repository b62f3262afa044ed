"""`testbed trace RUN_DIR`: write a run's timeline as a Perfetto / Chrome trace (trace.json) and say how to open it.

    testbed trace results/allreduce-...                   # RUN_DIR/trace.json
    testbed trace results/allreduce-... --out /tmp/t.json

One process per host and one track per rank (ops as slices with their "waiting for the last rank" and "transfer"
parts, compute between them), a fabric process with the busiest ports' backlog and PFC pauses as counter tracks,
faults and drops as instant events, all on the run's own clock (analysis.trace). `testbed report` writes the same
file; this command writes it alone, quickly. Open it at https://ui.perfetto.dev (Open trace file) or in Chrome's
chrome://tracing. Bad input is one line and exit status 2, with nothing written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.errors import UsageError


def add_parser(sub) -> None:
    t = sub.add_parser("trace", help="write a run's timeline as a Perfetto / Chrome trace (trace.json)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("run_dir", metavar="RUN_DIR", help="a run directory")
    t.add_argument("--out", default=None, metavar="FILE", help="where to write it (default RUN_DIR/trace.json)")
    t.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from testbed.rundir import check_out_dir

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"no such run directory: {args.run_dir}")
    if not (run_dir / "manifest.json").is_file():
        raise UsageError(f"not a run directory (no manifest.json): {args.run_dir}")
    out = Path(args.out) if args.out else None
    if out is not None and (out.is_dir() or out.suffix.lower() != ".json"):
        raise UsageError(f"--out {args.out}: name a .json file")
    check_out_dir(out.parent if out is not None and str(out.parent) else run_dir, "--out" if out else "RUN_DIR")
    from analysis.load import RunDirError, load_run
    from analysis.trace import write_trace

    try:
        run = load_run(run_dir)
        path = write_trace(run, out)
    except RunDirError as e:
        raise UsageError(str(e)) from None
    print(f"{path}  (open it at https://ui.perfetto.dev or chrome://tracing)")
    return 0
