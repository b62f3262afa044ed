"""Links between namespaces: veth pairs, addresses, MTU, and offloads off.

A veth pair stands for a cable between two ports. Offloads (GSO/TSO/GRO and friends) are turned off on every
emulated port so that the kernel queues, marks and drops wire-sized packets: with them on, a queued "packet" on a
veth was measured at ~25 KB, which makes queue lengths and marking thresholds in packets meaningless.
"""

from __future__ import annotations

import contextlib

from testbed.kernel import netns



def _is_offload(feature: str) -> bool:
    """Segmentation (TSO/GSO/USO...) and receive aggregation (GRO...) features: the ones that make super-packets."""
    return "segmentation" in feature or "gro" in feature or feature == "tx-gso-list"


def add_veth(ns_a: str, if_a: str, ns_b: str, if_b: str, mtu: int = 1500, mac_a: str | None = None,
             mac_b: str | None = None) -> None:
    """A cable: veth if_a in ns_a <-> if_b in ns_b, both up, MTU set."""
    if len(if_a) > 15 or len(if_b) > 15:
        raise ValueError(f"interface names must fit 15 characters: {if_a!r}, {if_b!r}")
    peer = {"ifname": if_b, "net_ns_fd": ns_b, "mtu": mtu}
    if mac_b:
        peer["address"] = mac_b
    kw = {"address": mac_a} if mac_a else {}
    with netns.ipr(ns_a) as ipr:
        ipr.link("add", ifname=if_a, kind="veth", peer=peer, mtu=mtu, **kw)
        ipr.link("set", index=ipr.link_lookup(ifname=if_a)[0], state="up")
    with netns.ipr(ns_b) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=if_b)[0], state="up")


def add_address(ns: str, ifname: str, address: str, prefixlen: int) -> None:
    with netns.ipr(ns) as ipr:
        ipr.addr("add", index=ipr.link_lookup(ifname=ifname)[0], address=address, prefixlen=prefixlen)


def index(ns: str, ifname: str) -> int:
    with netns.ipr(ns) as ipr:
        found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise LookupError(f"no interface {ifname} in {ns}")
    return found[0]


def mac(ns: str, ifname: str) -> str:
    with netns.ipr(ns) as ipr:
        return ipr.get_links(ipr.link_lookup(ifname=ifname)[0])[0].get_attr("IFLA_ADDRESS")


def offloads_off(ns: str, ifname: str) -> dict[str, bool]:
    """Turn segmentation/receive offloads off on one port (ethtool ioctls inside the namespace).

    Returns the resulting state of each feature it touched; a feature the device does not have is skipped.
    """
    from pyroute2.ethtool import Ethtool

    result: dict[str, bool] = {}
    with netns.entered(ns):
        eth = Ethtool()
        try:
            feats = eth.get_features(ifname)
            touched = [n for n, f in feats.features.items() if _is_offload(n) and f.available]
            for name in touched:
                feats.features[name].enable = False
            eth.set_features(ifname, feats)
            after = eth.get_features(ifname)
            for name in touched:
                result[name] = bool(after.features[name].enable)
        finally:
            with contextlib.suppress(Exception):
                eth.close()
    return result
