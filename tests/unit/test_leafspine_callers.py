"""Every caller that builds the uniform leaf-spine from its --set parameters gives the same spec through
topologies.uniform_leaf_spine as its own construction did: each ``_old_*`` below is that construction, copied
verbatim before it was replaced, and each test compares it with what the caller builds now, at the caller's
defaults and at its typical non-default settings (delay, MTU, marking queues, classes, load balancing)."""

from __future__ import annotations

import argparse
import dataclasses
import math

import pytest

from testbed.params import resolve
from testbed.scenario import get
from testbed.workloads.bottleneck import bottleneck_queue
from topologies import ClassSpec, HostTcpSpec, LeafSpineSpec, LinkSpec, QueueSpec


def same(old: LeafSpineSpec, new: LeafSpineSpec) -> None:
    """Field by field, then what the fabric is built from: nodes, links (with resolved ports), addresses, routes."""
    assert type(new) is LeafSpineSpec
    for f in dataclasses.fields(LeafSpineSpec):
        assert getattr(new, f.name) == getattr(old, f.name), f.name
    assert new == old
    assert new.nodes == old.nodes and new.links == old.links
    assert new.addresses == old.addresses and new.routes == old.routes
    assert new.describe() == old.describe()


# ---- the old constructions, verbatim ----

def _old_burnin(p):
    q = QueueSpec(buffer_bytes=p["buffer_bytes"])
    return LeafSpineSpec(spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"],
                         host_link=LinkSpec(p["host_rate_mbps"]), fabric_link=LinkSpec(p["fabric_rate_mbps"]),
                         host_queue=q, leaf_down_queue=q, leaf_up_queue=q, spine_queue=q)


def _old_canary(p, seed):
    return LeafSpineSpec(spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"],
                         host_link=LinkSpec(p["host_rate_mbps"]), fabric_link=LinkSpec(p["fabric_rate_mbps"]),
                         leaf_down_queue=bottleneck_queue(p), seed=seed % 2**32,
                         tcp=HostTcpSpec(congestion_control=p["cc"], ecn=p["ecn"], rto_min_ms=p["rto_min_ms"]))


def _old_place(p):
    return LeafSpineSpec(spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"],
                         host_link=LinkSpec(p["host_rate_mbps"]), fabric_link=LinkSpec(p["fabric_rate_mbps"]))


def _old_explore(p):
    q = QueueSpec(buffer_bytes=p["buffer_bytes"])
    return LeafSpineSpec(spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"],
                         host_link=LinkSpec(p["host_rate_mbps"], delay_ms=p["delay_ms"]),
                         fabric_link=LinkSpec(p["fabric_rate_mbps"], delay_ms=p["delay_ms"]),
                         host_queue=q, leaf_down_queue=q, leaf_up_queue=q, spine_queue=q)


def _old_program(p, seed):
    q = bottleneck_queue(p)
    return LeafSpineSpec(spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"],
                         host_link=LinkSpec(p["host_rate_mbps"], delay_ms=p["delay_ms"]),
                         fabric_link=LinkSpec(p["fabric_rate_mbps"], delay_ms=p["delay_ms"]),
                         host_queue=QueueSpec("droptail", buffer_bytes=p["nic_buffer_bytes"]),
                         leaf_down_queue=q, leaf_up_queue=q, spine_queue=q, seed=seed % 256,
                         load_balancing=p["load_balancing"], tcp=HostTcpSpec(congestion_control=p["cc"],
                                                                             ecn=p["ecn"]))


def _old_jobfabric(p, seed):
    from testbed.workloads.jobfabric import isolation_classes, pfc_classes

    nic, extra = QueueSpec("droptail", buffer_bytes=p["buffer_bytes"]), {}
    q = bottleneck_queue(p)
    if p["isolation"] != "none":
        extra["classes"] = isolation_classes(p)
    if p["pfc"] == "on":
        extra["classes"] = pfc_classes(p)
    return LeafSpineSpec(spines=p["spines"], leaves=p["leaves"], hosts_per_leaf=p["hosts_per_leaf"],
                         host_link=LinkSpec(p["host_rate_mbps"], delay_ms=p["delay_ms"], mtu=p["mtu"]),
                         fabric_link=LinkSpec(p["fabric_rate_mbps"], delay_ms=p["delay_ms"], mtu=p["mtu"]),
                         host_queue=nic, leaf_down_queue=q, leaf_up_queue=q, spine_queue=q, seed=seed % 256,
                         load_balancing=p["load_balancing"], flowlet_gap_ms=p["flowlet_gap_ms"],
                         tcp=HostTcpSpec(congestion_control=p["cc"], ecn=p["ecn"],
                                         rto_min_ms=p["rto_min_ms"] or None), **extra)


def _old_bottleneck(p, seed):
    n = p["senders"]
    seed = p["seed"] or seed
    tcp = HostTcpSpec(congestion_control=p["cc"], ecn=p["ecn"], rto_min_ms=p["rto_min_ms"])
    q = bottleneck_queue(p)
    host = LinkSpec(p["host_rate_mbps"])
    delay_ms = float(p.get("delay_ms") or 0.0)
    fabric = LinkSpec(p["fabric_rate_mbps"], delay_ms=delay_ms)
    hpl = p["hosts_per_leaf"]
    leaves = 1 + math.ceil(n / hpl)
    topo = LeafSpineSpec(spines=p["spines"], leaves=leaves, hosts_per_leaf=hpl, host_link=host,
                         fabric_link=fabric, leaf_down_queue=q, tcp=tcp, seed=seed % 2**32,
                         load_balancing=p["load_balancing"])
    senders = [h for leaf in range(2, leaves + 1) for h in topo.hosts_of(f"leaf{leaf}")][:n]
    return topo, "h1", senders, ("leaf1", "h1")


def _old_lossless(p, seed):
    from testbed.workloads.lossless_incast import DSCP_LOSSLESS, effective, thresholds

    e = effective(p)
    lossless = ClassSpec("rdma", dscp=[DSCP_LOSSLESS], priority=1, lossless=True, **thresholds(p))
    rdma = lossless if e["lossless"] else ClassSpec("rdma", dscp=[DSCP_LOSSLESS], priority=1)
    bulk = ClassSpec("bulk", dscp=[0], priority=0, default=True)
    q = bottleneck_queue({**p, "discipline": e["discipline"], "ecn": e["ecn"]})
    hq = QueueSpec("droptail", buffer_bytes=p["host_buffer_bytes"])
    tcp = HostTcpSpec(congestion_control=e["cc"], ecn=e["ecn"], rto_min_ms=p["rto_min_ms"])
    n = p["senders"]
    topo = LeafSpineSpec(spines=1, leaves=2, hosts_per_leaf=max(2, n + 1), host_link=LinkSpec(p["host_rate_mbps"]),
                         fabric_link=LinkSpec(p["fabric_rate_mbps"]), host_queue=hq, leaf_down_queue=q,
                         leaf_up_queue=q, spine_queue=q, classes=(bulk, rdma), tcp=tcp,
                         seed=(p["seed"] or seed) % 2**32)
    leaf2 = topo.hosts_of("leaf2")
    return topo, "h1", "h2", list(leaf2[:n]), leaf2[n]


# ---- each caller, old and new ----

@pytest.mark.parametrize("sets", [[], ["spines=3", "leaves=4", "hosts_per_leaf=3", "host_rate_mbps=25",
                                       "fabric_rate_mbps=50", "buffer_bytes=9000"]])
def test_burnin(sets):
    from testbed.commands.burnin import PARAMS, fabric_spec

    p = resolve(PARAMS, sets)
    same(_old_burnin(p), fabric_spec(p))


@pytest.mark.parametrize("sets,seed", [([], 1), (["discipline=step", "k_bytes=20000", "ecn=true", "cc=dctcp",
                                                  "rto_min_ms=5", "leaves=4", "buffer_bytes=64000"], 2**32 + 7),
                                       (["discipline=red", "k_bytes=10000", "spines=2"], 3)])
def test_canary(sets, seed):
    from testbed.commands.canary import FABRIC, build_spec

    p = resolve(FABRIC, sets)
    same(_old_canary(p, seed), build_spec(p, seed))


@pytest.mark.parametrize("sets", [[], ["spines=3", "leaves=3", "hosts_per_leaf=5", "host_rate_mbps=100",
                                       "fabric_rate_mbps=30"]])
def test_place(sets):
    from testbed.commands.place import FABRIC, JOB, fabric_of, plan

    p = resolve(JOB + FABRIC, sets)
    args = argparse.Namespace(set=sets, topo=None, health=None, busy="", seed=1)
    assert plan(args)[1] == fabric_of(_old_place(p))


@pytest.mark.parametrize("sets", [[], ["delay_ms=2.5", "buffer_bytes=30000", "leaves=3", "fabric_rate_mbps=80"]])
def test_explore(sets):
    from testbed.commands.explore import PARAMS, build_topology

    p = resolve(PARAMS, sets)
    same(_old_explore(p), build_topology(argparse.Namespace(topology=None, set=sets)))


@pytest.mark.parametrize("sets,seed", [([], 1), (["delay_ms=1", "discipline=step", "k_bytes=20000", "ecn=true",
                                                  "cc=dctcp", "load_balancing=spray", "nic_buffer_bytes=40000"], 300),
                                       (["discipline=red", "leaves=3", "hosts_per_leaf=3"], 7)])
def test_program(sets, seed):
    sc = get("program")
    p = resolve(sc.params, sets)
    same(_old_program(p, seed), sc.topology(p, seed).spec)


@pytest.mark.parametrize("sets,seed", [
    ([], 1),
    (["mtu=9000", "delay_ms=0.5", "discipline=step", "k_bytes=30000", "ecn=true", "cc=dctcp", "rto_min_ms=5",
      "load_balancing=flowlet", "flowlet_gap_ms=2"], 513),
    (["background=h1>h3", "bg_dscp=8", "isolation=strict"], 2),
    (["pfc=on", "buffer_bytes=200000"], 3),
])
def test_collective(sets, seed):
    sc = get("collective")
    p = resolve(sc.params, sets)
    same(_old_jobfabric(p, p["seed"] or seed), sc.topology(p, seed).spec)


@pytest.mark.parametrize("sets,seed", [([], 1), (["senders=5", "hosts_per_leaf=2", "spines=2", "discipline=step",
                                                  "k_bytes=20000", "ecn=true", "cc=dctcp", "rto_min_ms=2"], 9),
                                       (["load_balancing=spray", "discipline=red", "k_bytes=20000"], 2**32 + 1)])
def test_incast(sets, seed):
    from testbed.workloads.bottleneck import build_spec

    p = resolve(get("incast").params, sets)
    old, new = _old_bottleneck(p, seed), build_spec(p, seed)
    same(old[0], new[0])
    assert old[1:] == new[1:]


@pytest.mark.parametrize("sets,seed", [([], 1), (["mode=lossy", "senders=3"], 4),
                                       (["mode=lossless_ecn", "senders=2"], 2**33)])
def test_pfc_hol(sets, seed):
    from testbed.workloads.lossless_incast import build_spec

    p = resolve(get("pfc-hol").params, sets)
    old, new = _old_lossless(p, seed), build_spec(p, seed)
    same(old[0], new[0])
    assert old[1:] == new[1:]


def _old_leafspine_topo(spines=2, leaves=2, hosts_per_leaf=2, host_rate_mbps=20, fabric_rate_mbps=40, **spec):
    spec.setdefault("host_link", LinkSpec(rate_mbps=float(host_rate_mbps)))
    spec.setdefault("fabric_link", LinkSpec(rate_mbps=float(fabric_rate_mbps)))
    return LeafSpineSpec(spines=int(spines), leaves=int(leaves), hosts_per_leaf=int(hosts_per_leaf), **spec)


@pytest.mark.parametrize("kwargs", [
    {},
    dict(spines=1, leaves=2, hosts_per_leaf=2, host_rate_mbps=10, fabric_rate_mbps=40, seed=1,
         leaf_down_queue=QueueSpec("droptail", buffer_bytes=9000)),
    dict(spines=2, leaves=4, hosts_per_leaf=5, host_rate_mbps=10, fabric_rate_mbps=40, load_balancing="spray",
         spine_queue=QueueSpec(buffer_bytes=20_000), leaf_up_queue=QueueSpec(buffer_bytes=30_000)),
    dict(host_link=LinkSpec(5, mtu=9000), fabric_link=LinkSpec(7, delay_ms=1, mtu=9000)),
])
def test_leafspine_topo(kwargs):
    from topologies.mininet_topo import LeafSpineTopo

    same(_old_leafspine_topo(**kwargs), LeafSpineTopo(**kwargs).spec)
