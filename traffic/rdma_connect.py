"""The RDMA transport's connection bootstrap (traffic.rdma): what each end of an RC queue pair must know of the other
before it can move to RTR/RTS, exchanged over the TCP connection traffic.tcp opened between the two agents.

Each side sends one :data:`INFO` record per peer (its QP number, first PSN, RoCEv2 GID, path MTU, the address,
rkey and shape of the receive ring it registered for that peer: traffic.rdma_credits, and its data protocol),
reads the peer's, and, once its queue pairs are in RTS, one ready byte; nothing flows on a queue pair before both
ends are ready. The records are sent to every peer first (tiny: never blocks), then read, so the order of peers
does not matter.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import NamedTuple

from traffic.transport import TransportError

#: qpn, psn, gid, mtu enum, magic, ring address, ring rkey, ring slots, slot bytes (0 slots: no ring), data protocol
#: (traffic.rdma_options.PROTOCOLS)
INFO = struct.Struct("<II16sIIQIIII")
INFO_MAGIC = 0x7462524E
READY = b"R"


class QpInfo(NamedTuple):
    qpn: int
    psn: int
    gid: bytes  # 16 bytes
    mtu_enum: int
    ring_addr: int = 0
    ring_rkey: int = 0
    slots: int = 0
    slot_bytes: int = 0
    protocol: int = 0

    def pack(self) -> bytes:
        return INFO.pack(self.qpn, self.psn, self.gid, self.mtu_enum, INFO_MAGIC, self.ring_addr, self.ring_rkey,
                         self.slots, self.slot_bytes, self.protocol)

    @classmethod
    def unpack(cls, raw: bytes, rank: int, peer: int) -> QpInfo:
        qpn, psn, gid, mtu_enum, magic, addr, rkey, slots, slot_bytes, protocol = INFO.unpack(raw)
        if magic != INFO_MAGIC:
            raise TransportError(f"rank {rank}: bad QP info from rank {peer} (another version of the transport?)")
        return cls(qpn, psn, gid, mtu_enum, addr, rkey, slots, slot_bytes, protocol)


def read_exact(sock: socket.socket, n: int, deadline: float, rank: int, peer: int, what: str) -> bytes:
    """``n`` bytes from ``sock`` before ``deadline`` (time.monotonic()), else TransportError naming ``what``."""
    out = b""
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TransportError(f"rank {rank}: rank {peer} did not send its {what} in time")
        sock.settimeout(left)
        try:
            part = sock.recv(n - len(out))
        except TimeoutError:
            raise TransportError(f"rank {rank}: rank {peer} did not send its {what} in time") from None
        except OSError as exc:
            raise TransportError(f"rank {rank}: {what} from rank {peer}: {exc}") from None
        if not part:
            raise TransportError(f"rank {rank}: rank {peer} closed during QP setup")
        out += part
    return out


def exchange(rank: int, socks: dict[int, socket.socket], mine: dict[int, QpInfo],
             deadline: float) -> dict[int, QpInfo]:
    """Send ``mine[peer]`` to every peer, then read theirs. Both ends must use the same data protocol (eager with
    credits, rendezvous or grant) and, eager, both have a ring: else TransportError naming both."""
    for peer, s in socks.items():
        s.setblocking(True)
        s.sendall(mine[peer].pack())
    theirs = {}
    for peer, s in socks.items():
        info = QpInfo.unpack(read_exact(s, INFO.size, deadline, rank, peer, "QP info"), rank, peer)
        if info.protocol != mine[peer].protocol or (info.slots > 0) != (mine[peer].slots > 0):
            raise TransportError(f"rank {rank}: rank {peer} uses data protocol {info.protocol} with {info.slots} "
                                 f"credits, this rank {mine[peer].protocol} with {mine[peer].slots}: both ends must "
                                 "use the same protocol (eager: credits > 0)")
        theirs[peer] = info
    return theirs


def ready(rank: int, socks: dict[int, socket.socket], deadline: float) -> None:
    """Tell every peer our queue pairs are in RTS and wait until each says the same; the sockets are then left
    non-blocking (the transport keeps them as a liveness channel)."""
    for s in socks.values():
        s.sendall(READY)
    for peer, s in socks.items():
        if read_exact(s, 1, deadline, rank, peer, "ready byte") != READY:
            raise TransportError(f"rank {rank}: bad ready byte from rank {peer}")
        s.setblocking(False)
