"""Links between namespaces: veth pairs, addresses, MTU, and offloads off.

A veth pair stands for a cable between two ports. Offloads (GSO/TSO/GRO and friends) are turned off on every
emulated port so that the kernel queues, marks and drops wire-sized packets: with them on, a queued "packet" on a
veth was measured at ~25 KB, which makes queue lengths and marking thresholds in packets meaningless.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

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


SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSSET_INFO = 0x37
ETHTOOL_GFEATURES = 0x3A
ETHTOOL_SFEATURES = 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32
_feature_names: list[str] = []  # the kernel's netdev feature strings (one global table: read once per process)


def _ethtool(sock: socket.socket, ifname: str, buf) -> None:
    """One SIOCETHTOOL ioctl: ifreq {name, pointer to `buf`} (the kernel reads and writes `buf` in place)."""
    fcntl.ioctl(sock, SIOCETHTOOL, struct.pack("16sP16x", ifname.encode(), ctypes.addressof(buf)))


def feature_names(sock: socket.socket, ifname: str) -> list[str]:
    """Names of the netdev feature bits, in bit order (ETH_SS_FEATURES, as `ethtool -k` lists them)."""
    if not _feature_names:
        info = ctypes.create_string_buffer(struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0))
        _ethtool(sock, ifname, info)
        count = struct.unpack_from("I", info, 16)[0]
        gs = ctypes.create_string_buffer(struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count),
                                         12 + count * ETH_GSTRING_LEN)
        _ethtool(sock, ifname, gs)
        raw = gs.raw[12:]
        _feature_names[:] = [raw[i * ETH_GSTRING_LEN:(i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode()
                             for i in range(count)]
    return _feature_names


def _gfeatures(sock: socket.socket, ifname: str, words: int) -> list[tuple[int, int, int, int]]:
    """(available, requested, active, never_changed) per 32-bit word of the device's features."""
    buf = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_GFEATURES, words), 8 + 16 * words)
    _ethtool(sock, ifname, buf)
    return [struct.unpack_from("IIII", buf, 8 + 16 * w) for w in range(words)]


def _sfeatures(sock: socket.socket, ifname: str, words: int, bits: dict[int, bool]) -> None:
    """One ETHTOOL_SFEATURES request: set each feature bit in ``bits`` (bit index -> on) and leave the rest."""
    valid, req = [0] * words, [0] * words
    for i, on in bits.items():
        valid[i // 32] |= 1 << (i % 32)
        req[i // 32] |= int(on) << (i % 32)
    msg = struct.pack("II", ETHTOOL_SFEATURES, words) + b"".join(struct.pack("II", v, r) for v, r in zip(valid, req))
    _ethtool(sock, ifname, ctypes.create_string_buffer(msg, len(msg)))


def offloads_off_sock(sock: socket.socket, ifname: str) -> dict[str, bool]:
    """offloads_off through `sock`, an AF_INET datagram socket opened in the interface's namespace: three ethtool
    ioctls (get, set every offload feature the device can change to off, get again), no namespace switch."""
    names = feature_names(sock, ifname)
    words = (len(names) + 31) // 32
    before = _gfeatures(sock, ifname, words)
    touched = [(i, n) for i, n in enumerate(names) if _is_offload(n) and before[i // 32][0] >> (i % 32) & 1]
    _sfeatures(sock, ifname, words, {i: False for i, _ in touched})
    after = _gfeatures(sock, ifname, words)
    return {n: bool(after[i // 32][2] >> (i % 32) & 1) for i, n in touched}


def offloads_off(ns: str, ifname: str) -> dict[str, bool]:
    """Turn segmentation/receive offloads off on one port (ethtool ioctls inside the namespace).

    Returns the resulting state of each feature it touched; a feature the device does not have is skipped.
    """
    with _dgram_in(ns) as sock:
        return offloads_off_sock(sock, ifname)


#: the receive-aggregation features (ethtool's strings; `ethtool -k` shows rx-gro as generic-receive-offload):
#: software GRO, hardware GRO, GRO into skb lists, and GRO of forwarded UDP (which merges tunnelled datagrams)
GRO_FEATURES = ("rx-gro", "rx-gro-hw", "rx-gro-list", "rx-udp-gro-forwarding")


def _dgram_in(ns: str | None) -> socket.socket:
    """An AF_INET datagram socket for ethtool ioctls, opened in namespace ``ns`` (None: the caller's own)."""
    if ns is None:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with netns.entered(ns):
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


def gro_features(ns: str | None, ifname: str) -> dict[str, bool]:
    """Which of GRO_FEATURES are active on an interface (ETHTOOL_GFEATURES, as `ethtool -k` reads them), for the
    ones the kernel names: whether frames arriving there can be merged into super-packets before they are
    forwarded."""
    with _dgram_in(ns) as sock:
        names = feature_names(sock, ifname)
        words = _gfeatures(sock, ifname, (len(names) + 31) // 32)
    return {n: bool(words[i // 32][2] >> (i % 32) & 1) for i, n in enumerate(names) if n in GRO_FEATURES}


def set_features(ns: str | None, ifname: str, wanted: dict[str, bool]) -> None:
    """Turn named features on or off on one interface (ETHTOOL_SFEATURES, as `ethtool -K`): e.g. GRO on a
    server's NIC in a test, as a real NIC has it. LookupError for a name the kernel does not have."""
    with _dgram_in(ns) as sock:
        names = feature_names(sock, ifname)
        for name in wanted:
            if name not in names:
                raise LookupError(f"no feature {name!r} (the kernel's: {', '.join(names)})")
        _sfeatures(sock, ifname, (len(names) + 31) // 32, {names.index(n): on for n, on in wanted.items()})
