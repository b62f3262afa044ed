"""The leaf-spine a collective job runs on, from the collective scenario's parameters (or its topology file).

``discipline`` (drop-tail, RED, DCTCP step marking) on every switch port, drop-tail host NICs; ``isolation`` puts
the background flows in their own DSCP class on every port (strict priority below the collective, or weighted 4:1);
``pfc=on`` makes the collective's DSCP a lossless class (802.1p priority 3) beside a lossy ``bulk`` class of equal
weight, as ETS shares a port. ``topology_file`` replaces the fabric's parameters (:data:`FILE_REPLACES`) with a
leaf-spine file's. Pure: specs only, nothing is built here; every refusal is a UsageError of one line.
"""

from __future__ import annotations

from typing import Sequence

from testbed.errors import UsageError
from testbed.params import Param
from testbed.workloads.bottleneck import bottleneck_queue, check_marking
from topologies import ClassSpec, HostTcpSpec, LeafSpineSpec, QueueSpec, SpecError, load_topology, uniform_leaf_spine

#: the parameters a topology_file replaces (its shape, links, queues, per-port overrides, classes, load balancing
#: and [tcp]): they must keep their defaults when it is given
FILE_REPLACES = ("spines", "leaves", "hosts_per_leaf", "host_rate_mbps", "fabric_rate_mbps", "delay_ms", "mtu",
                 "buffer_bytes", "discipline", "k_bytes", "ecn", "load_balancing", "flowlet_gap_ms", "isolation",
                 "pfc_xoff_bytes", "pfc_xon_bytes", "pfc_headroom_bytes", "cc", "rto_min_ms")
#: 802.1p priority and default DSCP of the collective's lossless class with pfc=on (26: AF31, common for RoCEv2)
PFC_PCP, PFC_DSCP = 3, 26


def collective_dscp(p: dict) -> int:
    """``dscp``, or with pfc=on and dscp 0 the lossless class's (DSCP 0 is the lossy default class)."""
    return p["dscp"] or (PFC_DSCP if p["pfc"] == "on" else 0)


def isolation_classes(p: dict) -> tuple:
    """The collective's class and the background's: strict priority (collective 0, background 1) or weighted
    round robin 4:1 (ETS-like), each on every port, classified by DSCP."""
    if p["pfc"] == "on":
        raise UsageError("isolation and pfc=on cannot be combined yet (pfc=on defines its own classes)")
    if not p["background"].strip():
        raise UsageError(f"isolation={p['isolation']}: there are no background flows to isolate (set background)")
    if p["bg_dscp"] == collective_dscp(p):
        raise UsageError(f"isolation={p['isolation']}: bg_dscp ({p['bg_dscp']}) must differ from the collective's "
                         f"DSCP ({collective_dscp(p)}); e.g. bg_dscp=8 (CS1, a scavenger class)")
    strict = p["isolation"] == "strict"
    return (ClassSpec("collective", dscp=[collective_dscp(p)], default=True,
                      **({"priority": 0} if strict else {"weight": 4})),
            ClassSpec("background", dscp=[p["bg_dscp"]], **({"priority": 1} if strict else {"weight": 1})))


def pfc_classes(p: dict) -> tuple:
    """pfc=on: ``bulk`` (lossy: background flows, anything unmarked) and ``collective`` (lossless, PFC_PCP)."""
    if collective_dscp(p) == p["bg_dscp"] and p["background"].strip():
        raise UsageError(f"pfc=on: the background flows' bg_dscp ({p['bg_dscp']}) must differ from the "
                         f"collective's lossless DSCP ({collective_dscp(p)})")
    return (ClassSpec("bulk", dscp=[0], weight=1, default=True), ClassSpec(
        "collective", dscp=[collective_dscp(p)], weight=1, lossless=True, pcp=PFC_PCP,
        xoff_bytes=p["pfc_xoff_bytes"], xon_bytes=p["pfc_xon_bytes"],
        headroom_bytes=p["pfc_headroom_bytes"] or max(0, p["buffer_bytes"] - p["pfc_xoff_bytes"])))


def file_leaf_spine(p: dict, params: Sequence[Param]) -> LeafSpineSpec:
    """The fabric of ``topology_file``. UsageError, one line, before anything is built: a parameter it replaces
    (FILE_REPLACES) set too (away from its default in ``params``), a file that cannot be read or is not a valid
    leaf-spine, fewer hosts than ranks, pfc=on without a lossless class for the collective's DSCP."""
    path = p["topology_file"]
    defaults = {q.name: q.default for q in params}
    clash = [n for n in FILE_REPLACES if p[n] != defaults[n]]
    if clash:
        raise UsageError(f"topology_file: the file sets {', '.join(clash)}: leave {'it' if len(clash) == 1 else 'them'}"
                         f" unset, or set {'it' if len(clash) == 1 else 'them'} in {path}")
    try:
        spec = load_topology(path)
    except SpecError as e:
        raise UsageError(f"topology_file: {e}") from None
    if not isinstance(spec, LeafSpineSpec):
        raise UsageError(f"topology_file: {path} is a {spec.kind}; the collective runs on a leaf-spine "
                         f"(kind = \"leafspine\")")
    if not p["schedule_file"] and p["ranks"] > spec.host_count:
        raise UsageError(f"ranks: {p['ranks']} ranks but topology_file {path} has only {spec.host_count} hosts "
                         f"({spec.leaves} leaves x {spec.hosts_per_leaf} hosts)")
    if p["pfc"] == "on" and not any(c.lossless and collective_dscp(p) in c.dscp for c in spec.classes):
        raise UsageError(f"pfc=on: topology_file {path} has no lossless class with the collective's DSCP "
                         f"{collective_dscp(p)} (add one to its [[classes]], or set dscp)")
    return spec


def leaf_spine(p: dict, seed: int, params: Sequence[Param]) -> LeafSpineSpec:
    """``topology_file``'s fabric (:func:`file_leaf_spine`), or one from the parameters (the module docstring)."""
    if p["topology_file"]:
        return file_leaf_spine(p, params)
    nic, extra = QueueSpec("droptail", buffer_bytes=p["buffer_bytes"]), {}
    if p["cc"] == "dctcp" and not p["ecn"]:
        raise UsageError("cc=dctcp needs ecn=true")
    check_marking(p)
    try:
        q = bottleneck_queue(p)
        if p["isolation"] != "none":
            extra["classes"] = isolation_classes(p)
        if p["pfc"] == "on":
            extra["classes"] = pfc_classes(p)
        return uniform_leaf_spine(p["spines"], p["leaves"], p["hosts_per_leaf"], p["host_rate_mbps"],
                                  p["fabric_rate_mbps"], delay_ms=p["delay_ms"], mtu=p["mtu"], host_queue=nic,
                                  switch_queue=q, seed=seed % 256, load_balancing=p["load_balancing"],
                                  flowlet_gap_ms=p["flowlet_gap_ms"],
                                  tcp=HostTcpSpec(congestion_control=p["cc"], ecn=p["ecn"],
                                                  rto_min_ms=p["rto_min_ms"] or None), **extra)
    except SpecError as e:
        raise UsageError(str(e)) from None


def fabric_summary(p: dict, spec: LeafSpineSpec) -> dict:
    """The summary's ``discipline`` (of the switch tiers; several joined by '/') and ``load_balancing``, as built:
    the parameters', or topology_file's (then also named)."""
    if not p["topology_file"]:
        return {"discipline": p["discipline"], "load_balancing": p["load_balancing"]}
    tiers = (spec.leaf_down_queue, spec.leaf_up_queue, spec.spine_queue)
    return {"discipline": "/".join(dict.fromkeys(q.discipline for q in tiers)),
            "load_balancing": spec.load_balancing, "topology_file": p["topology_file"]}
