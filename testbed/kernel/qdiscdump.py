"""Queue counters straight from the kernel's netlink reply: one RTM_GETQDISC dump of a whole namespace, parsed with
struct.

pyroute2 builds a full object tree per message (about 1 ms per dump on a fast host, 100+ ms in the software-
emulated lab VM), too slow to sample queues every millisecond. :class:`RawQdiscDump` reads the same counters
testbed.kernel.qdisc.leaf_stats reads (backlog, drops, RED marks, sent bytes and packets, overlimits) from the
reply itself; tests check that both agree on the same port. The queue sampler (testbed.measure.telemetry), the PFC
controller and the load-balancing record read through it.
"""

from __future__ import annotations

import os
import struct

from testbed.kernel import netns, qdisc

_NLMSG_HDR = struct.Struct("=LHHLL")
_TCMSG = struct.Struct("=BxxxiIII")
_RTA = struct.Struct("=HH")
_RTM_NEWQDISC, _RTM_GETQDISC, _NLMSG_DONE, _NLMSG_ERROR = 36, 38, 3, 2
_TCA_KIND, _TCA_XSTATS, _TCA_STATS2 = 1, 4, 7
_TCA_STATS_BASIC, _TCA_STATS_QUEUE, _TCA_STATS_PKT64 = 1, 3, 8
_BASIC = struct.Struct("=QL")
_QUEUE = struct.Struct("=LLLLL")  # qlen backlog drops requeues overlimits
_RED_X = struct.Struct("=LLLL")  # early pdrop other marked


def _attrs(buf, off: int, end: int):
    while off + 4 <= end:
        ln, typ = _RTA.unpack_from(buf, off)
        if ln < 4:
            return
        yield typ & 0x3FFF, off + 4, off + ln
        off += (ln + 3) & ~3


class RawQdiscDump:
    """One NETLINK_ROUTE socket opened inside a namespace; `leaf_stats()` -> {ifindex: [QueueSample, ...]} of every
    qdisc whose parent is an HTB class 1:x (the leaf queues install_port makes), as qdisc.leaf_stats reports them."""

    def __init__(self, ns: str | None):
        self.sock = netns.netlink_socket(ns)
        self.seq = 0
        self.buf = bytearray(1 << 20)

    def close(self) -> None:
        self.sock.close()

    def leaf_stats(self) -> dict[int, list[qdisc.QueueSample]]:
        """{ifindex: [QueueSample of each leaf queue under HTB 1:]}, one dump of the whole namespace."""
        out: dict[int, list[qdisc.QueueSample]] = {}
        for ifindex, parent, q in self.all_stats():
            if parent != 0xFFFFFFFF and (parent >> 16) == 1:
                out.setdefault(ifindex, []).append(q)
        return out

    def root_stats(self, ifindex: int) -> qdisc.QueueSample | None:
        """The root qdisc's own counters on one interface (for HTB: what the shaper sent)."""
        for i, parent, q in self.all_stats():
            if i == ifindex and parent == 0xFFFFFFFF:
                return q
        return None

    def all_stats(self) -> list[tuple[int, int, qdisc.QueueSample]]:
        """(ifindex, parent, QueueSample) of every qdisc in the namespace (minor = handle major of the qdisc)."""
        self.seq += 1
        req = _NLMSG_HDR.pack(_NLMSG_HDR.size + _TCMSG.size, _RTM_GETQDISC, 0x301, self.seq, 0) + \
            _TCMSG.pack(0, 0, 0, 0, 0)
        self.sock.send(req)
        out: list[tuple[int, int, qdisc.QueueSample]] = []
        buf = self.buf
        while True:
            n = self.sock.recv_into(buf)
            off = 0
            while off + 16 <= n:
                ln, typ, _, seq, _ = _NLMSG_HDR.unpack_from(buf, off)
                if ln < 16:
                    break
                if typ == _NLMSG_DONE:
                    return out
                if typ == _NLMSG_ERROR:
                    err = -struct.unpack_from("=i", buf, off + 16)[0]
                    raise OSError(err, f"RTM_GETQDISC: {os.strerror(err)}")
                if typ == _RTM_NEWQDISC and seq == self.seq:
                    out.append(self._one(buf, off + 16, off + ln))
                off += (ln + 3) & ~3

    @staticmethod
    def _one(buf, off: int, end: int) -> tuple[int, int, qdisc.QueueSample]:
        _, ifindex, handle, parent, _ = _TCMSG.unpack_from(buf, off)
        kind = ""
        bbytes = bpk = 0
        pk64 = None
        q = (0, 0, 0, 0, 0)
        marks = 0
        xstats = None
        for typ, a, b in _attrs(buf, off + _TCMSG.size, end):
            if typ == _TCA_KIND:
                kind = bytes(buf[a:b]).split(b"\0", 1)[0].decode()
            elif typ == _TCA_STATS2:
                for t2, c, d in _attrs(buf, a, b):
                    if t2 == _TCA_STATS_BASIC and d - c >= 12:
                        bbytes, bpk = _BASIC.unpack_from(buf, c)
                    elif t2 == _TCA_STATS_QUEUE and d - c >= 20:
                        q = _QUEUE.unpack_from(buf, c)
                    elif t2 == _TCA_STATS_PKT64 and d - c >= 8:
                        pk64 = struct.unpack_from("=Q", buf, c)[0]
            elif typ == _TCA_XSTATS:
                xstats = (a, b)
        if kind == "red" and xstats and xstats[1] - xstats[0] >= 16:
            marks = _RED_X.unpack_from(buf, xstats[0])[3]
        return ifindex, parent, qdisc.QueueSample(
            minor=handle >> 16, kind=kind, backlog_bytes=q[1], backlog_packets=q[0], drops=q[2], marks=marks,
            sent_bytes=bbytes, sent_packets=pk64 if pk64 is not None else bpk, overlimits=q[4])
