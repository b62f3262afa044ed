"""Servers and the tunnels between them: what carries a fabric link whose two ends sit on different machines.

A *server* here is a network namespace standing for one machine's own network stack (its NIC, its address on the
datacentre network): ``tb-<run>-server-<i>``. The servers' NICs meet on a bridge in one more namespace,
``tb-<run>-dcnet`` (the datacentre network that joins real servers). A fabric link that crosses servers is a
pair of VXLAN devices (RFC 7348: Ethernet frames in UDP, the kernel's own L2 tunnel), each created in its
server's namespace, so its UDP socket and underlay routing stay there, then moved into the emulated node's
namespace under the port's planned name and MAC: what Mininet's cluster edition does with GRE taps
(``RemoteGRELink``), which this machine's kernel lacks (no ``ip_gre``), and what an overlay between real servers
does. The underlay has jumbo MTU, so a 1500-byte fabric frame plus the 50-byte VXLAN header crosses unfragmented.
"""

from __future__ import annotations

import os

from testbed.kernel import netns

#: the IANA VXLAN port
VXLAN_PORT = 4789
#: VXLAN over IPv4 adds 50 bytes (outer Ethernet 14, IPv4 20, UDP 8, VXLAN 8)
VXLAN_OVERHEAD_BYTES = 50
#: the datacentre network's MTU: a 1500-byte fabric frame plus VXLAN fits with room to spare
UNDERLAY_MTU = 9000
#: server i's underlay address: 198.19.0.i/24 (RFC 2544 benchmarking space, beside the fabric's 198.18.0.0/16)
UNDERLAY_NET = "198.19.0"
UNDERLAY_PREFIXLEN = 24
DCNET_BRIDGE = "dcnet"
#: a VXLAN end's name before it moves into its node (the project's link prefix: `testbed clean` knows it)
TMP_PREFIX = "tbvx"
SERVER_NIC = "eth0"


def underlay_ip(index: int) -> str:
    """Server ``index`` (1-based)'s address on the datacentre network."""
    if not 1 <= index <= 254:
        raise ValueError(f"server index {index} outside 1..254")
    return f"{UNDERLAY_NET}.{index}"


def build_underlay(dcnet_ns: str, servers: list[str]) -> None:
    """The datacentre network: a bridge in ``dcnet_ns`` and one veth from each server namespace to it (``eth0`` in
    the server, with address :func:`underlay_ip`, MTU :data:`UNDERLAY_MTU`). The namespaces exist already."""
    with netns.ipr_in(dcnet_ns) as ipr:
        ipr.link("add", ifname=DCNET_BRIDGE, kind="bridge", mtu=UNDERLAY_MTU)
        br = ipr.link_lookup(ifname=DCNET_BRIDGE)[0]
        for i, server_ns in enumerate(servers, start=1):
            port = f"s{i}"
            fd = os.open(netns.NETNS_DIR / server_ns, os.O_RDONLY)
            try:
                ipr.link("add", ifname=port, kind="veth", mtu=UNDERLAY_MTU,
                         peer={"ifname": SERVER_NIC, "net_ns_fd": fd, "mtu": UNDERLAY_MTU})
            finally:
                os.close(fd)
            idx = ipr.link_lookup(ifname=port)[0]
            ipr.link("set", index=idx, master=br, state="up")
        ipr.link("set", index=br, state="up")
    for i, server_ns in enumerate(servers, start=1):
        with netns.ipr_in(server_ns) as ipr:
            idx = ipr.link_lookup(ifname=SERVER_NIC)[0]
            ipr.addr("add", index=idx, address=underlay_ip(i), prefixlen=UNDERLAY_PREFIXLEN)
            ipr.link("set", index=idx, state="up")


def add_vxlan_end(server_ns: str | None, node_ns: str, ifname: str, vni: int, local_ip: str, remote_ip: str,
                  mac: str | None, mtu: int) -> None:
    """One end of a tunnelled link: a VXLAN device with ``vni`` from ``local_ip`` to ``remote_ip`` made in
    ``server_ns`` (its socket and underlay stay there; None: the caller's own namespace, a real server's NIC) and
    moved into ``node_ns`` as ``ifname`` with ``mac`` (None: the kernel's) and ``mtu`` (left down: the fabric
    builder brings every port up). No MAC learning: the one remote is the far end. The temporary name carries the
    project's link prefix, so `testbed clean` removes one a crash left in a server's own namespace."""
    tmp = f"{TMP_PREFIX}{vni}"
    fd = os.open(netns.NETNS_DIR / node_ns, os.O_RDONLY)
    try:
        with (netns.ipr_in(server_ns) if server_ns else netns.ipr(None)) as ipr:
            ipr.link("add", ifname=tmp, kind="vxlan", vxlan_id=vni, vxlan_local=local_ip, vxlan_group=remote_ip,
                     vxlan_port=VXLAN_PORT, vxlan_learning=0, mtu=mtu, **({"address": mac} if mac else {}))
            idx = ipr.link_lookup(ifname=tmp)[0]
            try:
                ipr.link("set", index=idx, net_ns_fd=fd, ifname=ifname)
            except BaseException:  # never leave it in the server's own namespace (also on the agent's SIGTERM)
                ipr.link("del", index=idx)
                raise
    finally:
        os.close(fd)


def udp_datagrams(server_ns: str | None) -> dict[str, int]:
    """The server's UDP counters (/proc/net/snmp in its namespace; None: the caller's own): what its tunnels carried
    (InDatagrams, OutDatagrams) and any receive errors, e.g. ``{"InDatagrams": 4012, "RcvbufErrors": 0}``."""
    def read() -> dict[str, int]:
        with open("/proc/thread-self/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Udp:")]
        return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:])} if len(rows) >= 2 else {}
    if server_ns is None:
        return read()
    with netns.entered(server_ns):
        return read()


def link_stats(ns: str, ifname: str) -> dict[str, int]:
    """An interface's packet and byte counters both ways (its IFLA_STATS64), e.g. a tunnelled port's."""
    with netns.ipr_in(ns) as ipr:
        st = ipr.get_links(ipr.link_lookup(ifname=ifname)[0])[0].get_attr("IFLA_STATS64")
    return {k: int(st[k]) for k in ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes", "rx_dropped", "tx_dropped")}
