"""The runtime half of one clock across servers: NTP-style ping-pong over UDP between the reference server (the
prober) and another server (the echo), each stamping with its own CLOCK_MONOTONIC (``time.monotonic()``, the
clock every run file uses). analysis.clockoffset turns the exchanges into an offset and its bound.

The echo stamps ``t1`` as the first thing after the datagram is read and ``t2`` as the last thing before its reply
is sent; the prober stamps ``t0`` just before sending and ``t3`` just after reading. Any delay between a stamp and
the wire (a scheduler stall, the socket layer) therefore counts as path delay: it widens that exchange's bound and
the minimum-delay filter drops it; it cannot bias the estimate by more than its bound says.

This is the first slice's control channel for the clock (a UDP port on the server's address); docs/servers.md says
how it moves onto the ssh control channel. Run the echo on the far server with::

    python -m testbed.measure.clockprobe serve --bind ADDR [--port 9319] [--idle-s 60]
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

from analysis.clockoffset import Exchange

#: the echo's default UDP port
PORT = 9319
_REQUEST = struct.Struct("!Q")       # sequence number
_REPLY = struct.Struct("!Qdd")       # sequence number, t1, t2
#: a request with this sequence number ends the echo
STOP = 2 ** 64 - 1


def serve(sock: socket.socket, idle_s: float = 60.0) -> int:
    """Answer ping-pong requests on ``sock`` (bound UDP) until a STOP request or ``idle_s`` without one; returns
    the requests answered."""
    sock.settimeout(idle_s)
    answered = 0
    while True:
        try:
            data, peer = sock.recvfrom(64)
        except socket.timeout:
            return answered
        t1 = time.monotonic()
        if len(data) != _REQUEST.size:
            continue
        (seq,) = _REQUEST.unpack(data)
        if seq == STOP:
            return answered
        reply = _REPLY.pack(seq, t1, time.monotonic())
        sock.sendto(reply, peer)
        answered += 1


def probe(addr: str, port: int = PORT, count: int = 200, interval_s: float = 0.01, timeout_s: float = 0.5,
          sock: socket.socket | None = None) -> list[Exchange]:
    """``count`` ping-pongs with the echo at ``addr``:``port``, ``interval_s`` apart; a reply not back within
    ``timeout_s`` (lost, or a stale one arriving late) is left out. Returns the completed exchanges."""
    own = sock is None
    sock = sock or socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out: list[Exchange] = []
    try:
        for seq in range(count):
            t0 = time.monotonic()
            sock.sendto(_REQUEST.pack(seq), (addr, port))
            deadline = t0 + timeout_s
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    data = sock.recv(64)
                except socket.timeout:
                    break
                t3 = time.monotonic()
                if len(data) == _REPLY.size:
                    got, t1, t2 = _REPLY.unpack(data)
                    if got == seq:
                        out.append(Exchange(t0, t1, t2, t3))
                        break
            time.sleep(max(0.0, t0 + interval_s - time.monotonic()))
    finally:
        if own:
            sock.close()
    return out


def wait_ready(addr: str, port: int = PORT, within_s: float = 60.0) -> float:
    """Seconds until the echo at addr:port first answers (it may still be booting); TimeoutError after within_s."""
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        if probe(addr, port, count=1, timeout_s=0.5):
            return time.monotonic() - start
        time.sleep(0.2)
    raise TimeoutError(f"no clock echo at {addr}:{port} within {within_s:.0f} s")


def stop(addr: str, port: int = PORT) -> None:
    """Ask the echo at addr:port to end (one datagram; an echo already gone ends by its idle timeout anyway)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(_REQUEST.pack(STOP), (addr, port))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testbed.measure.clockprobe",
                                 description="The clock echo a server runs for the reference server's prober.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="answer ping-pong requests (stamps on this machine's CLOCK_MONOTONIC)")
    s.add_argument("--bind", required=True, help="this server's address")
    s.add_argument("--port", type=int, default=PORT)
    s.add_argument("--idle-s", type=float, default=60.0, help="end after this long without a request")
    args = ap.parse_args(argv)
    if not 0 < args.port < 65536 or args.idle_s <= 0:
        ap.error("--port must be 1..65535 and --idle-s > 0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((args.bind, args.port))
        print(f"clock echo on {args.bind}:{args.port}", flush=True)
        n = serve(sock, args.idle_s)
    print(f"clock echo answered {n} requests", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
