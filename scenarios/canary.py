#!/usr/bin/env python3
"""Canary as a run: a transport tuning change tried on a canary slice beside an untouched control slice
(`testbed canary`), its decision in summary.json.

    sudo testbed run canary [--set change=rto_min_ms=200 --set canary=leaf1 --set buffer_bytes=4500 ...]

The same experiment as `testbed canary` (testbed/commands/canary.py, :func:`on_lab`): one leaf-spine fabric with the
current settings, the change applied live to the canary leaves' host ports and hosts and read back from the kernel,
an incast on every canary and control leaf at the same time, ``runs_per_side`` runs a side, analysis.canary's rule
(roll back if told slower beyond ``tolerance`` or the ratio's interval reaches above ``ceiling``), then the roll out
(fabric-wide, one more run, checked) or the roll back. Here as a scenario, so that repeats, `compare` and the labs
grade it (lab 14). The run directory holds canary.md (the decision log), canary.json, canary.csv and
canary_rounds.csv; summary.json the decision (``rolled_back``, ``rolled_out``), the ratio canary / control with
its interval ends, each side's median job time and round p99, ``rollout_verified`` and ``readback_verified``.

``change``: KEY=VALUE, several separated by commas (``discipline=step,k_bytes=6000,ecn=1,cc=dctcp``); keys as
`testbed canary --change`. The defaults differ from `testbed canary`'s in two settings: the leaves' host ports hold
4500 bytes (three packets) and the hosts run rto_min 1 ms, so the default change (rto_min back to the kernel's
200 ms) is the harmful one of docs/operations.md.
"""

import dataclasses
import sys

from testbed.commands import canary
from testbed.errors import UsageError
from testbed.params import Param
from testbed.scenario import Scenario
from topologies.mininet_topo import SpecTopo

_DEFAULTS = {"buffer_bytes": 4500, "rto_min_ms": 1}
PARAMS = [dataclasses.replace(p, default=_DEFAULTS.get(p.name, p.default)) for p in canary.FABRIC] + [
    Param("change", str, "rto_min_ms=200", "", "the tuning change, KEY=VALUE[,KEY=VALUE] (keys: buffer_bytes, "
          "discipline, k_bytes, ecn, rto_min_ms, cc)"),
    Param("canary", str, "leaf1", "", "the canary slice, LEAF[,LEAF] (the control: as many other leaves)"),
    Param("runs_per_side", int, 5, "", "runs of the job on each slice", min=canary.MIN_REPEATS, max=50),
    Param("tolerance", float, 1.10, "", "accepted slowdown, canary / control median", min=1.0, max=10.0),
    Param("ceiling", float, 1.5, "", "roll back if the ratio's 95% interval reaches above this", min=1.0, max=10.0),
]


def change_texts(p: dict) -> list[str]:
    """``change``'s KEY=VALUE pieces (commas separate them; blanks around them are ignored)."""
    return [t.strip() for t in str(p["change"]).split(",") if t.strip()]


def plan(p: dict) -> tuple:
    """(change, canary leaves, control leaves, rule): testbed.commands.canary.plan on this run's settings;
    UsageError (one line, naming the setting) before anything is built."""
    texts = change_texts(p)
    if not texts:
        raise UsageError("change: give KEY=VALUE (e.g. change=rto_min_ms=200)")
    try:
        return canary.plan(p, texts, p["canary"], p["runs_per_side"], p["tolerance"], p["ceiling"])
    except UsageError as e:
        raise UsageError(str(e).replace("--", "")) from None


def validate(p: dict) -> None:
    plan(p)
    canary.build_spec(p, 1)


def needs_for(p: dict) -> list[str]:
    """what the changed settings need (RED, ECN, dctcp: the lab VM)"""
    return list(plan(p)[0].needs())


def experiment(p: dict, lab) -> dict:
    change, slice_canary, slice_control, rule = plan(p)
    result = canary.on_lab(lab, p, change, slice_canary, slice_control, p["runs_per_side"], rule, lab.seed)
    lab.progress(f"{result['final']}: {result['decision'].reason} ({result['log'].name})")
    return result["summary"]


SCENARIO = Scenario(
    name="canary",
    summary="a tuning change on a canary slice beside an untouched control (testbed canary) as a run: rolled back "
            "or rolled out, the ratio canary / control with its interval, each side's round p99",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo"),
    topology=lambda p, seed: SpecTopo(canary.build_spec(p, seed)),
    run=experiment,
    validate=validate,
    needs_for=needs_for,
    table=(("rolled_back", "rolled back (1/0)"), ("rolled_out", "rolled out (1/0)"),
           ("canary_ratio", "canary / control (job time)"), ("canary_ratio_low", "ratio 95% low"),
           ("canary_ratio_high", "ratio 95% high"), ("canary_job_ms_median", "canary job median (ms)"),
           ("control_job_ms_median", "control job median (ms)"), ("canary_round_ms_p99", "canary round p99 (ms)"),
           ("control_round_ms_p99", "control round p99 (ms)"), ("rollout_verified", "roll out verified (1/0)"),
           ("readback_verified", "kernel read-back as meant (1/0)"), ("fidelity_ok", "fidelity ok")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
