"""Impairments on the wire: delay, jitter, loss and corruption of packets *arriving* at a port, as netem on an IFB
device fed from the port's ingress by a mirred redirect (the way `tc` users emulate a bad cable or a lossy optic).
Not under the egress shaper: netem under HTB would count the packets in flight as queue, so a packet is shaped and
queued at the sender's egress, then delayed or lost "on the wire" before the receiver sees it. Built from the
topology's link specs at fabric build time, and changed live by the fault timeline (testbed.faults.timeline)."""

from __future__ import annotations

from testbed.kernel import PREFIX, netns, qdisc

IMPAIR_PRIO = 10  # ingress filter feeding an impairment's IFB: after a dead link's cut (testbed.kernel.linkfail)
NETEM_LIMIT_PACKETS = 100_000  # netem's own FIFO must never be the one that drops


def build_link_impairments(fabric, iprs) -> None:
    """Delay/jitter/loss of direction a->b on an IFB in b's namespace, fed from b's ingress (see docstring)."""
    count: dict[str, int] = {}
    for l, side in fabric.impaired:
        # traffic leaving `side` is delayed before the other end receives it
        rx, rx_port = (l.b, l.b_port) if side == "a" else (l.a, l.a_port)
        ipr = iprs[rx]
        k = count.get(rx, 0)
        count[rx] = k + 1
        ifb = f"tbifb{k}"
        ipr.link("add", ifname=ifb, kind="ifb")
        ifb_idx = ipr.link_lookup(ifname=ifb)[0]
        ipr.link("set", index=ifb_idx, state="up", mtu=l.spec.mtu)
        port_idx = ipr.link_lookup(ifname=rx_port)[0]
        ipr.tc("add", "ingress", index=port_idx)
        qdisc.redirect_ingress(ipr, port_idx, IMPAIR_PRIO, ifb_idx)
        ipr.tc("add", "netem", index=ifb_idx, handle="1:", delay=int(round(l.spec.delay_ms * 1000)),
               jitter=int(round(l.spec.jitter_ms * 1000)), loss=l.spec.loss_percent, limit=NETEM_LIMIT_PACKETS)
        fabric.ifb[(rx, rx_port)] = ifb


def set_rx_netem(fabric, node: str, ifname: str, loss_percent: float = 0.0, delay_ms: float = 0.0,
                 jitter_ms: float = 0.0, corrupt_percent: float = 0.0, ge_p_percent: float = 0.0,
                 ge_r_percent: float = 0.0, ge_bad_loss_percent: float = 100.0, ge_good_loss_percent: float = 0.0,
                 ipr=None) -> str:
    """Loss, delay, jitter and corruption of packets *arriving* at node:ifname: netem on an IFB fed from the
    port's ingress (made on first use; later calls change its netem in place, all zero clears it). Returns
    the IFB's name. ``ge_*``: bursty loss, netem's Gilbert-Elliott model (with ``ge_p_percent`` > 0, instead
    of ``loss_percent``): per packet, good -> bad with ge_p, bad -> good with ge_r; a packet is lost with
    ge_bad_loss in the bad state, ge_good_loss in the good one. ``ipr``: an open IPRoute in node's namespace
    (default: one opened for this call)."""
    if ipr is None:
        with netns.ipr(fabric.ns(node)) as own:
            return set_rx_netem(fabric, node, ifname, loss_percent, delay_ms, jitter_ms, corrupt_percent,
                                ge_p_percent, ge_r_percent, ge_bad_loss_percent, ge_good_loss_percent, own)
    netem = dict(delay=int(round(delay_ms * 1000)), jitter=int(round(jitter_ms * 1000)), loss=loss_percent,
                 prob_corrupt=corrupt_percent, limit=NETEM_LIMIT_PACKETS)
    if ge_p_percent > 0:
        netem["ge"] = (ge_p_percent / 100, ge_r_percent / 100, 1 - ge_bad_loss_percent / 100,
                       ge_good_loss_percent / 100)
    ifb = fabric.ifb.get((node, ifname))
    if ifb is None:
        ifb = f"{PREFIX}ifbl{len(fabric.ifb)}"
        ipr.link("add", ifname=ifb, kind="ifb")
        fabric.ifb[(node, ifname)] = ifb  # recorded before the netem: a failed netem leaves a usable IFB
        ifb_idx = ipr.link_lookup(ifname=ifb)[0]
        port_idx = ipr.link_lookup(ifname=ifname)[0]
        mtu = ipr.get_links(port_idx)[0].get_attr("IFLA_MTU")
        ipr.link("set", index=ifb_idx, state="up", mtu=mtu)
        qdisc.ensure_ingress(ipr, port_idx)
        qdisc.redirect_ingress(ipr, port_idx, IMPAIR_PRIO, ifb_idx)
    ipr.tc("replace", "netem", index=ipr.link_lookup(ifname=ifb)[0], handle="1:", **netem)
    return ifb


def link_netem(topology, node: str, ifname: str) -> dict[str, float]:
    """The netem settings the topology gives packets arriving at node:ifname (its link's delay, jitter, loss
    for that direction; all zero on a clean link): what a fault's netem is put back to."""
    for l in topology.links:
        if (node, ifname) in ((l.a, l.a_port), (l.b, l.b_port)):
            return {"loss_percent": l.spec.loss_percent, "delay_ms": l.spec.delay_ms,
                    "jitter_ms": l.spec.jitter_ms}
    raise KeyError(f"no link ends at {node}:{ifname}")
