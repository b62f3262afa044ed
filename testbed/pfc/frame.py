"""802.1Qbb priority flow control frames on the wire, for the lab reader's capture.

testbed.pfc.controller pauses a port by plugging its queue; on hardware the pause is a MAC control frame the congested
switch sends out of its ingress port to the upstream neighbour: destination 01:80:c2:00:00:01, EtherType 0x8808,
opcode 0x0101, a priority-enable vector and one pause time per priority in quanta of 512 bit times (XOFF: the
largest, 0xffff, refreshed while congested; XON: 0). With ``PauseFrames`` the controller sends that frame on the
link for every pause and resume it applies, so a capture of the link (tcpdump, Wireshark) shows the PFC frames a
student would see on a real fabric, each next to the traffic it stops.

The frames are a record, not the mechanism: the receiving Linux interface has no PFC handler and discards them
(the plug qdisc did the pausing). Like a MAC's own control frames they skip the port's queues (PACKET_QDISC_BYPASS),
so they are not shaped and the sending port's taps do not see them: capture at the paused (receiving) port. A real
switch refreshes XOFF before its pause time runs out; here one XOFF holds until the XON.

    frames = PauseFrames()
    frames.open(ns, ifname, [pcp])          # before the controller forks: an AF_PACKET socket on S's port to U
    frames.send(ns, ifname, pcp, pause=True)   # XOFF for priority pcp (pause=False: XON)
    frames.close()

Built with scapy's ``MACControlClassBasedFlowControl`` once per (port, priority, XOFF/XON) and cached as bytes, so
sending is one ``send()`` per transition.
"""

from __future__ import annotations

import socket

from testbed.kernel import netns

PFC_DST = "01:80:c2:00:00:01"
ETH_P_MAC_CONTROL = 0x8808
PFC_OPCODE = 0x0101
XOFF_QUANTA = 0xFFFF  # the longest pause a frame can ask for; XON is a frame with pause time 0
MIN_FRAME = 60  # bytes before the FCS: 802.3's 64-byte minimum
SOL_PACKET, PACKET_QDISC_BYPASS = 263, 20  # linux/socket.h, linux/if_packet.h


def pfc_frame(src_mac: str, pcp: int, quanta: int) -> bytes:
    """One 802.1Qbb frame from ``src_mac`` for priority ``pcp`` (0..7) with pause time ``quanta`` (0..0xffff)."""
    from scapy.contrib.mac_control import MACControlClassBasedFlowControl
    from scapy.layers.l2 import Ether

    if not 0 <= pcp <= 7:
        raise ValueError(f"PFC priority must be 0..7 (got {pcp})")
    if not 0 <= quanta <= 0xFFFF:
        raise ValueError(f"PFC pause time must be 0..65535 quanta (got {quanta})")
    pkt = Ether(dst=PFC_DST, src=src_mac, type=ETH_P_MAC_CONTROL) / MACControlClassBasedFlowControl(
        **{f"c{pcp}_enabled": 1, f"c{pcp}_pause_time": quanta})
    raw = bytes(pkt)
    return raw + b"\0" * max(0, MIN_FRAME - len(raw))


class PauseFrames:
    """AF_PACKET sockets on the ports that send PFC frames (a switch's port towards the neighbour it pauses)."""

    def __init__(self):
        self.socks: dict[tuple[str, str], socket.socket] = {}
        self.macs: dict[tuple[str, str], str] = {}
        self.cache: dict[tuple[str, str, int, bool], bytes] = {}
        self.sent = 0
        self.errors = 0

    def open(self, ns: str, ifname: str, pcps: list[int] | tuple[int, ...] = tuple(range(8))) -> None:
        """A socket on ``ifname`` in namespace ``ns`` and the XOFF/XON frames of priorities ``pcps``."""
        if (ns, ifname) not in self.socks:
            with netns.entered(ns):
                s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only, receive nothing
            try:
                s.bind((ifname, 0))
                # straight to the device, as a MAC sends its control frames: not into the port's own (possibly
                # paused or full) egress queues
                s.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
                mac = ":".join(f"{b:02x}" for b in s.getsockname()[4][:6])
            except OSError:
                s.close()
                raise
            self.socks[(ns, ifname)] = s
            self.macs[(ns, ifname)] = mac
        mac = self.macs[(ns, ifname)]
        for pcp in pcps:  # built now, before the controller forks: the controller never imports scapy
            for pause in (True, False):
                self.cache.setdefault((ns, ifname, pcp, pause), pfc_frame(mac, pcp, XOFF_QUANTA if pause else 0))

    def send(self, ns: str, ifname: str, pcp: int, pause: bool) -> None:
        try:
            self.socks[(ns, ifname)].send(self.cache[(ns, ifname, pcp, pause)])
            self.sent += 1
        except OSError:  # a full device queue: the pause itself (the plug) is already in place
            self.errors += 1

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()
