#!/usr/bin/env python3
"""Burn-in as a run: the operator's battery (`testbed burnin`) on a uniform leaf-spine, its verdict in summary.json.

    sudo testbed run burnin [--set leaves=3 --set hosts_per_leaf=3] [--fault "slow-port spine1:leaf2 at_s=0 ..."]

The same battery as `testbed burnin` (testbed/commands/burnin.py: every host's NIC, latency, CPU and settings,
every leaf -> spine -> leaf path pinned, a ring all-reduce per leaf and across the fabric, each judged against its
peers by median and MAD); here as a scenario, so that repeats, `compare` and the labs grade it: the run directory
holds burnin.csv, burnin.md and health.json beside the usual files, and summary.json the battery's numbers
(analysis.burnin.summary_numbers: hosts and links flagged, the slowest path's rate against its peers', the
all-reduces' CCT against their bound). Faults (--fault) play from the battery's start, as in `testbed burnin`.
"""

import sys

from testbed.commands import burnin
from testbed.errors import UsageError
from testbed.scenario import Scenario
from topologies.mininet_topo import SpecTopo

PARAMS = list(burnin.PARAMS)


def validate(p: dict) -> None:
    burnin.check_battery(p)
    if p["leaves"] * p["hosts_per_leaf"] < 2:
        raise UsageError("burn-in needs at least 2 hosts (each host's rate is measured to a peer)")


def experiment(p: dict, lab) -> dict:
    result = burnin.on_lab(lab, {k: p[k] for k in burnin.BATTERY_KEYS})
    burnin.write_outputs(lab.rundir.path, result["checks"], result["health"], result["facts"])
    lab.progress(result["verdict"])
    return result["summary"]


SCENARIO = Scenario(
    name="burnin",
    summary="the burn-in battery (testbed burnin) as a run: every host, pinned path and leaf judged against its "
            "peers; hosts and links flagged, the slowest path against its peers, all-reduce CCT / bound",
    params=PARAMS,
    needs=("qdisc:htb", "qdisc:bfifo"),
    topology=lambda p, seed: SpecTopo(burnin.fabric_spec(p)),
    run=experiment,
    validate=validate,
    table=(("burnin_healthy", "healthy (1/0)"), ("burnin_flagged", "checks flagged"),
           ("hosts_flagged", "hosts flagged"), ("links_flagged", "links flagged"),
           ("path_mbps_min", "slowest path (Mbit/s)"), ("path_mbps_median", "paths' median (Mbit/s)"),
           ("path_fraction_min", "slowest path / median"), ("fabric_cct_vs_bound", "fabric all-reduce CCT / bound"),
           ("leaf_cct_vs_bound_max", "worst leaf all-reduce CCT / bound"), ("burnin_wall_s", "battery time (s)"),
           ("fidelity_ok", "fidelity ok")),
)

if __name__ == "__main__":
    from testbed.cli import main

    sys.exit(main(["run", SCENARIO.name, *sys.argv[1:]]))
