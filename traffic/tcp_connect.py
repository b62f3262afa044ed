"""The kernel-TCP transport's connection mesh (traffic.tcp): one persistent TCP connection per unordered peer pair,
full duplex, opened before timing starts. Rank a connects to every peer b > a and accepts from every peer b < a;
the connecting side sends an 8-byte hello (magic, rank) first, so the accepting side knows which rank it is. The
socket options (congestion control, TCP_NODELAY, DSCP, buffer sizes) are the transport's: ``options`` sets them
on a socket before connect (and on the listener, so accepted sockets inherit them) and returns the congestion
control the kernel took."""

from __future__ import annotations

import socket
import struct
import time
from typing import Callable

from traffic.transport import TransportError

HELLO = struct.Struct("<4sI")
MAGIC = b"TBAG"
LISTEN_BACKLOG = 256


def listener(ip: str, options: Callable[[socket.socket], str]) -> socket.socket:
    """A listening socket on ``ip`` (any free port) with the transport's options."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    options(ls)
    ls.bind((ip, 0))
    ls.listen(LISTEN_BACKLOG)
    return ls


def dial(rank: int, ip: str, peer: int, addr: dict, options: Callable[[socket.socket], str],
         deadline: float) -> tuple[socket.socket, str]:
    """A connection from ``ip`` to rank ``peer`` at ``addr`` (its listener's ip and port), hello sent, by
    time.monotonic() ``deadline``: the socket and the congestion control it got."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    actual = options(s)
    s.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        s.bind((ip, 0))
        s.connect((addr["ip"], int(addr["port"])))
        s.sendall(HELLO.pack(MAGIC, rank))
    except OSError as e:
        s.close()
        raise TransportError(f"rank {rank}: connect to rank {peer} at {addr['ip']}:{addr['port']}: {e}") from None
    return s, actual


def accept(rank: int, ls: socket.socket, want: set[int], deadline: float,
           timeout_s: float) -> tuple[int, socket.socket]:
    """The next connection on the listener ``ls`` from one of the ranks ``want``, by time.monotonic()
    ``deadline`` (``timeout_s``: the whole wait, for the message): that rank and its socket, its hello read."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TransportError(f"rank {rank}: ranks {sorted(want)} did not connect in {timeout_s:g} s")
    ls.settimeout(left)
    try:
        s, _ = ls.accept()
        s.settimeout(max(0.1, deadline - time.monotonic()))
        hello = b""
        while len(hello) < HELLO.size:
            part = s.recv(HELLO.size - len(hello))
            if not part:
                raise OSError("closed before hello")
            hello += part
    except OSError as e:
        raise TransportError(f"rank {rank}: accepting peers {sorted(want)}: {e}") from None
    magic, peer = HELLO.unpack(hello)
    if magic != MAGIC or peer not in want:
        s.close()
        raise TransportError(f"rank {rank}: unexpected hello {hello!r} (waiting for {sorted(want)})")
    return peer, s
