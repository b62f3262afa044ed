"""Per-packet spraying on a router's uplinks, in the kernel (the plan and the why: topologies/spray.py).

On the egress of every port of a spray group, a clsact egress hook (it runs before the port's HTB and queue):

    prio 1   basic match meta(nfmark eq SPRAY_MARK)          -> ok         (already moved here: let it through)
    prio 2   basic match meta(random mask 0xffffffff lt T0) -> skbedit mark SPRAY_MARK,
                                                               mirred egress redirect dev <other port 1>
    prio 3   basic match meta(random lt T1) -> ...                               dev <other port 2>
    ...      (no match: the packet stays on the port the ECMP hash chose)

Each ``meta(random)`` draws a fresh random number per packet, so the cascade gives every port of the group 1/k of
the packets. The mark does not cross the veth (the namespace crossing scrubs it), so it never leaks downstream.
"""

from __future__ import annotations

from topologies.spray import SPRAY_MARK, SprayGroup

CLSACT_EGRESS = 0xFFFFFFF3  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)
ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800  # only IPv4 is sprayed: ARP must leave by the port its route chose (see install_group)


def _meta(kind: str, opnd: str, value: int, mask: int = 0) -> list[dict]:
    return [{"kind": "meta", "object": {"kind": kind, "opnd": opnd}, "value": int(value), "mask": mask}]


def install_group(ipr, group: SprayGroup, ifindex: dict[str, int] | None = None) -> int:
    """Install the sprayer on every port of `group` through `ipr` (a socket in the router's namespace). Returns the
    number of filters added. `ifindex`: the router's interface indexes by name, when the caller knows them.

    Only IPv4 frames are sprayed (data, and RoCEv2, which is UDP over IPv4). ARP is not: a request for spine1's
    address moved onto the link to spine2 gets no answer (spine2 does not own that address), so with 2 spines half of
    all resolution attempts failed and the first connect of a flow could end in EHOSTUNREACH. A real sprayer also
    sprays data packets, not the control plane."""
    index = {p: ifindex[p] if ifindex else ipr.link_lookup(ifname=p)[0] for p in group.ports}
    n = 0
    for port in group.ports:
        idx = index[port]
        ipr.tc("add", "clsact", index=idx)
        ipr.tc("add-filter", "basic", index=idx, parent=CLSACT_EGRESS, prio=1, protocol=ETH_P_ALL,
               match=_meta("nfmark", "eq", SPRAY_MARK), action="ok")
        n += 1
        for i, (target, threshold) in enumerate(group.moves(port)):
            ipr.tc("add-filter", "basic", index=idx, parent=CLSACT_EGRESS, prio=2 + i, protocol=ETH_P_IP,
                   match=_meta("random", "lt", threshold, mask=0xFFFFFFFF),  # the kernel draws 64 random bits
                   action=[{"kind": "skbedit", "mark": SPRAY_MARK},
                           {"kind": "mirred", "direction": "egress", "action": "redirect",
                            "ifindex": index[target]}])
            n += 1
    return n


def moved_packets(ipr, port: str) -> int:
    """Packets the sprayer on `port` moved elsewhere (the hit counts of its redirect filters)."""
    idx = ipr.link_lookup(ifname=port)[0]
    total = 0
    for f in ipr.get_filters(index=idx, parent=CLSACT_EGRESS):
        opts = f.get_attr("TCA_OPTIONS")
        if not opts or f.get_attr("TCA_KIND") != "basic" or (f["info"] >> 16) < 2:
            continue
        acts = opts.get_attr("TCA_BASIC_ACT")
        if acts is None:
            continue
        for a in acts.get("attrs", []):
            act = a[1]
            if act.get_attr("TCA_ACT_KIND") == "mirred":
                st = act.get_attr("TCA_ACT_STATS")
                basic = st.get_attr("TCA_STATS_BASIC") if st else None
                if basic is not None:
                    total += int(basic["packets"])
    return total


__all__ = ["CLSACT_EGRESS", "install_group", "moved_packets"]
