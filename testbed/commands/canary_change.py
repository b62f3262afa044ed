"""A transport tuning change for `testbed canary`: parsed from ``--change KEY=VALUE`` (checked before anything is
built), applied live to a slice of a running fabric (some leaves, their downlink ports and their hosts), read back
from the kernel, and undone.

Keys, and the real mechanism each stands for:

| key | where | applied as |
|---|---|---|
| ``buffer_bytes`` | each slice leaf's ports to its hosts | the leaf queue replaced (bfifo limit, or RED's limit) |
| ``discipline`` | same | ``droptail`` (bfifo), ``red`` (RED, min = k_bytes), ``step`` (DCTCP marking at K) |
| ``k_bytes`` | same | RED's min threshold / the step marking threshold K |
| ``ecn`` | the ports' RED, and each slice host | RED marks instead of dropping; ``net.ipv4.tcp_ecn`` |
| ``rto_min_ms`` | each slice host | every route of the host replaced with ``rto_min lock N`` (``ip route``) |
| ``cc`` | each slice host | the congestion control the job's sockets set (``TCP_CONGESTION``) |

RED, step marking, ECN and dctcp/bbr need kernel features the host kernel may lack: :meth:`Change.needs` names
them, and the command runs in the lab VM (``--vm auto``) or refuses with one line (``--vm never``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from testbed.errors import UsageError
from testbed.params import Param

SWITCH_KEYS = ("buffer_bytes", "discipline", "k_bytes", "ecn")
HOST_KEYS = ("rto_min_ms", "cc", "ecn")
KEYS = {p.name: p for p in (
    Param("buffer_bytes", int, 0, "bytes", "buffer of the slice leaves' host ports", min=1600, max=1 << 30),
    Param("discipline", str, "", "", "queue discipline of those ports", choices=("droptail", "red", "step")),
    Param("k_bytes", int, 0, "bytes", "RED min threshold / step marking threshold K", min=1500, max=1 << 30),
    Param("ecn", bool, False, "", "ECN on the slice hosts (and RED marks instead of dropping)"),
    Param("rto_min_ms", int, 0, "ms", "per-route TCP rto_min of the slice hosts", min=1, max=120_000),
    Param("cc", str, "", "", "congestion control of the slice hosts' sockets",
          choices=("cubic", "reno", "dctcp", "bbr")),
)}
#: changes issue 27 names that a canary slice cannot carry, and why (the refusal's one line)
_PFC_WHY = ("PFC thresholds are not supported on a slice: pauses spread hop by hop from a canary leaf through the "
            "spines to the control's ports, and this fabric has no lossless class (the job is TCP, best effort)")
NOT_YET = {"pfc_xoff_bytes": _PFC_WHY, "pfc_xon_bytes": _PFC_WHY,
           "load_balancing": "load balancing is not supported by this canary: each slice's job stays inside its "
                             "leaf, so no flow takes a spine path and a balancing change alters nothing it measures"}


@dataclass(frozen=True)
class Change:
    """The keys an operator changes and their new values (``values``), over the fabric's settings (``base``)."""
    values: dict[str, Any]
    base: dict[str, Any]

    def text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.values.items())

    def after(self) -> dict[str, Any]:
        """The fabric's settings with the change applied."""
        return {**self.base, **self.values}

    @property
    def touches_switch(self) -> bool:
        return any(k in SWITCH_KEYS for k in self.values)

    @property
    def touches_hosts(self) -> bool:
        return any(k in HOST_KEYS for k in self.values)

    def needs(self) -> tuple[str, ...]:
        """Kernel capabilities (testbed.kernel.doctor's names) the changed settings need."""
        from testbed.workloads.bottleneck import bottleneck_needs

        return tuple(sorted(set(bottleneck_needs(self.after()))))


def parse_changes(texts: Sequence[str], base: dict[str, Any]) -> Change:
    """``["rto_min_ms=5", "buffer_bytes=256K"]`` over the fabric's settings -> a :class:`Change`; UsageError (one
    line) for no change, an unknown key, a bad value, a key given twice, or a change that sets nothing new or makes
    an impossible queue."""
    if not texts:
        raise UsageError("give at least one --change KEY=VALUE (keys: " + ", ".join(KEYS) + ")")
    values: dict[str, Any] = {}
    for t in texts:
        if "=" not in t:
            raise UsageError(f"--change takes KEY=VALUE (got {t!r})")
        k, v = (x.strip() for x in t.split("=", 1))
        k = k.replace("-", "_")
        if k in NOT_YET:
            raise UsageError(f"--change {k}: {NOT_YET[k]} (keys: {', '.join(KEYS)})")
        if k not in KEYS:
            raise UsageError(f"--change: unknown key {k!r} (keys: {', '.join(KEYS)})")
        if k in values:
            raise UsageError(f"--change {k} given twice")
        values[k] = KEYS[k].parse(v)
    same = [k for k, v in values.items() if base.get(k) == v]
    if same:
        raise UsageError(f"--change {same[0]}={values[same[0]]}: the fabric already has it (nothing would change)")
    after = {**base, **values}
    if "k_bytes" in values and after["discipline"] == "droptail":
        raise UsageError("--change k_bytes: a droptail queue has no threshold (change discipline=red or step too)")
    if after["cc"] == "dctcp" and not after["ecn"]:
        raise UsageError("--change cc=dctcp needs ECN: add --change ecn=1")
    from testbed.workloads.bottleneck import check_marking

    check_marking(after)
    return Change(values, dict(base))


# ---- applying it to a running fabric ----

def slice_ports(fabric, leaves: Sequence[str]) -> list[tuple[str, str]]:
    """(leaf, ifname) of every leaf_down port (a slice leaf's port towards one of its hosts)."""
    return [(p.node, p.ifname) for p in fabric.port_plans if p.node in leaves and p.tier == "leaf_down"]


def slice_hosts(fabric, leaves: Sequence[str]) -> list[str]:
    return [h for leaf in leaves for h in fabric.topology.hosts_of(leaf)]


def _set_queues(fabric, leaves: Sequence[str], settings: dict[str, Any]) -> None:
    from testbed.kernel import netns, tuning
    from testbed.network.portplan import leaf_queue
    from testbed.workloads.bottleneck import bottleneck_queue

    queue = leaf_queue(bottleneck_queue(settings))
    for node, ifname in slice_ports(fabric, leaves):
        plan = fabric.port_plan(node, ifname)
        with netns.ipr(fabric.ns(node)) as ipr:
            idx = ipr.link_lookup(ifname=ifname)[0]
            for minor, *_ in plan.classes:
                tuning.replace_leaf_queue(ipr, idx, minor, queue, plan.rate_mbps)


def _set_hosts(fabric, leaves: Sequence[str], settings: dict[str, Any], keys: Sequence[str]) -> None:
    from testbed.kernel import linkfail, netns

    for host in slice_hosts(fabric, leaves):
        ns = fabric.ns(host)
        if "rto_min_ms" in keys:
            routes = [dataclasses.replace(r, rto_min_ms=int(settings["rto_min_ms"]))
                      for r in fabric.topology.routes_of(host)]
            with netns.ipr(ns) as ipr:
                ifindex = {nh.ifname: ipr.link_lookup(ifname=nh.ifname)[0] for r in routes for nh in r.nexthops}
                linkfail.apply_routes(ipr, ifindex, routes, [])
        if "ecn" in keys:
            netns.sysctl_write(ns, "net.ipv4.tcp_ecn", str(int(bool(settings["ecn"]))))


def apply(fabric, leaves: Sequence[str], change: Change, undo: bool = False) -> None:
    """Put the changed settings (``undo``: the fabric's own) on the slice of ``leaves``."""
    settings = change.base if undo else change.after()
    if change.touches_switch:
        _set_queues(fabric, leaves, settings)
    _set_hosts(fabric, leaves, settings, [k for k in change.values if k in HOST_KEYS])


def read_back(fabric, leaves: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What the kernel holds on the slice: each leaf_down port's leaf queue (kind, limit) and each host's route
    rto_min values and tcp_ecn."""
    from testbed.kernel import netns, tuning

    out: dict[str, dict[str, Any]] = {}
    for node, ifname in slice_ports(fabric, leaves):
        plan = fabric.port_plan(node, ifname)
        with netns.ipr(fabric.ns(node)) as ipr:
            idx = ipr.link_lookup(ifname=ifname)[0]
            kind, limit = tuning.leaf_queue_limit(ipr, idx, plan.classes[0][0])
        out[f"{node}:{ifname}"] = {"qdisc": kind, "limit": limit}
    for host in slice_hosts(fabric, leaves):
        ns = fabric.ns(host)
        with netns.ipr(ns) as ipr:
            rto = tuning.route_rto_min_ms(ipr)
        out[host] = {"rto_min_ms": sorted({v for v in rto.values() if v is not None}),
                     "tcp_ecn": int(netns.sysctl_read(ns, "net.ipv4.tcp_ecn"))}
    return out


def mismatches(found: dict[str, dict[str, Any]], settings: dict[str, Any]) -> list[str]:
    """What :func:`read_back` found that differs from ``settings`` (the fabric's or the changed ones): each port's
    leaf queue kind and limit (what testbed.kernel.qdisc would install for them), each host's route rto_min (no
    metric: the kernel's 200 ms) and ECN (``tcp_ecn`` 1 requests it; 0 and 2 do not). Empty: the kernel holds
    exactly these settings. One line per difference, naming the port or host."""
    from testbed.network.portplan import leaf_queue
    from testbed.workloads.bottleneck import bottleneck_queue

    kind, args = leaf_queue(bottleneck_queue(settings)).tc_args(None)
    want_rto = int(settings["rto_min_ms"])
    out = []
    for where, v in found.items():
        if "qdisc" in v and (v["qdisc"] != kind or v["limit"] != args["limit"]):
            out.append(f"{where}: {v['qdisc']} limit {v['limit']}, not {kind} limit {args['limit']}")
        if "rto_min_ms" in v and (v["rto_min_ms"] or [200]) != [want_rto]:
            out.append(f"{where}: rto_min {v['rto_min_ms']} ms, not {want_rto}")
        if "tcp_ecn" in v and (v["tcp_ecn"] == 1) != bool(settings["ecn"]):
            out.append(f"{where}: tcp_ecn {v['tcp_ecn']}, ecn {bool(settings['ecn'])} wanted")
    return out


__all__ = ["Change", "HOST_KEYS", "KEYS", "SWITCH_KEYS", "apply", "mismatches", "parse_changes", "read_back",
           "slice_hosts", "slice_ports"]
