"""Many rtnetlink requests in one go: the IPRoute call syntax (tc / addr / route "add..." commands), encoded by
pyroute2 exactly as IPRoute would, sent in a few sendmsg calls on a plain netlink socket and acknowledged together.

    b = Batch(ipr, nl)       # ipr: an open pyroute2 IPRoute (encodes); nl: open_socket() opened in the same namespace
    b.tc("add", "htb", index=3, handle="1:", default=0x10)
    b.addr("add", index=3, address="10.0.0.1", prefixlen=24)
    b.commit()               # raises BatchError naming the first request the kernel refused, with its reason

Why: each IPRoute call runs pyroute2 0.9's asyncio machinery for one request and one acknowledgement (about a
millisecond on the host, far more in the software-emulated lab VM), and a fabric has hundreds of such requests.
Here pyroute2 only encodes; a tc request that differs from an earlier one only by its interface (every port of a
fabric gets the same few qdiscs and classes) reuses the earlier encoding with the interface index replaced. The
kernel handles the messages of one sendmsg one after the other, in order (a class after the qdisc it hangs from),
and acknowledges each; a refused one does not stop the ones after it, so the caller treats any error as a failed
build (and tears down).
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any

from pyroute2.iproute.linux import get_arguments_processor, get_dump_filter
from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import (RTM_NEWADDR, RTM_NEWLINK, RTM_NEWNEIGH, RTM_NEWQDISC, RTM_NEWROUTE,
                                   RTM_NEWTCLASS, RTM_NEWTFILTER)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.ndmsg import ndmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from testbed.kernel import netns
from testbed.kernel import tcext  # noqa: F401  (registers red, ets, flower, bfifo)

#: (message class, IPRoute's command map) per request family; only the commands that create something
_COMMANDS = {
    "tc": (tcmsg, {"add": (RTM_NEWQDISC, "create"), "add-class": (RTM_NEWTCLASS, "create"),
                   "add-filter": (RTM_NEWTFILTER, "create")}),
    "link": (ifinfmsg, {"add": (RTM_NEWLINK, "create")}),
    "addr": (ifaddrmsg, {"add": (RTM_NEWADDR, "create")}),
    "route": (rtmsg, {"add": (RTM_NEWROUTE, "create")}),
    "neigh": (ndmsg, {"add": (RTM_NEWNEIGH, "create")}),
}
#: bytes and requests per sendmsg, each chunk acknowledged before the next is sent: far below the socket's buffers
#: (an acknowledgement is small, but the kernel charges each about a kilobyte of receive buffer)
MAX_SEND_BYTES = 64 * 1024
MAX_SEND_REQUESTS = 64
ACK_TIMEOUT_S = 120  # the kernel answers at once; a stuck answer is a failed build, not a hang
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
NLMSG_ERROR = 2
NLM_F_CAPPED = 0x100
NLM_F_ACK_TLVS = 0x200
NLMSGERR_ATTR_MSG = 1
_HDR = struct.Struct("=IHHII")  # struct nlmsghdr: len, type, flags, seq, pid
_TCMSG_IFINDEX = _HDR.size + 4  # struct tcmsg: family u8, pad u8, pad u16, ifindex s32, ...
_templates: dict[tuple, bytes] = {}  # encoded tc requests by everything but the interface index
MAX_TEMPLATES = 512


class BatchError(OSError):
    """The kernel refused a request of a batch."""


def open_socket() -> socket.socket:
    """A NETLINK_ROUTE socket for Batch, in the calling thread's network namespace; errors come back with the
    kernel's own message (extended ack) and without a copy of the request."""
    s = netns.netlink_socket(None)
    try:
        s.settimeout(ACK_TIMEOUT_S)
        for opt in (NETLINK_CAP_ACK, NETLINK_EXT_ACK):
            try:
                s.setsockopt(SOL_NETLINK, opt, 1)
            except OSError:
                pass  # an old kernel: plain acknowledgements
        return s
    except BaseException:
        s.close()
        raise


class Batch:
    """Requests collected for one namespace, sent by :meth:`commit` (see the module docstring)."""

    def __init__(self, ipr, nl: socket.socket):
        self.ipr = ipr
        self.nl = nl
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self.calls)

    def _add(self, what: str, command: str, kw: dict[str, Any]) -> None:
        if command not in _COMMANDS[what][1]:
            raise ValueError(f"Batch.{what}: only {sorted(_COMMANDS[what][1])} (got {command!r})")
        self.calls.append((what, command, kw))

    def tc(self, command: str, kind: str | None = None, index: int | None = None, handle=None, **kw) -> None:
        """As IPRoute.tc(command, kind, index, handle, ...)."""
        if kind is None:
            raise ValueError("must specify kind for add commands")
        kw["kind"] = kind
        if index is not None:
            kw["index"] = index
        if handle is not None:
            kw["handle"] = handle
        self._add("tc", command, kw)

    def link(self, command: str, **kw) -> None:
        """As IPRoute.link(command, ...). A namespace (net_ns_fd, also a veth peer's) must be an open file
        descriptor that stays open until commit(): pyroute2 would open a name only while encoding."""
        self._add("link", command, kw)

    def addr(self, command: str, **kw) -> None:
        """As IPRoute.addr(command, ...)."""
        self._add("addr", command, kw)

    def route(self, command: str, **kw) -> None:
        """As IPRoute.route(command, ...) (which makes a route static and unicast unless told otherwise)."""
        kw["proto"] = kw.get("proto", "static") or "static"
        kw["type"] = kw.get("type", "unicast") or "unicast"
        self._add("route", command, kw)

    def neigh(self, command: str, **kw) -> None:
        """As IPRoute.neigh(command, ...)."""
        self._add("neigh", command, kw)

    # ---- encoding ----

    def _encode_pyroute2(self, what: str, command: str, kw: dict[str, Any]) -> bytes:
        """The request as IPRoute.<what>(command, **kw) would send it (pyroute2's own argument processing)."""
        core = self.ipr.asyncore
        msg_class, command_map = _COMMANDS[what]
        params = {"strict_check": core.status["strict_check"]} if what == "route" else None
        dump_filter, kw = get_dump_filter(what, command, dict(kw), params)
        arguments = get_arguments_processor(what, command, kw, params)
        request = NetlinkRequest(core, msg_class(), command, command_map, dump_filter, arguments, msg_seq=0,
                                 msg_pid=0)
        request.msg.encode()
        return bytes(request.msg.data)

    def _encode(self, what: str, command: str, kw: dict[str, Any]) -> bytes:
        if what != "tc" or "action" in kw or not isinstance(kw.get("index"), int):
            return self._encode_pyroute2(what, command, kw)
        key = (command, repr(sorted((k, v) for k, v in kw.items() if k != "index")))
        data = _templates.get(key)
        if data is None:
            data = self._encode_pyroute2(what, command, kw)
            if len(_templates) < MAX_TEMPLATES:
                _templates[key] = data
        buf = bytearray(data)
        struct.pack_into("=i", buf, _TCMSG_IFINDEX, kw["index"])
        return bytes(buf)

    # ---- sending ----

    def commit(self) -> None:
        """Send every collected request and wait for all acknowledgements; the batch is empty afterwards."""
        calls, self.calls = self.calls, []
        encoded = [bytearray(self._encode(*c)) for c in calls]
        i = 0
        while i < len(encoded):
            data = bytearray()
            pending: dict[int, int] = {}  # sequence number -> index in calls
            while i < len(encoded) and len(pending) < MAX_SEND_REQUESTS:
                if pending and len(data) + len(encoded[i]) > MAX_SEND_BYTES:
                    break
                seq = i + 1
                struct.pack_into("=II", encoded[i], 8, seq, 0)  # nlmsghdr seq, pid
                pending[seq] = i
                data += encoded[i]
                i += 1
            self.nl.send(bytes(data))
            self._acks(pending, calls)

    def _acks(self, pending: dict[int, int], calls) -> None:
        failed: tuple[int, int, str] | None = None
        while pending:
            buf = self.nl.recv(1 << 16)
            off = 0
            while off + _HDR.size <= len(buf):
                length, mtype, flags, seq, _ = _HDR.unpack_from(buf, off)
                if length < _HDR.size:
                    break
                if mtype == NLMSG_ERROR and seq in pending:
                    k = pending.pop(seq)
                    code = -struct.unpack_from("=i", buf, off + _HDR.size)[0]
                    if code and failed is None:
                        failed = (k, code, _ext_ack_message(buf, off, length, flags))
                off += (length + 3) & ~3
        if failed is not None:
            k, code, why = failed
            what, command, kw = calls[k]
            raise BatchError(code, f"{what} {command} {_describe(kw)}: {why or os.strerror(code)}")


def _ext_ack_message(buf: bytes, off: int, length: int, flags: int) -> str:
    """The kernel's message in an error acknowledgement (NLMSGERR_ATTR_MSG), if it sent one."""
    if not flags & NLM_F_ACK_TLVS:
        return ""
    pos = off + _HDR.size + 4  # past the error code: the request's header, and its payload unless capped
    pos += _HDR.size if flags & NLM_F_CAPPED else (struct.unpack_from("=I", buf, pos)[0] + 3) & ~3
    end = off + length
    while pos + 4 <= end:
        alen, atype = struct.unpack_from("=HH", buf, pos)
        if alen < 4:
            break
        if atype == NLMSGERR_ATTR_MSG:
            return bytes(buf[pos + 4:pos + alen]).split(b"\0", 1)[0].decode(errors="replace")
        pos += (alen + 3) & ~3
    return ""


def _describe(kw: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in kw.items() if k in ("kind", "index", "ifindex", "handle", "parent", "dst",
                                                          "address", "lladdr"))


__all__ = ["Batch", "BatchError", "open_socket"]
