"""`testbed run SCENARIO`: validate parameters, pick where to run (host or lab VM), build, run, write the run
directory, tear everything down (on success, failure and Ctrl-C), print the summary table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

# at import: a lazy import after dropping privileges fails in a 0700 checkout
from testbed import scenario as scenarios
from testbed.commands.argparsing import OneLineErrorParser
from testbed.errors import CapabilityMissing, UsageError, require_root
from testbed.faults import plan as faultplan
from testbed.kernel import doctor
from testbed.lab import Lab
from testbed.measure import liveview
from testbed.params import SEED_HELP, parse_seed, resolve
from testbed.rundir import check_out_dir, default_out
from testbed.scenario import Scenario
from testbed.vm import labvm
from testbed.workloads.serverlab import check as check_servers_run, servers_value
from topologies.mininet_topo import spec_from_topo
from topologies.spec import SpecError
from testbed.commands import repeat
from testbed.commands.repeat import check_repeat, print_repeats

__all__ = ["Scenario", "main", "run_repeats", "run_scenario", "use_vm", "print_table", "missing_capabilities"]


def _options(extra: list[str]) -> argparse.Namespace:
    p = OneLineErrorParser(prog="testbed run", add_help=False)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--seed", type=parse_seed, default=1, help=f"{SEED_HELP} (default 1)")
    p.add_argument("--out", default=None)
    p.add_argument("--vm", default="auto", choices=["auto", "always", "never"])
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--cli", action="store_true")
    p.add_argument("--live", action="store_true")
    p.add_argument("--fault", action="append", default=[], metavar="SPEC")
    p.add_argument("--faults", default=None, metavar="FILE")
    p.add_argument("--repeat", type=int, default=None, metavar="N")
    return p.parse_args(extra)


def parse_faults(scenario: Scenario, params: dict, seed: int, specs: list[str], path: str | None) -> list:
    """The --fault/--faults timeline, checked against the scenario's topology (UsageError, one line)."""
    faults = [faultplan.parse(s) for s in specs] + (faultplan.parse_file(path) if path else [])
    if not faults:
        return []
    try:
        spec = spec_from_topo(scenario.topology(params, seed))
    except SpecError as e:
        raise UsageError(str(e)) from None
    horizon, iterations = params.get("duration_s"), params.get("iterations")
    faultplan.check(faults, spec, float(horizon) if isinstance(horizon, (int, float)) else None,
                    int(iterations) if isinstance(iterations, int) else 0)
    return faults


def missing_capabilities(needs: Sequence[str]) -> list[str]:
    return doctor.missing(list(needs))


def use_vm(vm: str, needs: Sequence[str], in_vm: bool,
           missing: Callable[[Sequence[str]], list[str]] = missing_capabilities) -> bool:
    """Where a run goes: True = boot the lab VM, False = this kernel. ``vm`` is ``--vm`` (auto: the VM exactly
    when doctor says this kernel lacks one of ``needs``; always; never). CapabilityMissing (exit 2, naming the
    capabilities) when the run cannot go anywhere: ``never`` on a kernel that lacks something, or a lab VM kernel
    that lacks it. Decided before anything is created."""
    if in_vm:
        lacking = missing(needs)
        if lacking:
            raise CapabilityMissing(", ".join(lacking), "even the lab VM's kernel lacks it")
        return False
    if vm == "always":
        return True
    lacking = missing(needs)
    if lacking and vm == "never":
        raise CapabilityMissing(", ".join(lacking), "use --vm auto, or a kernel that has it")
    return bool(lacking)


def print_table(scenario: Scenario, summary: dict, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{scenario.name}: {out}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for key, label in scenario.table:
        v = summary.get(key)
        if isinstance(v, float):
            v = f"{v:.4g}"
        t.add_row(label, "-" if v is None else str(v))
    Console().print(t)
    if summary.get("fidelity_ok") is False:
        why = summary.get("fidelity_reasons") or "see fidelity.csv"
        print(f"this run is not faithful: {why if isinstance(why, str) else '; '.join(why)}")


def run_scenario(scenario: Scenario, params: dict, seed: int, out: Path, quiet: bool = False,
                 cli: bool = False, faults: Sequence = ()) -> dict:
    """Build, run and tear down one scenario run in this kernel on a :class:`~testbed.lab.Lab` (the one run path:
    state, run directory, teardown on success, failure, Ctrl-C and SIGTERM are the Lab's); return its summary.
    ``cli``: open Mininet's CLI once the fabric is up and again after the traffic; ``faults``:
    testbed.faults.plan faults played from the workload's start."""
    with Lab(scenario.topology(params, seed), out=out, seed=seed, name=scenario.name, params=params,
             rxe=scenario.rxe_for(params), quiet=quiet, servers=params.get("servers", 1),
             agents=scenario.agents) as lab:
        for f in faults:
            lab.at(f.at_s, f)
        if cli:
            lab.cli()
        lab.summary = scenario.run(params, lab)
        if cli:
            lab.cli()
    return lab.summary


def run_repeats(scenario: Scenario, params: dict, runs: int, out: Path, seed: int = 1, quiet: bool = False,
                faults: Sequence = (), say: Callable[[str], None] | None = None):
    """A scenario run ``runs`` times in this kernel, seeds seed .. seed+runs-1, into the repeat folder ``out``
    (testbed.commands.repeat.repeat around :func:`run_scenario`); returns its RepeatResult."""

    def one(d: Path, s: int) -> None:
        run_scenario(scenario, params, s, d, quiet=quiet, faults=faults)

    return repeat.repeat(one, runs, out, seed, scenario.name, say or repeat.say_stderr)


def _main_repeats(scenario: Scenario, params: dict, opts: argparse.Namespace, out: Path, faults: Sequence) -> int:
    """`testbed run SCENARIO --repeat N`: N runs into OUT/seed-<s>/, repeat.json, the table of medians and CIs.
    Exit status 1 when a run failed (the others are still summarized)."""

    result = run_repeats(scenario, params, opts.repeat, out, opts.seed, quiet=opts.quiet, faults=faults)
    print_repeats(result, scenario.table)
    print(out / "repeat.json")
    return 1 if result.failed else 0


def _check_servers_file_run(scenario, params: dict, faults: list, opts) -> None:
    """A servers file (``--set servers=FILE``): what a servers run cannot do yet, and the ways in it does not take
    (the CLI's node objects, the lab VM: the run starts on the file's first server, this machine), one line each
    before anything is made."""
    if isinstance(servers_value(params.get("servers", 1)), int):
        return
    check_servers_run(params, faults)
    if opts.cli:
        raise UsageError("servers=FILE: --cli is not built over servers yet (docs/servers.md)")
    if use_vm(opts.vm, [*scenario.needs_of(params), *faultplan.needs(faults)], labvm.in_vm()):
        raise UsageError("servers=FILE: a servers run starts on this machine (the file's first server), not in the "
                         "lab VM: drop --vm always, or run it on a server whose kernel has what it needs")


def main(args: argparse.Namespace, extra: list[str]) -> int:
    if args.list:
        for s in scenarios.all_scenarios():
            print(f"{s.name:<12} {s.summary}")
        return 0
    if not args.scenario:
        raise UsageError("testbed run: name a scenario (testbed run --list)")
    scenario = scenarios.get(args.scenario)
    if args.help:
        print(scenario.help())
        return 0
    opts = _options(extra)
    if opts.repeat is not None:

        check_repeat(opts.repeat, opts.seed)
        if opts.cli or opts.live:
            raise UsageError(f"--repeat runs {opts.repeat} runs unattended: drop --cli/--live (they watch one run)")
    params = resolve(scenario.params, opts.set)
    scenario.validate(params)
    faults = parse_faults(scenario, params, opts.seed, opts.fault, opts.faults)
    require_root(f"testbed run {scenario.name}")
    _check_servers_file_run(scenario, params, faults, opts)
    # an output folder that cannot be written is refused here: before doctor probes, a VM boot or a fabric
    out = check_out_dir(opts.out) if opts.out else check_out_dir(default_out(scenario.name), "--out (default)")

    if opts.cli and not labvm.in_vm() and not sys.stdin.isatty():
        raise UsageError("--cli needs a terminal")
    if use_vm(opts.vm, [*scenario.needs_of(params), *faultplan.needs(faults)], labvm.in_vm()):
        argv = ["testbed", "run", scenario.name, *sum((["--set", s] for s in opts.set), []),
                *sum((["--fault", str(f)] for f in faults), []),
                "--seed", str(opts.seed), "--out", str(out), "--vm", "never"]
        if opts.repeat is not None:
            argv += ["--repeat", str(opts.repeat)]
        if opts.quiet:
            argv.append("--quiet")
        else:
            why = "--vm always" if opts.vm == "always" else f"this kernel lacks what {scenario.name} needs"
            print(f"testbed: {why}; running it in the lab VM", file=sys.stderr)
        if opts.cli:  # the CLI inside the VM reads the lines typed here (testbed.vm.relay)
            argv.append("--cli")
        if opts.live:
            argv.append("--live")
        labvm.vm_kernel()  # fail early with the install hint
        return labvm.run(["env", "PYTHONUNBUFFERED=1", sys.executable, "-m", "testbed.cli", *argv[1:]],
                         labvm.VmOptions(interactive=opts.cli))

    if opts.repeat is not None:
        return _main_repeats(scenario, params, opts, out, faults)
    if opts.live:
        liveview.enable()
    summary = run_scenario(scenario, params, opts.seed, out, quiet=opts.quiet, cli=opts.cli, faults=faults)
    print_table(scenario, summary, out)
    if faults:
        print(f"faults: {summary.get('link_down_events', 0)} link down(s) for {summary.get('down_ms_total', 0):.0f} "
              f"ms, {summary.get('routes_withdrawn_events', 0)} route withdrawal(s) (reaction max "
              f"{summary.get('route_reaction_ms_max', float('nan')):.0f} ms), {summary.get('dead_link_frames', 0)} "
              f"frame(s) lost in dead links, {summary.get('slow_ms_total', 0):.0f} ms slow, "
              f"{summary.get('impaired_ms_total', 0):.0f} ms impaired, {summary.get('throttled_ms_total', 0):.0f} ms "
              f"CPU-throttled; {out}/events.csv")
    return 0
