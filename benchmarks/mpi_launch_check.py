#!/usr/bin/env python3
"""Do MPI launches on the fabric start every time? (a check, not a test; needs root, builds fabrics)

    sudo .venv/bin/python benchmarks/mpi_launch_check.py [--launches 20] [--ranks 4] [--start-timeout-s 30]

Runs the program scenario ``--launches`` times in a row, each a fresh 2x2 leaf-spine with a 4-rank mpirun of
examples/programs/mpi_allreduce.py (3 iterations), as ``testbed run program --set launcher=mpi`` does. A launch
that starts no rank within ``--start-timeout-s`` ends with the program's one line naming the hosts whose daemons came
up (testbed.workloads.mpirun.StartWatch) and counts as a hang. Prints each launch, then how many started and
finished, and the launch-to-exit time as a median with its distribution-free interval (analysis.stats); exit status
1 if any launch did not finish. Measured numbers are in docs/programs.md ("Why each host has its own name").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis.stats import estimate  # noqa: E402
from testbed.commands.runner import run_scenario  # noqa: E402
from testbed.errors import RunFailed, require_root  # noqa: E402
from testbed.scenario import get  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def launch(out: Path, ranks: int, start_timeout_s: float, timeout_s: float) -> tuple[str, float, str]:
    """One launch: ("ok" | "no rank" | "failed", seconds, the failure's line)."""
    sc = get("program")
    p = {x.name: x.default for x in sc.params}
    p.update(cmd=f"python3 {ROOT}/examples/programs/mpi_allreduce.py --iterations 3", launcher="mpi", ranks=ranks,
             start_timeout_s=start_timeout_s, timeout_s=timeout_s, hosts_per_leaf=max(2, -(-ranks // 2)))
    sc.validate(p)
    t0 = time.monotonic()
    try:
        s = run_scenario(sc, p, 1, out, quiet=True)
    except RunFailed as e:
        return ("no rank" if "started no rank" in str(e) else "failed"), time.monotonic() - t0, str(e)
    return ("ok" if s.get("steps_reported", 0) > 0 else "failed"), time.monotonic() - t0, ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--start-timeout-s", type=float, default=30.0)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--stop-after", type=int, default=3, help="stop after this many launches that did not finish "
                    "(0: never; the fabric is shared, a broken launcher should not hold it for n x the bound)")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary directory, removed)")
    a = ap.parse_args(argv)
    require_root("benchmarks/mpi_launch_check.py (it builds fabrics)")
    with tempfile.TemporaryDirectory(prefix="mpi-launch-") as tmp:
        base = Path(a.out) if a.out else Path(tmp)
        rows = []
        for i in range(a.launches):
            outcome, took_s, line = launch(base / f"launch-{i:02d}", a.ranks, a.start_timeout_s, a.timeout_s)
            rows.append({"launch": i, "outcome": outcome, "s": round(took_s, 2), "line": line})
            print(json.dumps(rows[-1]), flush=True)
            if a.stop_after and sum(r["outcome"] != "ok" for r in rows) >= a.stop_after:
                print(f"stopped after {a.stop_after} launch(es) that did not finish", flush=True)
                break
    ok = [r["s"] for r in rows if r["outcome"] == "ok"]
    hung = sum(r["outcome"] == "no rank" for r in rows)
    print(f"{len(ok)} of {len(rows)} launches of {a.ranks} ranks started and finished; {hung} started no rank "
          f"within {a.start_timeout_s:g} s; {len(rows) - len(ok) - hung} failed otherwise; run time (fabric build, "
          f"launch, 3 all-reduces, teardown) {estimate(ok).text('{:.2f}')} s")
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
