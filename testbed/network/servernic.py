"""Does a server's NIC carry its share's tunnels, and does it merge what they bring in? (docs/servers.md, issue 29)

Pure decisions on what a server's agent reports for its underlay address (serveragent's ``nic`` operation: the
interface holding the address, its MTU, its receive-aggregation features), shared by `testbed servers check` (whose
need is the servers file's ``mtu=``) and ServerFabric's check before any share is built (whose need is the largest
link crossing to that server plus VXLAN's 50 bytes). What they stand for: a VXLAN tunnel is a UDP socket bound to
the server's own address on the network joining the servers; an address that is on none of its interfaces makes a
tunnel whose packets go nowhere, and an underlay MTU below the inner frame plus VXLAN's outer headers fragments (or,
with don't-fragment, drops) every full-size frame.

GRO (generic receive offload) on the NIC that receives a tunnel merges consecutive VXLAN datagrams of one TCP flow
(the UDP tunnel GRO path) into one super-packet before decapsulation, so the frames crossing into that server can
reach the next shaped queue in the fabric as packets of up to 64 KB (as many of one flow as arrive within one receive
poll: more at high rates and on a busy or slow CPU), where a one-machine run queues wire-sized ones (every
fabric port has its offloads off: testbed.kernel.links). It is recorded as a fidelity caveat, not refused: most real
NICs and the lab VM's virtio NIC have it on.
"""

from __future__ import annotations

from testbed.kernel.tunnel import VXLAN_OVERHEAD_BYTES

#: the features that merge received frames (testbed.kernel.links.GRO_FEATURES' names; rx-gro-list links frames
#: into one skb the same way as far as a queue sees it)
MERGING = ("rx-gro", "rx-gro-hw", "rx-gro-list")


def needed_mtu(topology, placement) -> dict[str, tuple[int, str]]:
    """Per server with a crossing link: (the underlay MTU its NIC must carry: the largest crossing link's MTU plus
    VXLAN's 50 bytes, that link's name). Servers with no crossing link are absent (they need only their address,
    for the clock)."""
    need: dict[str, tuple[int, str]] = {}
    for i in placement.crossing:
        link = topology.links[i]
        mtu = link.spec.mtu + VXLAN_OVERHEAD_BYTES
        name = f"{link.a}:{link.a_port}-{link.b}:{link.b_port}"
        for node in (link.a, link.b):
            server = placement.server_of[node]
            if server not in need or mtu > need[server][0]:
                need[server] = (mtu, name)
    return need


def where(ns: str | None) -> str:
    return f"namespace {ns}" if ns else "the agent's namespace"


def problem(server: str, address: str, found: dict, need: int | None, why: str, ns: str | None = None) -> str | None:
    """One line saying why ``server``'s NIC cannot carry its tunnels, or None. ``found``: the agent's ``nic`` reply
    (``ifname`` None when no interface holds ``address``; then ``others``, the addresses that are there); ``need``:
    the MTU required (None: only the address), ``why`` what requires it."""
    if found.get("ifname") is None:
        others = ", ".join(found.get("others") or []) or "none"
        return (f"server {server}: address {address} (its tunnels' source) is on none of its interfaces in "
                f"{where(ns)} (found: {others}): fix address= in the servers file")
    if need is not None and found["mtu"] < need:
        return (f"server {server}: {address} is on {found['ifname']} with MTU {found['mtu']}, but {why} needs "
                f"{need}: raise the NIC's MTU or lower the links' (a smaller one fragments VXLAN's packets)")
    return None


def gro_on(found: dict) -> bool:
    """Whether the NIC merges received frames (any of MERGING active)."""
    return any((found.get("gro") or {}).get(f) for f in MERGING)


def gro_caveat(server: str, found: dict, receives_crossing: bool) -> str | None:
    """The fidelity caveat for a server whose NIC merges the crossing traffic it receives, or None."""
    if not receives_crossing or not gro_on(found):
        return None
    on = ", ".join(f for f in MERGING if (found.get("gro") or {}).get(f))
    return (f"server {server}: GRO is on on {found['ifname']} ({on}): frames crossing into it can reach the next "
            f"shaped queue as super-packets of up to 64 KB (those of one flow that arrive within one receive poll), "
            f"where a one-machine run queues wire-sized packets (queue lengths in packets, marking and drops differ)")
