"""The plug qdisc over raw netlink: add one (released), block it (TCQ_PLUG_BUFFER: the class stops dequeuing at
once, arriving packets queue behind), release it (TCQ_PLUG_RELEASE_INDEFINITE), delete it. This is how the PFC
emulation (testbed.pfc.controller) pauses and resumes an egress class. Each change is one RTM_NEWQDISC on a
NETLINK_ROUTE
socket kept open in the port's namespace and waits for the kernel's acknowledgement: a pause applied is a pause the
kernel holds. (pyroute2 has no plug encoder, and the controller's per-message cost matters: it runs every poll.)
"""

from __future__ import annotations

import os
import struct

from testbed.kernel import netns

_NLMSG_HDR = struct.Struct("=LHHLL")
_TCMSG = struct.Struct("=BxxxiIII")
_RTA = struct.Struct("=HH")
_PLUG_QOPT = struct.Struct("=iI")  # struct tc_plug_qopt { int action; __u32 limit; }
RTM_NEWQDISC, RTM_DELQDISC = 36, 37
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
NLMSG_ERROR = 2
TCA_KIND, TCA_OPTIONS = 1, 2
PLUG_BUFFER, PLUG_RELEASE_ONE, PLUG_RELEASE_INDEFINITE, PLUG_LIMIT = 0, 1, 2, 3


def tc_handle(major: int, minor: int = 0) -> int:
    return ((major & 0xFFFF) << 16) | (minor & 0xFFFF)


def _rta(typ: int, payload: bytes) -> bytes:
    ln = _RTA.size + len(payload)
    return _RTA.pack(ln, typ) + payload + b"\0" * ((4 - ln % 4) % 4)


def plug_message(msg_type: int, flags: int, seq: int, ifindex: int, handle: int, parent: int,
                 action: int | None = None, limit: int = 0) -> bytes:
    """One RTM_NEWQDISC / RTM_DELQDISC for a plug qdisc (options only when action is not None)."""
    body = _TCMSG.pack(0, ifindex, handle, parent, 0) + _rta(TCA_KIND, b"plug\0")
    if action is not None:
        body += _rta(TCA_OPTIONS, _PLUG_QOPT.pack(action, limit))
    return _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), msg_type, flags, seq, 0) + body


class PlugSocket:
    """A NETLINK_ROUTE socket opened inside one namespace, for plug qdisc changes (each acknowledged)."""

    def __init__(self, ns: str | None):
        self.sock = netns.netlink_socket(ns)
        self.seq = 0
        self.buf = bytearray(65536)

    def close(self) -> None:
        self.sock.close()

    def _call(self, msg_type: int, flags: int, ifindex: int, handle: int, parent: int, action=None,
              limit: int = 0) -> None:
        self.seq += 1
        self.sock.send(plug_message(msg_type, flags | NLM_F_REQUEST | NLM_F_ACK, self.seq, ifindex, handle, parent,
                                    action, limit))
        while True:
            n = self.sock.recv_into(self.buf)
            off = 0
            while off + 16 <= n:
                ln, typ, _, seq, _ = _NLMSG_HDR.unpack_from(self.buf, off)
                if ln < 16:
                    break
                if typ == NLMSG_ERROR and seq == self.seq:
                    err = -struct.unpack_from("=i", self.buf, off + 16)[0]
                    if err:
                        raise OSError(err, f"plug qdisc {handle >> 16:x}: on ifindex {ifindex}: "
                                           f"{os.strerror(err)}")
                    return
                off += (ln + 3) & ~3

    def add(self, ifindex: int, handle: int, parent: int, limit: int) -> None:
        """Create a plug (limit in bytes) and leave it released (a new plug starts blocked)."""
        self._call(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, ifindex, handle, parent, PLUG_BUFFER, limit)
        self.set(ifindex, handle, parent, PLUG_RELEASE_INDEFINITE)

    def set(self, ifindex: int, handle: int, parent: int, action: int) -> None:
        self._call(RTM_NEWQDISC, 0, ifindex, handle, parent, action, 0)

    def block(self, ifindex: int, handle: int, parent: int) -> None:
        self.set(ifindex, handle, parent, PLUG_BUFFER)

    def release(self, ifindex: int, handle: int, parent: int) -> None:
        self.set(ifindex, handle, parent, PLUG_RELEASE_INDEFINITE)


def delete_qdisc(ipr, ifindex: int, handle: int, parent: int) -> None:
    ipr.tc("del", index=ifindex, handle=handle, parent=parent)


__all__ = ["NLM_F_ACK", "NLM_F_CREATE", "NLM_F_EXCL", "NLM_F_REQUEST", "PLUG_BUFFER", "PLUG_LIMIT",
           "PLUG_RELEASE_INDEFINITE", "PLUG_RELEASE_ONE", "RTM_DELQDISC", "RTM_NEWQDISC", "PlugSocket", "delete_qdisc",
           "plug_message", "tc_handle"]
