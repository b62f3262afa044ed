"""The fabric of a PFC head-of-line blocking experiment (pfc-hol): a leaf-spine with 1 spine and 2 leaves, incast
senders and a victim on leaf2, the incast receiver h1 and the victim's receiver h2 on leaf1. Every port has two
classes: ``rdma`` (DSCP 26, strict priority 1, 802.1p priority 3; lossless with XOFF/XON/headroom unless the mode
is lossy) and ``bulk`` (DSCP 0, priority 0, the default). Every switch port gets the same queue (``discipline``
droptail, RED with min = k_bytes and max = min(3K, buffer), or DCTCP step marking at K); host NICs a deep drop-tail
queue. Built from the scenario's parameters (mode, senders, host/fabric rates, buffer_bytes, host_buffer_bytes,
discipline, k_bytes, xoff/xon/headroom_bytes, cc, rto_min_ms, seed)."""

from __future__ import annotations

from testbed.workloads.bottleneck import bottleneck_queue, check_marking
from testbed.errors import UsageError
from topologies import ClassSpec, HostTcpSpec, QueueSpec, SpecError, uniform_leaf_spine

#: the lossless class: DSCP 26 (AF31, common for RoCEv2) on 802.1p priority 3
DSCP_LOSSLESS = 26
PCP = 3


def effective(p: dict) -> dict:
    """What the mode implies: discipline (lossless_ecn turns droptail into step), ecn, cc (dctcp with ECN),
    lossless."""
    mode = p["mode"]
    disc = p["discipline"]
    ecn = mode == "lossless_ecn"
    if ecn and disc == "droptail":
        disc = "step"
    cc = "dctcp" if ecn else p["cc"]
    if cc == "dctcp":
        ecn = True
    return {"discipline": disc, "ecn": ecn, "cc": cc, "lossless": mode != "lossy"}


def thresholds(p: dict) -> dict:
    """The lossless class's PFC thresholds, as ClassSpec takes them."""
    return dict(pcp=PCP, xoff_bytes=p["xoff_bytes"], xon_bytes=p["xon_bytes"], headroom_bytes=p["headroom_bytes"])


def build_spec(p: dict, seed: int = 0):
    """(topology, incast receiver, victim receiver, senders, victim). UsageError (one line) on bad input; the PFC
    thresholds are checked in every mode (lossy runs the same class, just without pauses)."""
    e = effective(p)
    check_marking({**p, "discipline": e["discipline"]})
    try:
        lossless = ClassSpec("rdma", dscp=[DSCP_LOSSLESS], priority=1, lossless=True, **thresholds(p))
        rdma = lossless if e["lossless"] else ClassSpec("rdma", dscp=[DSCP_LOSSLESS], priority=1)
        bulk = ClassSpec("bulk", dscp=[0], priority=0, default=True)
        q = bottleneck_queue({**p, "discipline": e["discipline"], "ecn": e["ecn"]})
        hq = QueueSpec("droptail", buffer_bytes=p["host_buffer_bytes"])
        tcp = HostTcpSpec(congestion_control=e["cc"], ecn=e["ecn"], rto_min_ms=p["rto_min_ms"])
        n = p["senders"]
        topo = uniform_leaf_spine(1, 2, max(2, n + 1), p["host_rate_mbps"], p["fabric_rate_mbps"], host_queue=hq,
                                  switch_queue=q, classes=(bulk, rdma), tcp=tcp, seed=(p["seed"] or seed) % 2**32)
    except SpecError as err:
        raise UsageError(str(err)) from None
    leaf2 = topo.hosts_of("leaf2")
    return topo, "h1", "h2", list(leaf2[:n]), leaf2[n]
