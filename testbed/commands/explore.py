"""`testbed cli`: build a fabric and open Mininet's CLI on it, to look around a live network.

    sudo testbed cli                                   # a 2x2x2 leaf-spine, 20/40 Mbit/s, drop-tail ports
    sudo testbed cli --set leaves=4 --set buffer_bytes=64K
    sudo testbed cli --topology my-fabric.toml         # any topology file (docs/topologies.md)
    sudo testbed cli --script commands.txt             # run CLI commands from a file instead of a terminal
    sudo testbed cli --servers 2                       # the fabric split over 2 servers (VXLAN tunnels)

Inside, Mininet's commands work (``pingall``, ``h1 ping -c1 h4``, ``leaf1 tc -s qdisc show dev h1``, ``iperf h1 h4``,
``dump``, ``net``, ``links``, ``py net['h1'].IP()``); ``exit`` or Ctrl-D tears the fabric down. Parameters are
validated before anything is built (one line, exit status 2). When this kernel lacks what the fabric needs, the
fabric is built in the lab VM (``--vm auto``): the commands typed here are relayed to the CLI there line by line
(no line editing or completion inside the VM), and its output comes back as it is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.errors import UsageError, require_root
from testbed.params import Param, resolve
from testbed.vm.needs import fabric_needs

# `testbed --help` imports this module: topologies, Mininet, pyroute2, the lab VM and run directories are imported
# inside the functions that use them (testbed.cli).

PARAMS = (
    Param("spines", int, 2, "", "spine switches", 1, 16),
    Param("leaves", int, 2, "", "leaf switches", 1, 32),
    Param("hosts_per_leaf", int, 2, "", "hosts under each leaf", 1, 32),
    Param("host_rate_mbps", float, 20.0, "Mbit/s", "host <-> leaf link rate", 0.01, 10000),
    Param("fabric_rate_mbps", float, 40.0, "Mbit/s", "leaf <-> spine link rate", 0.01, 10000),
    Param("buffer_bytes", int, 256000, "bytes", "drop-tail buffer of every switch port", 2000, 64 * 2**20),
    Param("delay_ms", float, 0.0, "ms", "one-way delay of every link (netem: lab VM on minimal kernels)", 0, 1000),
)


def add_parser(sub) -> None:
    c = sub.add_parser("cli", help="build a fabric and open Mininet's CLI on it (pingall, h1 ping h4, tc -s ...)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a leaf-spine parameter: " + ", ".join(p.name for p in PARAMS))
    c.add_argument("--topology", metavar="FILE", help="a topology file (.toml/.yaml) instead of --set")
    c.add_argument("--script", metavar="FILE", help="run these CLI commands, then tear down")
    c.add_argument("--servers", type=int, default=1, metavar="N",
                   help="split the fabric over N servers joined by VXLAN tunnels (Mininet's cluster placement; "
                        "docs/scale.md)")
    c.add_argument("--out", default=None, metavar="DIR", help="run directory (default results/cli-TIME)")
    c.add_argument("--vm", default="auto", choices=["auto", "always", "never"],
                   help="build it in the lab VM: auto (when this kernel lacks something), always, never")
    c.set_defaults(func=main)


def build_topology(args: argparse.Namespace):
    """The spec the CLI builds, from --topology or the --set parameters; UsageError on bad input."""
    from topologies import QueueSpec, SpecError, load_topology, uniform_leaf_spine

    try:
        if args.topology:
            if args.set:
                raise UsageError("--topology and --set exclude each other (put the settings in the file)")
            return load_topology(args.topology)
        p = resolve(PARAMS, args.set)
        q = QueueSpec(buffer_bytes=p["buffer_bytes"])
        return uniform_leaf_spine(p["spines"], p["leaves"], p["hosts_per_leaf"], p["host_rate_mbps"],
                                  p["fabric_rate_mbps"], delay_ms=p["delay_ms"], host_queue=q, switch_queue=q)
    except SpecError as e:
        raise UsageError(str(e)) from None


def main(args: argparse.Namespace) -> int:
    from testbed.vm import labvm
    from testbed.commands import runner
    from testbed.rundir import check_out_dir, default_out

    spec = build_topology(args)
    if args.servers != 1:
        from testbed.network.cluster import place

        place(spec, args.servers)  # a split the fabric cannot take: one line, before anything exists
    if args.script and not Path(args.script).is_file():
        raise UsageError(f"--script: no such file: {args.script}")
    out = check_out_dir(args.out) if args.out else default_out("cli")
    require_root("testbed cli")
    if runner.use_vm(args.vm, fabric_needs(spec), labvm.in_vm()):
        argv = ["cli", *sum((["--set", s] for s in args.set), []), "--vm", "never", "--out", str(out),
                "--servers", str(args.servers)]
        if args.script:
            argv += ["--script", str(Path(args.script).resolve())]
        if args.topology:
            argv += ["--topology", str(Path(args.topology).resolve())]
        print("testbed: this kernel lacks what the fabric needs; building it in the lab VM (about a minute)"
              + ("" if args.script else ": type commands as usual, `exit` tears it down"), file=sys.stderr)
        labvm.vm_kernel()
        return labvm.run(["env", "PYTHONUNBUFFERED=1", sys.executable, "-m", "testbed.cli", *argv],
                         labvm.VmOptions(interactive=not args.script))
    return explore(spec, out, args.script, args.servers)


def explore(spec, out: Path, script: str | None = None, servers: int = 1) -> int:
    from testbed.lab import Lab
    from testbed.network.net import TestbedCLI
    from topologies.mininet_topo import SpecTopo

    with Lab(SpecTopo(spec), out=out, name="cli", params={"topology": spec.describe(), "servers": servers},
             servers=servers) as lab:
        hosts = [h.name for h in lab.hosts]
        print(f"*** {len(hosts)} hosts ({' '.join(hosts[:8])}{' ...' if len(hosts) > 8 else ''}), "
              f"{len(lab.net.switches)} switches; run directory {lab.path}", flush=True)
        if servers > 1:
            pl = lab.net.fabric.placement
            print("*** servers: " + "; ".join(f"{s}: {' '.join(pl.nodes_on(s))}" for s in pl.servers)
                  + f"; {len(pl.crossing)} links tunnelled", flush=True)
        if script:
            TestbedCLI(lab.net, script=script)
        else:
            TestbedCLI(lab.net)
    return 0
