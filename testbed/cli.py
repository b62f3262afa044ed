"""The `testbed` command: one entry point, one subcommand per job.

    testbed doctor [--json]      what this kernel can do, probed by function
    testbed doctor --noise       this machine's noise floor: a reference battery's spread over repeated runs
    testbed vm [--] CMD ...      run CMD as root inside the lab VM (a full stock kernel)
    testbed run SCENARIO ...     build a fabric, run a scenario's traffic, write a run directory
    testbed clean                remove everything a killed run left behind
    testbed report RUN_DIR       write report.html / report.md for a run directory
    testbed compare A B          is A different from B? runs or repeat folders: medians, CIs, a verdict
    testbed draw RUN_DIR         save a picture of the fabric, each port coloured by its peak backlog or drops
    testbed trace RUN_DIR        write the run's timeline as a Perfetto / Chrome trace (trace.json)
    testbed sweep SCENARIO ...   one run per value of one parameter, then a table and plots
    testbed cli [--set ...]      build a fabric and open Mininet's CLI on it (pingall, h1 ping h4, tc -s ...)
    testbed lab list|show|run|check   classroom labs: handouts, their runs, automatic checking
    testbed audit [--set ...] [--scale 1,2,4]   scaling efficiency from N to 4N ranks, with a verdict
    testbed budget [--set ...] [--jitter ...]   how much compute jitter and straggling a job absorbs (its knee)
    testbed burnin [--set ...] [--fault ...]   burn-in battery: every host, link and leaf checked, outliers named
    testbed place --set ranks=N [--health F]   admission control: place, hold or refuse a job (builds nothing)
    testbed jobs FILE.toml [--solo]     several jobs on one fabric at once; each job's slowdown from its neighbours
    testbed canary --change K=V [--canary leaf1]   a tuning change tried on a canary slice, rolled out or back
    testbed servers check|clean FILE   the machines of a servers file: ssh, version, kernel, MTU, VXLAN, clock

Bad input and missing capabilities end with one line on stderr and exit status 2, before anything is created.
A run that starts and then fails (an agent error, a data mismatch) ends with one line and exit status 1.
"""

from __future__ import annotations

import argparse
import sys

from testbed import __version__
from testbed.commands import audit, budget, burnin, explore, jobs
from testbed.commands import canary as canaries
from testbed.commands import draw as drawing
from testbed.commands import trace as tracing
from testbed.commands import place as placing
from testbed.commands import servers as serverchecks
from testbed.commands import labs as classlabs
from testbed.commands.argparsing import OneLineErrorParser
from testbed.errors import RunFailed, UsageError
from testbed.params import SEED_HELP, parse_seed

# Every command starts here, and `testbed --help` must answer at once: what only one command needs (the runner,
# sweep and clean with Mininet and pyroute2, doctor, the lab VM, pandas through analysis, run directories) is
# imported inside that command's function. Measured: `python -X importtime -m testbed.cli --help` imports ~30 ms of
# modules; the runner alone adds ~300 ms (Mininet, pyroute2), analysis ~250 ms (pandas).


# one-line usage errors, exit status 2 (also used by the runner: testbed/commands/argparsing.py)
_Parser = OneLineErrorParser


def _cmd_doctor(args: argparse.Namespace) -> int:
    if args.noise:
        from testbed.commands import noise

        return noise.main(repeats=args.repeat, out=args.out, as_json=args.json)
    from testbed.kernel import doctor

    return doctor.main(as_json=args.json, only=args.only)


def _cmd_vm(args: argparse.Namespace) -> int:
    from testbed.vm import labvm

    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    opts = labvm.VmOptions(memory=args.memory, cpus=args.cpus, kvm=args.kvm, rwdirs=args.rwdir or [],
                           verbose=args.verbose, timeout_s=args.timeout)
    return labvm.run(argv, opts)


def _cmd_clean(args: argparse.Namespace) -> int:
    if args.servers:
        return serverchecks.clean_main(args.servers, dry_run=args.dry_run)
    from testbed.commands import clean

    return clean.main(dry_run=args.dry_run)


def _cmd_run(args: argparse.Namespace, extra: list[str]) -> int:
    from testbed.commands import runner

    return runner.main(args, extra)


def _run_dir_arg(path: str):
    """A run directory given on the command line: UsageError (one line) when it is missing or unreadable."""
    from pathlib import Path

    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such run directory: {path}")
    if not p.is_dir():
        raise UsageError(f"not a run directory (not a folder): {path}")
    if not (p / "manifest.json").is_file():
        raise UsageError(f"not a run directory (no manifest.json): {path}")
    return p


def _cmd_report(args: argparse.Namespace) -> int:
    from analysis.load import RunDirError
    from analysis.report import write_report
    from testbed.rundir import check_out_dir

    run_dir = _run_dir_arg(args.run_dir)
    if args.out:  # where the report goes: one line and exit 2 before anything is written
        check_out_dir(args.out)
    else:
        try:
            check_out_dir(run_dir, "RUN_DIR")
        except UsageError as e:
            raise UsageError(f"{e} (write the report elsewhere with --out DIR)") from None
    try:
        html_path, md_path = write_report(run_dir, args.out, slides=args.slides)
    except RunDirError as e:
        raise UsageError(str(e)) from None
    except PermissionError as e:
        raise UsageError(f"cannot write the report: {e.strerror}: {e.filename} (choose a folder with --out DIR)"
                         ) from None
    print(html_path)
    print(md_path)
    if args.slides:
        from analysis.slides import SLIDES_FILE

        print(html_path.parent / SLIDES_FILE)
    return 0


def _side_arg(path: str):
    """A compare argument: a run directory or a repeat folder (analysis.repeats), else UsageError (one line)."""
    from pathlib import Path

    from analysis.repeats import is_repeat_folder

    p = Path(path)
    if p.is_dir() and not (p / "manifest.json").is_file() and is_repeat_folder(p):
        return p
    if p.is_dir() and not (p / "manifest.json").is_file():
        raise UsageError(f"not a run directory (no manifest.json) nor a repeat folder (no seed-N/ runs): {path}")
    return _run_dir_arg(path)


def _cmd_compare(args: argparse.Namespace) -> int:
    from analysis.load import RunDirError
    from analysis.repeats import is_repeat_folder
    from testbed.commands import compare as comparing
    from testbed.rundir import check_out_dir

    dirs = [_side_arg(d) for d in args.run_dirs]
    repeats = [d for d in dirs if is_repeat_folder(d)]
    if repeats and len(dirs) != 2:
        raise UsageError(f"compare with a repeat folder takes two sides, A and B (got {len(dirs)} folders)")
    if not 0.5 <= args.level < 1:
        raise UsageError(f"--level is a confidence level between 0.5 and 1, e.g. 0.95 (got {args.level})")
    if args.out:  # one line and exit 2 before anything is written
        check_out_dir(args.out)
    try:
        if repeats:
            return comparing.sides(dirs[0], dirs[1], args.out, args.level)
        return comparing.runs(dirs, args.out)
    except RunDirError as e:
        raise UsageError(str(e)) from None
    except PermissionError as e:
        raise UsageError(f"cannot write compare.html/csv/md: {e.strerror}: {e.filename}") from None


def _cmd_sweep(args: argparse.Namespace) -> int:
    from testbed.commands import sweep

    return sweep.main(args)


def _add_doctor(sub) -> None:
    """`testbed doctor`: probe this kernel."""
    d = sub.add_parser("doctor", help="probe what this kernel can do (qdiscs, TCP, OVS, Mininet, SoftRoCE)",
                       description="Probe the running kernel by function: in a scratch network namespace try "
                       "each qdisc, classifier, action and TCP congestion control the project uses, Open vSwitch, "
                       "Mininet and SoftRoCE across namespaces. Exit 0 when everything needed is present, 1 when "
                       "something is missing, 2 on bad use.")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.add_argument("--only", action="append", metavar="NAME",
                   help="probe only this capability (repeatable; see the names in the table)")
    d.add_argument("--noise", action="store_true",
                   help="measure this machine's noise floor instead: a small incast and a small ring all-reduce, "
                   "each run --repeat times, and the spread of their key metrics (docs/analysis.md); run it in the "
                   "lab VM too: testbed vm -- testbed doctor --noise")
    d.add_argument("--repeat", type=int, default=5, metavar="N", help="--noise: runs of each reference run (default 5)")
    d.add_argument("--out", metavar="FILE", default=None,
                   help="--noise: where to write the floor (default results/noise/host.json or lab-vm.json)")
    d.set_defaults(func=_cmd_doctor)


def _add_vm(sub) -> None:
    """`testbed vm -- CMD`: run a command in the lab VM."""
    v = sub.add_parser("vm", help="run a command as root inside the lab VM (full stock kernel)",
                       description="Run CMD as root inside a throwaway microVM (virtme-ng + QEMU) booted with the "
                       "installed Debian kernel over the host filesystem. The working directory, PATH and "
                       "virtualenv are the same inside; the checkout, the working directory, every `--out DIR` in "
                       "CMD and every --rwdir are writable at the same paths. CMD's output is streamed and its "
                       "exit status returned.")
    v.add_argument("--memory", default="3G", help="guest memory (default 3G)")
    v.add_argument("--cpus", type=int, default=0, help="guest vCPUs (default: all host cores)")
    v.add_argument("--kvm", default="auto", choices=["auto", "on", "off"],
                   help="KVM acceleration: auto (try once, cache the verdict), on, off (default auto)")
    v.add_argument("--rwdir", action="append", metavar="DIR", help="also make DIR writable in the guest")
    v.add_argument("--timeout", type=float, default=None, metavar="SECONDS", help="kill the VM after this long")
    v.add_argument("--verbose", action="store_true", help="show the VM's boot console")
    v.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD", help="the command to run")
    v.set_defaults(func=_cmd_vm)


def _add_clean(sub) -> None:
    """`testbed clean`: remove what a killed run left behind."""
    c = sub.add_parser("clean", help="remove namespaces, links, rxe devices, OVS bridges and agents left by a "
                       "killed run", description="Remove everything the project created and a killed run left "
                       "behind: network namespaces and links named with the project's prefix, rxe devices on "
                       "them, its OVS bridges, agent processes, and restore the sysctls it changed. Reports what it "
                       "removed. Touches nothing the project did not create.")
    c.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    c.add_argument("--servers", metavar="FILE", help="clean every server of this servers file instead, each through "
                   "its agent over ssh (localhost in the file: this machine); as `testbed servers clean FILE`")
    c.set_defaults(func=_cmd_clean)


def _add_report(sub) -> None:
    """`testbed report RUN_DIR`."""
    rp = sub.add_parser("report", help="write report.html and report.md for a run directory",
                        description="Write report.html (one self-contained file: tables and plots embedded) and "
                        "report.md (text tables, plots as PNG files in report_files/) for RUN_DIR, and print their "
                        "paths. Reads only the folder; needs no root and no kernel features.")
    rp.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (has manifest.json)")
    rp.add_argument("--out", default=None, metavar="DIR", help="write the report here (default: RUN_DIR)")
    rp.add_argument("--slides", action="store_true",
                    help="also write slides.html: a few full-screen slides (the story, the key plot, the timeline, "
                    "what to look at next) to project; Page Down moves from one to the next")
    rp.set_defaults(func=_cmd_report)


def _add_compare(sub) -> None:
    """`testbed compare A B` (or several run directories)."""
    cp = sub.add_parser("compare", help="is A different from B? runs or repeat folders, with intervals and a verdict",
                        description="A B, each a run directory or a repeat folder (--repeat N). First what differs: "
                        "every configuration value not the same on both sides (scenario, parameters, text ones such "
                        "as cc or discipline included, host or lab VM, kernel, commit). Then per metric each side's "
                        "median with its 95% confidence interval, the ratio A/B with its interval (a change from or "
                        "to 0 reads 0 -> 664 (new)), and a verdict: A > B, A < B or not distinguishable (n runs), "
                        "with about how many runs would tell; rows with a verdict first, then by the size of the "
                        "change. Unfaithful runs are named and left out. Several run directories (no repeat folder): "
                        "their metrics side by side with each run's ratio to the first, largest change first, and "
                        "no verdict (one run a side cannot tell). With --out, also write compare.html (the verdicts, "
                        "then both sides' distributions and the CDFs of their round, op, step and backlog samples "
                        "overlaid), compare.csv and compare.md there. Needs no root.")
    cp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                    help="run directories or repeat folders; the first is A (the baseline)")
    cp.add_argument("--out", default=None, metavar="DIR",
                    help="write compare.html, compare.csv, compare.md and their pictures into DIR")
    cp.add_argument("--level", type=float, default=0.95, metavar="L",
                    help="confidence level of the intervals and the test (default 0.95)")
    cp.set_defaults(func=_cmd_compare)


def _add_sweep(sub) -> None:
    """`testbed sweep SCENARIO --set NAME=V1,V2,...`."""
    sw = sub.add_parser("sweep", help="run a scenario once per value of one parameter, then tabulate and plot",
                        description="Run SCENARIO once per value of the one parameter given as a comma list "
                        "(--set senders=2,4,8) into DIR/<name>=<value>/, then write DIR/sweep.csv (one row per "
                        "point: the value and every numeric summary metric), DIR/sweep.md and DIR/sweep_<metric>.png. "
                        "Every point is validated before the first run. When this kernel lacks what the scenario "
                        "needs, the whole sweep runs inside one lab VM.")
    sw.add_argument("scenario", metavar="SCENARIO", help="scenario name (testbed run --list)")
    sw.add_argument("--set", action="append", default=[], metavar="NAME=V1,V2,...",
                    help="a parameter value; exactly one parameter takes a comma list (repeatable)")
    sw.add_argument("--seed", type=parse_seed, default=1, metavar="N",
                    help=f"seed of every point, {SEED_HELP} (default 1)")
    sw.add_argument("--out", default=None, metavar="DIR", help="sweep folder (default results/sweep-SCENARIO-TIME); "
                    "refused when it cannot be created or written")
    sw.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                    help="run in the lab VM: auto (when this kernel lacks a capability), always, never")
    sw.add_argument("--quiet", action="store_true", help="only the sweep's own progress lines")
    sw.add_argument("--repeat", type=int, default=None, metavar="N",
                    help="N runs a point (seeds --seed .. --seed+N-1), each point a repeat folder; the table holds "
                    "medians with their 95%% CI (docs/analysis.md)")
    sw.set_defaults(func=_cmd_sweep)


def _add_run(sub) -> None:
    """`testbed run SCENARIO` (its own options are parsed by testbed.commands.runner)."""
    r = sub.add_parser("run", help="run a scenario (see --list)", add_help=False,
                       description="Run SCENARIO: build its fabric, run its traffic, write a run directory, "
                       "print a summary table. `testbed run --list` lists scenarios; `testbed run SCENARIO --help` "
                       "lists every parameter with unit, default and range.")
    r.add_argument("scenario", nargs="?", help="scenario name")
    r.add_argument("--list", action="store_true", help="list the scenarios")
    r.add_argument("-h", "--help", action="store_true", help="show help (for a scenario: its parameters)")
    r.set_defaults(func=None, run=True)


def build_parser() -> argparse.ArgumentParser:
    """The `testbed` parser: one subparser per command (each added by the command's own function)."""
    p = _Parser(prog="testbed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=__version__)
    sub = p.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", parser_class=_Parser)
    for add in (_add_doctor, _add_vm, _add_clean, _add_report, _add_compare, _add_sweep, explore.add_parser,
                classlabs.add_parser, audit.add_parser, budget.add_parser, burnin.add_parser, jobs.add_parser,
                _add_run):
        add(sub)
    canaries.add_parser(sub)
    drawing.add_parser(sub)
    tracing.add_parser(sub)
    placing.add_parser(sub)
    serverchecks.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 2
    try:
        if argv[0] == "run":
            args, extra = parser.parse_known_args(argv)
            return _cmd_run(args, extra)
        args = parser.parse_args(argv)
        return args.func(args)
    except (UsageError, RunFailed) as e:
        print(f"testbed: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
