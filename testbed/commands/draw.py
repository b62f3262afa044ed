"""`testbed draw RUN_DIR`: save a picture of a run's fabric, each egress port coloured by what its queue did.

    testbed draw results/incast-...                       # RUN_DIR/topology-backlog.png: peak backlog per port
    testbed draw results/incast-... --by drops --out drops.png

Hosts at the bottom, then tiers by hop distance from the hosts (leaves, spines; any topology the run built), every
link, every egress port coloured by its peak backlog (``backlog``, ``packets``) or its drop / ECN-mark count over the
run (``drops``, ``marks``), the hottest ports labelled with their value (analysis.topopicture). Reads ports.csv and
queues.csv; needs no root. Bad input (no such run directory, a run without those files, an output that cannot be
written) is one line and exit status 2, with nothing written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.errors import UsageError

# `testbed --help` imports this module: analysis (pandas, matplotlib) is imported inside main.

#: what --by accepts (analysis.topopicture.BY, repeated here so that --help does not import analysis)
BY = ("backlog", "packets", "drops", "marks")
FORMATS = (".png", ".svg", ".pdf")


def add_parser(sub) -> None:
    d = sub.add_parser("draw", help="save a picture of a run's fabric, each port coloured by peak backlog or drops",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (with ports.csv and queues.csv)")
    d.add_argument("--out", default=None, metavar="FILE",
                   help="where to save it (.png, .svg or .pdf; default RUN_DIR/topology-BY.png)")
    d.add_argument("--by", default="backlog", choices=BY,
                   help="colour each port by its peak backlog (bytes; packets when the run's queues are sized in "
                        "packets), peak backlog in packets, drops or ECN marks (default backlog)")
    d.set_defaults(func=main)


def _out_path(args: argparse.Namespace, run_dir: Path) -> Path:
    """The file to write, checked before anything is drawn: UsageError (one line) when it cannot be written."""
    from testbed.rundir import check_out_dir

    if args.out is None:
        check_out_dir(run_dir, "RUN_DIR")
        return run_dir / f"topology-{args.by}.png"
    out = Path(args.out)
    if out.is_dir():
        raise UsageError(f"--out {args.out}: is a directory; name a file")
    if out.suffix.lower() not in FORMATS:
        raise UsageError(f"--out {args.out}: name a .png, .svg or .pdf file")
    check_out_dir(out.parent if str(out.parent) else ".", "--out")
    return out


def main(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"no such run directory: {args.run_dir}")
    if not (run_dir / "manifest.json").is_file():
        raise UsageError(f"not a run directory (no manifest.json): {args.run_dir}")
    for name in ("ports.csv", "queues.csv"):
        if not (run_dir / name).is_file():
            raise UsageError(f"{args.run_dir}: no {name}: the picture needs the fabric as built (ports.csv) and the "
                             "queue samples (queues.csv)")
    out = _out_path(args, run_dir)
    from analysis.load import RunDirError
    from analysis.topopicture import NothingToDraw, draw

    try:
        path = draw(run_dir, out, args.by)
    except (RunDirError, NothingToDraw) as e:
        raise UsageError(str(e)) from None
    except PermissionError as e:
        raise UsageError(f"cannot write the picture: {e.strerror}: {e.filename}") from None
    print(path)
    return 0
