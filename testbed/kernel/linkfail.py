"""A link that stops carrying frames, and routes that change while a fabric runs (the kernel side of
testbed.faults.timeline).

A dead link: on the receiving end of each direction, a u32 filter on the port's ingress (prio 1, before any
impairment filter) redirects every frame to ``tbdead``, an IFB in that namespace whose only qdisc is a bfifo of
one byte, so every frame redirected to it is dropped and counted there. Both ends stay administratively up with
carrier, as in a gray failure or before loss of signal is noticed: the sender's port keeps draining its queue into
the dead link at line rate (what was queued or in flight is lost, as on a cut fibre) and nothing in the kernel's
routing reacts. What routing does once the failure is detected (a BFD session timing out) is a separate step,
:func:`apply_routes`, that testbed.faults.timeline schedules after the detection delay.

Why not ``ip link set down``: the kernel would react at once (the local end's routes flushed, static routes not
restored on up), which is neither the fabric's detection delay nor its recovery.
"""

from __future__ import annotations

import contextlib
from typing import Any

from testbed.kernel import qdisc

BLACKHOLE_IFNAME = "tbdead"
CUT_PRIO = 1  # before the impairment filters (testbed.network.fabric uses prio 10 for those)
RTNH_F_ONLINK = 4
RTAX_LOCK_RTO_MIN = 1 << 13  # RTAX_LOCK bit of RTAX_RTO_MIN (include/uapi/linux/rtnetlink.h)


def blackhole(ipr) -> int:
    """The namespace's ``tbdead`` IFB (made on first use): up, root bfifo limit 1 byte. Returns its index."""
    found = ipr.link_lookup(ifname=BLACKHOLE_IFNAME)
    if found:
        return found[0]
    ipr.link("add", ifname=BLACKHOLE_IFNAME, kind="ifb")
    idx = ipr.link_lookup(ifname=BLACKHOLE_IFNAME)[0]
    ipr.link("set", index=idx, state="up")
    ipr.tc("add", "bfifo", index=idx, handle="1:", limit=1)
    return idx


def prepare(ipr, idx: int) -> int:
    """Everything a cut of interface `idx` needs but the filter itself (the blackhole, an ingress qdisc), made
    ahead so that the cut is one netlink request. Returns the blackhole's index, for :func:`cut`."""
    hole = blackhole(ipr)
    qdisc.ensure_ingress(ipr, idx)
    return hole


def cut(ipr, idx: int, hole: int) -> None:
    """Every frame arriving at interface `idx` is dropped (redirected to the blackhole `hole`, from
    :func:`prepare`) until :func:`mend`."""
    qdisc.redirect_ingress(ipr, idx, CUT_PRIO, hole)


def mend(ipr, idx: int) -> None:
    """Remove the cut on interface `idx` (frames arrive again). The filter is deleted by its priority, without a
    kind: pyroute2's u32 encoder wants a classid even for a delete, and a failed delete must not pass unnoticed
    (the link would stay dead)."""
    ipr.tc("del-filter", index=idx, parent=qdisc.INGRESS_PARENT, prio=CUT_PRIO, protocol=qdisc.ETH_P_ALL)


def dropped(ipr) -> int:
    """Frames the namespace's dead links swallowed (the blackhole's drop counter; 0 if it was never made)."""
    found = ipr.link_lookup(ifname=BLACKHOLE_IFNAME)
    if not found:
        return 0
    for q in ipr.get_qdiscs(index=found[0]):
        s2 = q.get_attr("TCA_STATS2")
        queue = s2.get_attr("TCA_STATS_QUEUE") if s2 else None
        if queue is not None:
            return int(queue["drops"])
    return 0


def route_request(r, ifindex: dict[str, int]) -> dict[str, Any]:
    """pyroute2 route arguments for a :class:`topologies.spec.Route` (`ifindex`: the node's interfaces by name)."""
    kw: dict[str, Any] = {"dst": r.dst}
    if r.ecmp:
        kw["multipath"] = [{"gateway": nh.gateway, "oif": ifindex[nh.ifname],
                            **({"flags": RTNH_F_ONLINK} if r.onlink else {})} for nh in r.nexthops]
    else:
        nh = r.nexthops[0]
        kw["oif"] = ifindex[nh.ifname]
        if nh.gateway is not None:
            kw["gateway"] = nh.gateway
        else:
            kw["scope"] = 253  # link
        if r.onlink:
            kw["flags"] = RTNH_F_ONLINK
    if r.rto_min_ms is not None:
        # ms, as `ip route ... rto_min`, and locked as iproute2 always does: TCP takes a route's rto_min only when
        # its lock bit is set (tcp_rto_min(): dst_metric_locked(dst, RTAX_RTO_MIN)); unlocked, every connection
        # keeps the 200 ms default
        kw["metrics"] = {"rto_min": int(r.rto_min_ms), "lock": RTAX_LOCK_RTO_MIN}
    return kw


def apply_routes(ipr, ifindex: dict[str, int], replace: list, delete: list[str]) -> None:
    """Replace (or add) `replace` and delete the routes to `delete` in one namespace."""
    for r in replace:
        ipr.route("replace", proto="static", type="unicast", **route_request(r, ifindex))
    for dst in delete:
        with contextlib.suppress(Exception):  # already gone (the kernel flushed it, or never had it)
            ipr.route("del", dst=dst)


__all__ = ["BLACKHOLE_IFNAME", "apply_routes", "blackhole", "cut", "dropped", "mend", "prepare", "route_request"]
