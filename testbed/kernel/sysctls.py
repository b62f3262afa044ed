"""The sysctls a fabric sets in its namespaces: what makes a namespace behave as a router port or a host NIC.

* :func:`set_before_interfaces` — in a new namespace, before any interface exists (so the ``default`` values apply
  to all of them): IPv6 off (no DAD/MLD/RS chatter in the queue counters), ``rp_filter`` 0 (ECMP paths are
  asymmetric by design) and the receive packet steering mask (:func:`rps_mask`).
* :func:`set_node_sysctls` — once the interfaces exist: routers get ``ip_forward=1`` and
  ``fib_multipath_hash_policy=1`` (plus ``fib_multipath_hash_seed`` from the spec's seed where the kernel has it);
  hosts the congestion control, ECN and buffer sysctls of the spec's ``HostTcpSpec``.

Every value is written through ``/proc/sys`` from a thread inside the namespace (the kernel keeps these per netns),
so the host's own configuration is untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed.kernel import netns

HASH_SEED = Path("/proc/sys/net/ipv4/fib_multipath_hash_seed")


def rps_mask(cpus: int | None = None) -> str:
    """All CPUs as a sysfs CPU mask (hex, comma every 32 bits), for ``net.core.rps_default_mask`` in every fabric
    namespace: receive packet steering by flow hash on every veth, so the packets of one flow are processed in
    order. Without it (offloads off, so veth has no NAPI ring) a veth hands each packet to the backlog of the CPU that
    happened to transmit it; a qdisc releases one flow's packets from different CPUs (HTB's timer on one, a sender's
    enqueue on another), the per-CPU backlogs drain independently and the flow arrives reordered: measured in the
    2-CPU lab VM, 539 of 587 TCP retransmissions of a ring all-reduce were spurious (DSACKed) and its CCT was 3.5x
    the bound; without it the ring test failed in CI, and the whole suite ran slower (the spurious retransmissions
    are work too). Set per namespace (the kernel keeps the sysctl per netns), so the host's own devices are
    untouched."""
    n = cpus or os.cpu_count() or 1
    digits = f"{(1 << n) - 1:x}"
    groups = []
    while digits:
        groups.insert(0, digits[-8:])
        digits = digits[:-8]
    return ",".join(groups)


def set_before_interfaces() -> None:
    """In a new namespace (the calling thread is inside it, see netns.create), before any interface exists, so
    the `default` values apply to all of them. ``rps_default_mask``: see :func:`rps_mask`."""
    for key, val in (("net/ipv6/conf/all/disable_ipv6", "1"), ("net/ipv6/conf/default/disable_ipv6", "1"),
                     ("net/ipv4/conf/all/rp_filter", "0"), ("net/ipv4/conf/default/rp_filter", "0"),
                     ("net/core/rps_default_mask", rps_mask())):
        p = Path("/proc/sys") / key
        if p.exists():
            p.write_text(val)


def set_node_sysctls(topology, namespaces: dict[str, str]) -> list[str]:
    """Every node's role sysctls (the module docstring) in its namespace (``namespaces``: node -> namespace; nodes
    it does not name are skipped).
    Returns the hosts whose namespace default congestion control could not be set: outside the initial namespace
    only "non-restricted" algorithms (the host's ``tcp_allowed_congestion_control``) can be a namespace default;
    sockets set it themselves."""
    router = dict(topology.router_sysctls())
    seed = getattr(topology, "seed", 0)
    cc_default_failed = []
    for node in topology.nodes:
        if node.name not in namespaces:  # a share of a fabric over servers: another server's node
            continue
        values = dict(topology.tcp.sysctls()) if node.is_host else dict(router)
        if not node.is_host and seed and HASH_SEED.exists():
            values["net.ipv4.fib_multipath_hash_seed"] = str(seed)
        with netns.entered(namespaces[node.name]):
            for key, val in values.items():
                p = Path("/proc/sys") / key.replace(".", "/")
                if not p.exists() and key.endswith("hash_seed"):
                    continue
                try:
                    p.write_text(val)
                except PermissionError:
                    if key != "net.ipv4.tcp_congestion_control":
                        raise
                    cc_default_failed.append(node.name)
    return cc_default_failed
