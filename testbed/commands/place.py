"""`testbed place`: may this job start on this fabric now? Admission control and placement, without building anything
(issue 27, item 3).

    testbed place --set ranks=4 --health results/bi/health.json              # placed on the hosts burn-in passed
    testbed place --set ranks=6 --set hosts_per_leaf=4 --busy h5,h6 --health results/bi/health.json   # held
    testbed place --set ranks=8 --set max_spine_crossings=0 --topo fabric.toml                        # refused

The job states what it needs (ranks, GPUs per host, its TP/EP layout, whether it may cross a link burn-in flagged,
the worst oversubscription its ring may see); the fabric comes from --set (the collective scenario's defaults: 2
spines x 2 leaves x 2 hosts at 20 Mbit/s) or a leaf-spine topology file (--topo); --health is burn-in's health.json
(docs/operations.md); --busy the hosts another job holds now. traffic.admission decides: **place** (prints where
each rank runs), **hold** (it would fit once the busy hosts free) or **refuse** (it cannot be had on this fabric as
burn-in left it), each with one line naming the reason.

Exit status: 0 placed, 3 held, 4 refused, 2 bad input (one line).
"""

from __future__ import annotations

import argparse

from testbed.errors import UsageError
from testbed.params import Param, parse_seed, resolve

#: exit status of each decision (2 stays bad input)
EXIT = {"place": 0, "hold": 3, "refuse": 4}

P = Param
JOB = (
    P("ranks", int, 4, "", "ranks of the job", 1, 4096),
    P("gpus_per_host", int, 1, "", "ranks (GPUs) per host: a server's ranks are consecutive", 1, 16),
    P("tp", int, 1, "", "tensor-parallel size (with rank_order tp-dp, topo keeps each TP group together)", 1, 64),
    P("ep", int, 1, "", "expert-parallel size (an EP group: ep DP indices of one TP index)", 1, 64),
    P("rank_order", str, "tp-dp", "", "tp-dp (TP groups consecutive) or dp-tp (strided)", choices=("tp-dp", "dp-tp")),
    P("placement", str, "topo", "", "placement policy", choices=("packed", "spread", "random", "topo")),
    P("healthy_links", bool, True, "", "the job's traffic may not cross a fabric link burn-in flagged"),
    P("max_spine_crossings", int, -1, "", "at most this many hops of the ring change leaf (-1: any)", -1, 1 << 20),
    P("max_uplink_load", float, 0.0, "", "on every leaf the ring leaves: the job's hosts there x host rate over the "
      "leaf's healthy uplink capacity stays at or below this (0: any)", 0, 1e6),
)
FABRIC = (
    P("spines", int, 2, "", "spines", 1, 16),
    P("leaves", int, 2, "", "leaves", 1, 32),
    P("hosts_per_leaf", int, 2, "", "hosts per leaf", 1, 64),
    P("host_rate_mbps", float, 20.0, "Mbit/s", "host link rate", 0.1, 100_000),
    P("fabric_rate_mbps", float, 20.0, "Mbit/s", "leaf-spine link rate", 0.1, 100_000),
)


def add_parser(sub) -> None:
    p = sub.add_parser("place", help="admission control: place, hold or refuse a job on a fabric (builds nothing)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="the job: " + ", ".join(x.name for x in JOB) + "; the fabric: "
                   + ", ".join(x.name for x in FABRIC))
    p.add_argument("--topo", metavar="FILE", help="a leaf-spine topology file instead of the fabric's --set")
    p.add_argument("--health", metavar="FILE", help="burn-in's health.json (testbed burnin)")
    p.add_argument("--busy", default="", metavar="H1,H2", help="hosts another job holds now")
    p.add_argument("--seed", type=parse_seed, default=1, metavar="N", help="seed of placement=random")
    p.set_defaults(func=main)


def fabric_of(spec):
    """traffic.admission's view of a leaf-spine spec: its hosts by leaf, host rate, each leaf's uplinks (a per-port
    override's rate where one is set)."""
    from traffic.admission import FabricView

    leaves = {n.name for n in spec.nodes if n.role == "leaf"}
    uplinks: dict[str, dict[str, float]] = {}
    for link in spec.links:
        if link.a in leaves:
            uplinks.setdefault(link.a, {})[f"{link.a}-{link.b}"] = link.a_egress.rate_mbps or link.spec.rate_mbps
    return FabricView.of([(h.name, spec.leaf_of(h.name)) for h in spec.hosts], spec.host_link.rate_mbps, uplinks)


def plan(args: argparse.Namespace):
    """(Needs, FabricView, Health or None, busy hosts) from the arguments; UsageError (one line) on any problem."""
    from topologies import LeafSpineSpec, SpecError, load_topology, uniform_leaf_spine
    from traffic.admission import Needs
    from traffic.health import HealthError, load_health

    p = resolve(JOB + FABRIC, args.set)
    try:
        if args.topo:
            clash = [s.split("=", 1)[0].strip() for s in args.set if s.split("=", 1)[0].strip() in
                     {x.name for x in FABRIC}]
            if clash:
                raise UsageError(f"--topo and --set {clash[0]} exclude each other (put it in the file)")
            spec = load_topology(args.topo)
        else:
            spec = uniform_leaf_spine(p["spines"], p["leaves"], p["hosts_per_leaf"], p["host_rate_mbps"],
                                      p["fabric_rate_mbps"])
    except SpecError as e:
        raise UsageError(str(e)) from None
    if not isinstance(spec, LeafSpineSpec):
        raise UsageError(f"--topo: placement needs a leaf-spine fabric (kind \"leafspine\"), not a {spec.kind}")
    names = [h.name for h in spec.hosts]
    busy = [b.strip() for b in args.busy.split(",") if b.strip()]
    unknown = [b for b in busy if b not in names]
    if unknown:
        raise UsageError(f"--busy: unknown host {unknown[0]!r} (hosts: {names[0]} .. {names[-1]})")
    health = None
    if args.health:
        try:
            health = load_health(args.health)
            health.check_fabric(names)
        except HealthError as e:
            raise UsageError(str(e)) from None
    if p["ranks"] % p["tp"] or (p["ranks"] // p["tp"]) % p["ep"]:
        raise UsageError(f"tp, ep: ranks ({p['ranks']}) must be a multiple of tp x ep ({p['tp']} x {p['ep']})")
    group = p["tp"] * p["ep"] if p["rank_order"] == "tp-dp" else 1
    needs = Needs(p["ranks"], per_host=p["gpus_per_host"], group=group, policy=p["placement"], seed=args.seed,
                  healthy_links=p["healthy_links"],
                  max_spine_crossings=None if p["max_spine_crossings"] < 0 else p["max_spine_crossings"],
                  max_uplink_load=p["max_uplink_load"] or None)
    return needs, fabric_of(spec), health, busy


def main(args: argparse.Namespace) -> int:
    from traffic.admission import admit

    needs, fabric, health, busy = plan(args)
    d = admit(needs, fabric, health, busy)
    print(d.reason)
    if d.placement is not None:
        print("rank  host  leaf" + ("   (when the busy hosts free)" if d.action == "hold" else ""))
        for r, (h, lf) in enumerate(zip(d.placement.hosts, d.placement.leaves)):
            print(f"{r:>4}  {h:<4}  {lf}")
    return EXIT[d.action]
