"""What a scenario is, and where `testbed run NAME` finds it.

A scenario is a script in ``scenarios/`` (the script *is* the scenario): it declares its parameters once (name,
unit, default, range), the kernel capabilities it needs, the topology it builds and the experiment it runs on the
Lab API, and ends with ``if __name__ == "__main__": sys.exit(main(["run", NAME, *sys.argv[1:]]))`` (testbed.cli's
``main``) so that
``sudo .venv/bin/python scenarios/NAME.py --set ...`` and ``sudo testbed run NAME --set ...`` are the same run.

    SCENARIO = Scenario(
        name="smoke", summary="...", params=PARAMS, needs=("qdisc:htb", ...),
        topology=topology,          # (params, seed) -> a Mininet Topo (topologies.mininet_topo)
        run=experiment,             # (params, lab) -> summary dict, on a live testbed.lab.Lab
        table=(("goodput_mbps", "receiver goodput (Mbit/s)"), ...),
        validate=validate)          # (params) -> None or UsageError, before anything is created

Discovery: every ``scenarios/*.py`` that defines ``SCENARIO``, by its ``name``: a new experiment is a new file
there, with no registry to edit.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from testbed.vm.needs import fabric_needs
from testbed.params import SEED_HELP, Param
from topologies.mininet_topo import spec_from_topo
from testbed.errors import UsageError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SCRIPT_DIR = PROJECT_ROOT / "scenarios"
ORDER = ("smoke", "incast", "dctcp", "collective", "pfc-hol")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    params: Sequence[Param]
    needs: Sequence[str]  # doctor capability names
    run: Callable[[dict, Any], dict]  # (params, lab): the experiment on a live testbed.lab.Lab
    table: Sequence[tuple[str, str]]  # (summary key, label)
    topology: Callable[[dict, int], Any]  # (params, seed) -> Mininet Topo: the fabric the Lab builds
    validate: Callable[[dict], None] = lambda p: None
    needs_for: Callable[[dict], Sequence[str]] | None = None  # capabilities some parameter values add
    rxe_for: Callable[[dict], bool] = lambda p: False  # a SoftRoCE device on every host?
    agents: bool = False  # runs collective jobs: Lab(agents=True) starts their fork server before the build

    def needs_of(self, params: dict) -> list[str]:
        """Doctor capabilities a run with these (resolved, valid) parameters needs: ``needs``, ``needs_for``'s, and
        what its fabric needs (testbed.vm.needs.fabric_needs: every port's queue discipline,
        DSCP classes, impairments, spraying, the hosts' congestion control and ECN)."""
        out = list(self.needs)
        more = list(self.needs_for(params) if self.needs_for else ())
        more += fabric_needs(spec_from_topo(self.topology(params, 1)))
        for n in more:
            if n not in out:
                out.append(n)
        return out

    def help(self) -> str:
        lines = [f"testbed run {self.name}: {self.summary}", "",
                 f"usage: testbed run {self.name} [--set NAME=VALUE ...] [--seed N] [--out DIR] "
                 "[--vm auto|always|never] [--cli] [--live] [--fault SPEC ...] [--faults FILE] [--repeat N]", "",
                 f"  --seed N   {SEED_HELP} (default 1): seeds the run's random choices (schedules, placement,",
                 "             jitter) and the multipath hash, unless a parameter named seed is set (not 0)",
                 "  --out DIR  the run directory (default results/SCENARIO-TIME); refused when it cannot be created",
                 "             or written (read-only, not a directory, inside /proc or /sys)",
                 "  --cli      open Mininet's CLI once the fabric is up and again after the traffic",
                 "  --live     show the busiest ports' queues, drops, ECN marks and the collective's iteration while",
                 "             the run goes (needs queue sampling: sample_interval_ms > 0 where the scenario has it)",
                 "  --fault SPEC  a fault on the timeline, seconds from the workload's start (repeatable), e.g.",
                 "             'flap leaf1-spine1 at_s=1 down_s=0.2 up_s=0.3 count=3' or 'slow-port spine1:leaf2",
                 "             at_s=0 fraction=0.25'; kinds link-down, flap, slow-port, netem (docs/faults.md)",
                 "  --faults FILE  faults, one SPEC per line (# comments)",
                 "  --repeat N N runs, seeds --seed .. --seed+N-1, into DIR/seed-<seed>/, and DIR/repeat.json: each",
                 "             metric's median with a 95% CI, n and CV (docs/analysis.md; compare them with compare)",
                 "", "parameters:"]
        lines += [p.describe() for p in self.params]
        lines += ["", f"needs: {', '.join(self.needs)}"]
        if self.needs_for and self.needs_for.__doc__:
            lines += ["  plus: " + " ".join(self.needs_for.__doc__.split())]
        return "\n".join(lines)


def _load_script(path: Path) -> Scenario | None:
    spec = importlib.util.spec_from_file_location(f"testbed_scenario_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return getattr(mod, "SCENARIO", None)


@functools.lru_cache(maxsize=1)
def _scripts() -> dict[str, Scenario]:
    """Every scenarios/*.py that defines SCENARIO, by name: loaded once per process."""
    found: dict[str, Scenario] = {}
    for path in sorted(SCRIPT_DIR.glob("*.py")) if SCRIPT_DIR.is_dir() else ():
        sc = _load_script(path)
        if sc is not None:
            found[sc.name] = sc
    return found


def names() -> list[str]:
    known = list(_scripts())
    return [n for n in ORDER if n in known] + sorted(set(known) - set(ORDER))


def get(name: str) -> Scenario:
    """The scenario called ``name`` (its script in scenarios/); UsageError if there is none."""
    try:
        return _scripts()[name]
    except KeyError:
        raise UsageError(f"unknown scenario {name!r} (known: {', '.join(names())})") from None


def all_scenarios() -> list[Scenario]:
    return [get(n) for n in names()]
