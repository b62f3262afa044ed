"""Kernel-TCP transport for collective agents (the traffic.transport.Transport interface).

* One persistent TCP connection per unordered peer pair, full duplex: rank a connects to every peer b > a and
  accepts from every peer b < a; the connecting side sends an 8-byte hello (magic, rank) first (traffic.tcp_connect).
* Per socket, before connect (and on the listener, so accepted sockets inherit it, then set again after accept):
  TCP_CONGESTION (never the namespace default sysctl: a non-initial namespace may only default to algorithms the
  initial namespace allows), TCP_NODELAY, optional IP_TOS (DSCP << 2), optional SO_SNDBUF/SO_RCVBUF.
* Framing: every message is a 16-byte header (tag u64, length u64, little-endian) and its payload. Sends to one
  peer leave in posting order. A message whose receive is posted lands directly in the destination memory. When
  a header arrives and no receive from that peer is posted at all, the payload is left in the socket (the
  connection stops being read: TCP flow control pushes back on the sender, as a rendezvous would) until a
  receive from that peer is posted; if that receive is for a later message, the one in front is read into a
  private buffer and copied when its own receive is posted (schedules are deadlock-free either way).
* One thread, non-blocking sockets and a selector: a rank sends and receives at the same time on all
  connections, so ring schedules never deadlock on full socket buffers.
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from collections import deque
from typing import Any

import numpy as np

from traffic import tcp_connect
from traffic.tcpinfo import INFO_KEYS, set_cc, tcp_info
from traffic.transport import Request, Transport, TransportError

HDR = struct.Struct("<QQ")
MAX_MESSAGE = 1 << 34
_RECV_ROUND_BYTES = 8 << 20  # per connection per progress round, so one busy peer cannot starve the others
_LOWAT_MAX = 128 << 10  # wake the reader only when this much of the current message (or all of it) is queued
_IO_CHUNK = 1 << 20  # bytes per send/recv syscall: huge single calls are measurably slower (page pinning, cache)



class _Conn:
    __slots__ = ("peer", "sock", "sendq", "hdr", "hdr_got", "cur", "mask", "eof", "paused", "posted", "lowat")

    def __init__(self, peer: int, sock: socket.socket):
        self.peer = peer
        self.sock = sock
        self.sendq: deque[list] = deque()  # [header bytes, payload memoryview, offset, request]
        self.hdr = bytearray(HDR.size)
        self.hdr_got = 0
        self.cur: list | None = None  # [tag, nbytes, target memoryview, got, request or None, held bytearray]
        self.mask = 0
        self.eof = False
        self.paused = False  # a message header is in, no receive from this peer is posted: leave its payload
        self.posted = 0  # receives from this peer posted and not yet matched
        self.lowat = 1  # SO_RCVLOWAT now set on the socket


class TcpTransport(Transport):
    name = "tcp"

    def __init__(self, rank: int, ip: str = "0.0.0.0", cc: str | None = None, dscp: int = 0,
                 sndbuf: int = 0, rcvbuf: int = 0, nodelay: bool = True):
        super().__init__(rank)
        if not 0 <= int(dscp) <= 63:
            raise ValueError(f"dscp must be 0..63 (got {dscp})")
        self.ip = ip
        self.cc = cc
        self.dscp = int(dscp)
        self.sndbuf = int(sndbuf)
        self.rcvbuf = int(rcvbuf)
        self.nodelay = nodelay
        self.cc_actual: dict[int, str] = {}
        self.conns: dict[int, _Conn] = {}
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.posted: dict[tuple[int, int], Request] = {}  # (peer, tag) -> posted, not yet matched receive
        self.held: dict[tuple[int, int], bytearray] = {}  # arrived before their receive was posted
        self.ready: list[Request] = []  # completed outside progress(), reported by the next call
        self.pending_recvs = 0
        self.blocked_recv_s = 0.0  # time blocked in select while at least one receive was outstanding
        self.bytes_out = 0
        self.bytes_in = 0

    # ---- setup ----

    def _options(self, s: socket.socket) -> str:
        actual = set_cc(s, self.cc)
        if self.nodelay:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.dscp:
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, self.dscp << 2)
        if self.sndbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
        if self.rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
        return actual

    def listen(self) -> dict:
        self.listener = tcp_connect.listener(self.ip, self._options)
        return {"ip": self.ip, "port": self.listener.getsockname()[1]}

    def connect(self, peers: dict[int, dict], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        for peer in sorted(p for p in peers if p > self.rank):
            s, self.cc_actual[peer] = tcp_connect.dial(self.rank, self.ip, peer, peers[peer], self._options, deadline)
            self._add(peer, s)
        want = {p for p in peers if p < self.rank}
        if want and self.listener is None:
            raise TransportError("connect() before listen()")
        while want:
            peer, s = tcp_connect.accept(self.rank, self.listener, want, deadline, timeout_s)
            want.discard(peer)
            self.cc_actual[peer] = self._options(s)
            self._add(peer, s)
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def _add(self, peer: int, s: socket.socket) -> None:
        s.setblocking(False)
        c = _Conn(peer, s)
        self.conns[peer] = c
        c.mask = selectors.EVENT_READ
        self.sel.register(s, c.mask, c)

    # ---- posting ----

    def post_send(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        c = self.conns.get(peer)
        if c is None:
            raise TransportError(f"rank {self.rank}: no connection to rank {peer}")
        mv = memoryview(buf).cast("B")
        req = Request("send", peer, tag, len(mv), mv, context=context)
        was_empty = not c.sendq
        c.sendq.append([HDR.pack(tag, len(mv)), mv, 0, req])
        if was_empty:
            self._send(c)
            self._update_mask(c)
        return req

    def post_recv(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        if peer not in self.conns:
            raise TransportError(f"rank {self.rank}: no connection to rank {peer}")
        mv = memoryview(buf).cast("B")
        req = Request("recv", peer, tag, len(mv), mv, context=context)
        key = (peer, tag)
        if key in self.posted:
            raise TransportError(f"rank {self.rank}: receive from {peer} tag {tag} posted twice")
        held = self.held.pop(key, None)
        if held is not None:
            self._deliver_held(req, held)
            self.ready.append(req)
            return req
        self.posted[key] = req
        self.pending_recvs += 1
        c = self.conns[peer]
        c.posted += 1
        if c.paused:  # the message at the head of the stream: straight into this buffer, or held if another tag
            cur = c.cur
            if cur[0] == tag:
                if cur[1] != req.nbytes:
                    raise TransportError(f"rank {self.rank}: message from {peer} tag {tag} has {cur[1]} bytes, "
                                         f"the receive expects {req.nbytes}")
                cur[2], cur[4] = req.buf, req
            else:
                held = np.empty(cur[1], dtype=np.uint8)
                cur[2], cur[5] = memoryview(held), held
            c.paused = False
            self._lowat(c)
            self._update_mask(c)
        return req

    def _deliver_held(self, req: Request, held: bytearray) -> None:
        if len(held) != req.nbytes:
            raise TransportError(f"rank {self.rank}: message from {req.peer} tag {req.tag} has {len(held)} bytes, "
                                 f"the receive expects {req.nbytes}")
        req.buf[:] = held
        req.done = True
        req.t_done = time.monotonic()

    # ---- progress ----

    def _update_mask(self, c: _Conn) -> None:
        want = (0 if c.paused else selectors.EVENT_READ) | (selectors.EVENT_WRITE if c.sendq else 0)
        if want == c.mask:
            return
        # paused with nothing to send: the socket leaves the selector. Registered for reading, its waiting payload
        # made every select return at once (level-triggered) while _recv did nothing: each agent spun a CPU
        # whenever a peer ran a step ahead (lab 04's all-to-all kept 2 CPUs 85-100% busy at 10 Mbit/s)
        if want == 0:
            self.sel.unregister(c.sock)
        elif c.mask == 0:
            self.sel.register(c.sock, want, c)
        else:
            self.sel.modify(c.sock, want, c)
        c.mask = want

    def _send(self, c: _Conn) -> None:
        while c.sendq:
            item = c.sendq[0]
            hdr, mv, off, req = item
            hl = len(hdr)
            parts = [hdr[off:], mv[:_IO_CHUNK]] if off < hl else [mv[off - hl:off - hl + _IO_CHUNK]]
            try:
                n = c.sock.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                raise TransportError(f"rank {self.rank}: send to rank {c.peer}: {e}") from None
            item[2] = off + n
            self.bytes_out += n
            if item[2] < hl + len(mv):
                if n < sum(len(x) for x in parts):
                    return  # socket buffer full
                continue
            c.sendq.popleft()
            req.done = True
            req.t_done = time.monotonic()
            self.ready.append(req)

    def _recv(self, c: _Conn) -> None:
        if c.paused:
            return
        budget = _RECV_ROUND_BYTES
        s = c.sock
        while budget > 0:
            try:
                if c.cur is None:
                    n = s.recv_into(memoryview(c.hdr)[c.hdr_got:])
                    if n == 0:
                        self._eof(c)
                        return
                    c.hdr_got += n
                    if c.hdr_got < HDR.size:
                        continue
                    c.hdr_got = 0
                    tag, nbytes = HDR.unpack(c.hdr)
                    if nbytes > MAX_MESSAGE:
                        raise TransportError(f"rank {self.rank}: bad frame from rank {c.peer} ({nbytes} bytes)")
                    req = self.posted.get((c.peer, tag))
                    if req is not None:
                        if req.nbytes != nbytes:
                            raise TransportError(f"rank {self.rank}: message from {c.peer} tag {tag} has {nbytes} "
                                                 f"bytes, the receive expects {req.nbytes}")
                        c.cur = [tag, nbytes, req.buf, 0, req, None]
                    elif c.posted == 0 and nbytes > 0:
                        # nothing from this peer is awaited yet: leave the payload in the socket (back-pressure on
                        # the sender, like a rendezvous) until a receive from this peer is posted
                        c.cur = [tag, nbytes, None, 0, None, None]
                        c.paused = True
                        self._lowat(c)  # a small message waiting here must wake the socket once it is unpaused
                        return
                    else:  # another receive from this peer is waiting behind this message: hold it
                        held = np.empty(nbytes, dtype=np.uint8)
                        c.cur = [tag, nbytes, memoryview(held), 0, None, held]
                    if nbytes == 0:
                        self._finish(c)
                    continue
                cur = c.cur
                n = s.recv_into(cur[2][cur[3]:cur[3] + _IO_CHUNK])
                if n == 0:
                    self._eof(c)
                    return
                cur[3] += n
                budget -= n
                self.bytes_in += n
                if cur[3] == cur[1]:
                    self._finish(c)
            except (BlockingIOError, InterruptedError):
                self._lowat(c)
                return
            except ConnectionError as e:
                raise TransportError(f"rank {self.rank}: receive from rank {c.peer}: {e}") from None
        # out of budget with data still queued: the low-water mark must fit what comes next (it may still be the
        # tail of the message just finished; a smaller next message would then never wake this socket up)
        self._lowat(c)

    def _lowat(self, c: _Conn) -> None:
        """SO_RCVLOWAT = what the current message still needs (capped): one wake-up per ~128 KiB instead of one
        per packet (receive offloads are off in the fabric), never more than the sender will send."""
        cur = c.cur
        cap = min(_LOWAT_MAX, self.rcvbuf // 4) if self.rcvbuf else _LOWAT_MAX
        want = 1 if cur is None or cur[2] is None else max(1, min(cur[1] - cur[3], cap))
        if want != c.lowat:
            try:
                c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                c.lowat = want
            except OSError:
                pass

    def _finish(self, c: _Conn) -> None:
        tag, nbytes, _, _, req, held = c.cur
        c.cur = None
        key = (c.peer, tag)
        if req is None:
            req = self.posted.get(key)  # posted while the message was arriving
            if req is None:
                if key in self.held:
                    raise TransportError(f"rank {self.rank}: rank {c.peer} sent tag {tag} twice")
                self.held[key] = held
                return
            self._deliver_held(req, held)
        else:
            req.done = True
            req.t_done = time.monotonic()
        del self.posted[key]
        c.posted -= 1
        self.pending_recvs -= 1
        self.ready.append(req)

    def _eof(self, c: _Conn) -> None:
        c.eof = True
        self.sel.unregister(c.sock)
        if c.cur is not None or any(p == c.peer for p, _ in self.posted):
            raise TransportError(f"rank {self.rank}: rank {c.peer} closed its connection with data outstanding")

    def progress(self, timeout_s: float) -> list[Request]:
        if self.ready:
            timeout_s = 0.0
        t = time.monotonic()
        events = self.sel.select(timeout_s) if self.conns else []
        waited = time.monotonic() - t  # ~0 when something was ready: only real waiting adds up
        self.blocked_s += waited
        if self.pending_recvs:
            self.blocked_recv_s += waited
        for key, mask in events:
            c = key.data
            if mask & selectors.EVENT_READ:
                self._recv(c)
            if mask & selectors.EVENT_WRITE and not c.eof:
                self._send(c)
            if not c.eof:
                self._update_mask(c)
        out, self.ready = self.ready, []
        return out

    # ---- statistics and teardown ----

    def conn_info(self) -> dict[int, dict[str, float]]:
        out = {}
        for peer, c in self.conns.items():
            try:
                info = tcp_info(c.sock)
            except OSError:
                continue
            out[peer] = {k: info[k] for k in INFO_KEYS}
        return out

    def describe(self) -> dict:
        return {"transport": self.name, "cc": sorted(set(self.cc_actual.values())), "dscp": self.dscp,
                "connections": len(self.conns)}

    def close(self) -> None:
        for c in self.conns.values():
            try:
                if not c.eof:
                    self.sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            try:
                c.sock.close()
            except OSError:
                pass
        self.conns.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        self.sel.close()
