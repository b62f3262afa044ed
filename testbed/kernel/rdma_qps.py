"""The RDMA devices' queue pairs as the kernel's RDMA netlink resource tables list them (what ``rdma res show qp``
prints: local QPN, remote QPN, type, state, owning process), read in-process over a NETLINK_RDMA socket.

What it stands for: the QP context table a RoCE NIC's firmware keeps, from which its congestion control knows, for
each of its QPs, the QP at the other end. DCQCN beside rxe (testbed/kernel/dcqcn.py) needs that pairing: a CNP
names the sender's local QP, a data packet only the receiver's. The table has no peer address for a QP that was
connected without rdma_cm (perftest, the RDMA agent); :func:`pair_qps` finds each QP's peer by matching the tables
of all hosts (A's local QPN is B's remote QPN and the other way round).

Layouts: include/uapi/rdma/rdma_netlink.h. With the kernel's default shared RDMA namespace mode every rxe device is
listed from any network namespace; a resource dump needs the device's index (RDMA_NLDEV_ATTR_DEV_INDEX)."""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
CMD_GET, CMD_RES_QP_GET = 1, 10
ATTR_DEV_INDEX, ATTR_DEV_NAME = 1, 2
ATTR_RES_QP, ATTR_RES_QP_ENTRY = 19, 20
ATTR_RES_LQPN, ATTR_RES_RQPN, ATTR_RES_TYPE, ATTR_RES_STATE, ATTR_RES_PID = 21, 22, 26, 27, 28
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
#: ib_qp_type and ib_qp_state values (include/rdma/ib_verbs.h): reliable connection; ready to receive / send
QPT_RC = 2
QPS_RTR, QPS_RTS = 2, 3


@dataclass(frozen=True)
class Qp:
    device: str
    lqpn: int
    rqpn: int | None  # None until the QP is connected (RTR)
    qp_type: int
    state: int
    pid: int | None


def _attrs(buf: bytes, off: int = 0, end: int | None = None) -> list[tuple[int, bytes]]:
    end = len(buf) if end is None else end
    out = []
    while off + 4 <= end:
        length, kind = struct.unpack_from("=HH", buf, off)
        if length < 4:
            break
        out.append((kind & NLA_TYPE_MASK, buf[off + 4:off + length]))
        off += (length + 3) & ~3
    return out


def _u32(v: bytes) -> int:
    return struct.unpack_from("=I", v)[0]


def _dump(cmd: int, attrs: bytes = b"") -> list[list[tuple[int, bytes]]]:
    """One NLDEV dump request; the attributes of every reply message."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
    try:
        sock.bind((0, 0))
        msg_type = (RDMA_NL_NLDEV << 10) + cmd
        sock.send(struct.pack("=IHHII", 16 + len(attrs), msg_type, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + attrs)
        out: list[list[tuple[int, bytes]]] = []
        while True:
            data = sock.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length, kind, _, _, _ = struct.unpack_from("=IHHII", data, off)
                if length < 16:  # a malformed header would never advance
                    raise OSError(f"RDMA netlink: message of {length} bytes at offset {off}")
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    err = -struct.unpack_from("=i", data, off + 16)[0]
                    if err:
                        raise OSError(err, f"RDMA netlink: {os.strerror(err)}")
                    return out
                out.append(_attrs(data, off + 16, off + length))
                off += (length + 3) & ~3
    finally:
        sock.close()


def devices() -> dict[str, int]:
    """RDMA device name -> its index."""
    out = {}
    for msg in _dump(CMD_GET):
        a = dict(msg)
        if ATTR_DEV_INDEX in a and ATTR_DEV_NAME in a:
            out[a[ATTR_DEV_NAME].rstrip(b"\0").decode()] = _u32(a[ATTR_DEV_INDEX])
    return out


def device_index(device: str) -> int:
    """The kernel's index of RDMA device `device` (an OSError names a device the kernel does not list). A sampler
    that reads a device's QPs every few milliseconds resolves it once and passes it to :func:`qps`."""
    listed = devices()
    if device not in listed:
        raise OSError(f"no RDMA device {device!r} (listed: {', '.join(sorted(listed)) or 'none'})")
    return listed[device]


def qps(device: str, index: int | None = None) -> list[Qp]:
    """The QPs of RDMA device `device`, whose index is `index` (None: looked up first, one more netlink dump)."""
    index = device_index(device) if index is None else index
    req = struct.pack("=HHI", 8, ATTR_DEV_INDEX, index)
    out = []
    for msg in _dump(CMD_RES_QP_GET, req):
        for kind, table in msg:
            if kind != ATTR_RES_QP:
                continue
            for ekind, entry in _attrs(table):
                if ekind != ATTR_RES_QP_ENTRY:
                    continue
                e = dict(_attrs(entry))
                if ATTR_RES_LQPN not in e:
                    continue
                out.append(Qp(device, _u32(e[ATTR_RES_LQPN]),
                              _u32(e[ATTR_RES_RQPN]) if ATTR_RES_RQPN in e else None,
                              e[ATTR_RES_TYPE][0] if ATTR_RES_TYPE in e else -1,
                              e[ATTR_RES_STATE][0] if ATTR_RES_STATE in e else -1,
                              _u32(e[ATTR_RES_PID]) if ATTR_RES_PID in e else None))
    return out


def pair_qps(tables: dict[str, list[Qp]]) -> dict[str, list[tuple[int, int, str]]]:
    """host IPv4 -> [(local QPN, remote QPN, peer IPv4)] for every connected RC QP whose peer is found exactly once
    among the other hosts' tables (a QP of B with lqpn = A's rqpn and rqpn = A's lqpn). A QP matching two peers
    (equal QPN pairs on several hosts) is left out: a wrong map would cut the wrong QP."""
    live = {ip: [q for q in t if q.qp_type == QPT_RC and q.state in (QPS_RTR, QPS_RTS) and q.rqpn is not None]
            for ip, t in tables.items()}
    out: dict[str, list[tuple[int, int, str]]] = {ip: [] for ip in tables}
    for ip, mine in live.items():
        for q in mine:
            peers = [other for other, theirs in live.items() if other != ip
                     and any(p.lqpn == q.rqpn and p.rqpn == q.lqpn for p in theirs)]
            if len(peers) == 1:
                out[ip].append((q.lqpn, q.rqpn, peers[0]))
    return out


__all__ = ["Qp", "QPS_RTR", "QPS_RTS", "QPT_RC", "device_index", "devices", "pair_qps", "qps"]
