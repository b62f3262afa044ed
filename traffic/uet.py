"""Ultra Ethernet-style transport for collective agents (the traffic.transport.Transport interface), over UDP.

What it stands for: UEC 1.0's packet delivery sublayer (PDS) in RUD mode (reliable unordered delivery) under a
minimal semantic sublayer (tagged eager sends), with NSCC-style congestion control (traffic.uet_cc). The wire
format is traffic.uet_packet; SACK bookkeeping and loss detection are traffic.uet_sack.

* **Packets and PSNs.** A message is cut into packets of ``payload_bytes_for(mtu)`` bytes; each gets the next PSN
  of its (sender, receiver) pair (UEC's PDC, one per ordered peer pair here) and carries the message id, tag,
  total length and its offset, so the receiver places it wherever it lands (no reordering stall).
* **Entropy values.** A rank sends data from ``entropy_values`` UDP sockets, each bound to its own source port,
  taking them in turn packet by packet: the source port is the packet's EV, and the fabric's ECMP hash
  (fib_multipath_hash_policy=1, L4) sprays one message's packets over the spines.
* **ACKs.** The receiver answers every data packet with an ACK (CACK_PSN, SACK_PSN + 64-bit bitmap, ACK_PSN, the
  packet's send time echoed, ECN-CE echoed), and a trimmed packet (its payload cut off by a switch, FLAG_TRIMMED)
  with a NACK: the sender retransmits it next, ahead of new data, as soon as its window allows.
* **Loss recovery.** A packet is resent when NACKed, when a SACK proves it lost (``loss_rule``, traffic.uet_tx:
  "path", the default, per EV: a later packet on its EV delivered, or else RACK's time rule with its EV's own RTT;
  "rack": RACK's rule alone over the peer pair) or on the timer (RTO: srtt + 4 rttvar, at least ``rto_min_ms``,
  doubled on each expiry until an ACK comes; every expiry counted). rto_min is 50 ms: with 20 ms, windows ramping
  in the collectives fired spurious timers (12-22 per rank in a 4-iteration allreduce; 1-6 with 50 ms).
* **Window.** At most ``cwnd`` bytes (header included) in flight per peer (sent, neither acknowledged nor known
  lost); retransmissions take window too, ahead of new data. cwnd follows traffic.uet_cc.Nscc (ECN-CE echo, delay
  above target, NACK, RTO). No pacing: the window is released as ACKs and NACKs return.
* **Completion.** A send is done when every packet of it is acknowledged (the buffer may then be reused); a receive
  when all its bytes have been placed. A message whose receive is not posted yet is held (eager, as TCP's).
* **Linger.** :meth:`drain` waits for the rank's own sends and then keeps answering for ``linger_s`` after the last
  data packet (TCP's TIME_WAIT: a peer whose last ACK was lost retransmits, and someone must answer it).

Simplified against the specification: one header format for every packet type (uet_packet), one ACK per data
packet (no ACK coalescing), no PDC establishment handshake (the PSN spaces start at 0 when the agents connect), no
receiver-credit (RCCC) or EQDS, per-EV state only for loss detection (EVs are used in turn, none is retired or
avoided on congestion), no message-level rendezvous. One thread, non-blocking sockets and a selector.

This module: sockets, posting, the receiving side and progress; the sending side (window, retransmission, timer,
ACK/NACK processing) is traffic.uet_tx.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time
from collections import Counter
from typing import Any

import numpy as np

from traffic import uet_packet as up
from traffic.transport import Request, Transport, TransportError
from traffic.uet_cc import Nscc, NsccParams
from traffic.uet_options import ENTROPY_VALUES, LOSS_RULE, LOSS_RULES
from traffic.uet_tx import PdsSender, PeerState, TxMessage

ECT0, CE = 0x02, 0x03
SO_NO_CHECK = getattr(socket, "SO_NO_CHECK", 11)  # Linux asm-generic/socket.h
_SOCK_BUF_BYTES = 4 << 20
_RECV_BATCH = 4096  # datagrams read per round: all that is queued, before any timer is judged


class _RxMsg:
    __slots__ = ("tag", "nbytes", "got", "req", "held", "target")

    def __init__(self, tag: int, nbytes: int, req: Request | None):
        self.tag, self.nbytes, self.got, self.req = tag, nbytes, 0, req
        self.held = None if req is not None else np.empty(nbytes, dtype=np.uint8)
        self.target = req.buf if req is not None else memoryview(self.held)


class UetTransport(PdsSender, Transport):
    name = "uet"

    def __init__(self, rank: int, ip: str = "0.0.0.0", cc: str | None = None, dscp: int = 0, sndbuf: int = 0,
                 rcvbuf: int = 0, mtu: int = 1500, entropy_values: int = ENTROPY_VALUES, port: int = up.UET_UDP_PORT,
                 rto_min_ms: float = 50.0, rto_init_ms: float = 100.0, reorder_min_ms: float = 1.0,
                 loss_rule: str = LOSS_RULE,
                 target_delay_us: float = 10_000.0, init_cwnd_packets: int = 16, max_cwnd_packets: int = 256,
                 linger_s: float = 0.3):
        super().__init__(rank)
        if not 0 <= int(dscp) <= 63:
            raise ValueError(f"dscp must be 0..63 (got {dscp})")
        if not 1 <= int(entropy_values) <= 256:
            raise ValueError(f"entropy_values must be 1..256 (got {entropy_values})")
        if loss_rule not in LOSS_RULES:
            raise ValueError(f"loss_rule must be one of {', '.join(LOSS_RULES)} (got {loss_rule!r})")
        if cc not in (None, "nscc"):
            cc = None  # a TCP algorithm named by the scenario's default: this transport's window is NSCC's
        self.ip = ip
        self.dscp = int(dscp)
        self.mtu = int(mtu)
        self.payload_bytes = up.payload_bytes_for(self.mtu)
        self.n_ev = int(entropy_values)
        self.port = int(port)
        self.rto_min_s = rto_min_ms / 1e3
        self.rto_init_s = rto_init_ms / 1e3
        self.reorder_min_s = reorder_min_ms / 1e3
        self.loss_rule = loss_rule
        self.linger_s = float(linger_s)
        self.sock_bytes = max(int(sndbuf), int(rcvbuf), _SOCK_BUF_BYTES)
        self.cc_params = NsccParams(mtu_bytes=self.mtu, init_cwnd_bytes=init_cwnd_packets * self.mtu,
                                    min_cwnd_bytes=self.mtu // 16, max_cwnd_bytes=max_cwnd_packets * self.mtu,
                                    target_delay_s=target_delay_us / 1e6)
        self.sel = selectors.DefaultSelector()
        self.sock: socket.socket | None = None
        self.evs: list[socket.socket] = []
        self.ev_next = 0
        self.peers: dict[int, PeerState] = {}
        self.posted: dict[tuple[int, int], Request] = {}
        self.held: dict[tuple[int, int], np.ndarray] = {}
        self.ready: list[Request] = []
        self.pending_recvs = 0
        self.blocked_recv_s = 0.0
        self.bytes_out = 0
        self.bytes_in = 0
        self.t_last_data = 0.0
        self.stats: Counter[str] = Counter()

    # ---- setup ----

    def _bufsize(self, s: socket.socket) -> None:
        for force, plain in ((getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF),
                             (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF)):
            try:
                s.setsockopt(socket.SOL_SOCKET, force, self.sock_bytes)
            except OSError:
                s.setsockopt(socket.SOL_SOCKET, plain, self.sock_bytes)

    def _bind(self, s: socket.socket) -> None:
        """The UET port, or (several ranks on one host) the next free one of PORT_SPAN ports above it, which the
        trimming program recognises too."""
        for k in range(up.PORT_SPAN if self.port else 1):
            try:
                s.bind((self.ip, self.port + k))
                return
            except OSError as e:
                if e.errno != errno.EADDRINUSE or k == up.PORT_SPAN - 1:
                    raise

    def listen(self) -> dict:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._bind(s)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
            self._bufsize(s)
            s.setblocking(False)
            for _ in range(self.n_ev):  # one socket per entropy value: its source port is the EV
                e = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self.evs.append(e)
                e.bind((self.ip, 0))
                e.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, self.dscp << 2 | ECT0)
                # no UDP checksum (allowed over IPv4): a trimming port cuts the datagram and cannot fix a checksum
                # the kernel has left for a later device to fill in (CHECKSUM_PARTIAL over veth)
                e.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
                self._bufsize(e)
                e.setblocking(False)
        except OSError as e:
            s.close()
            for x in self.evs:
                x.close()
            self.evs.clear()
            raise TransportError(f"rank {self.rank}: UDP {self.ip}:{self.port}: {e}") from None
        self.sock = s
        self.sel.register(s, selectors.EVENT_READ)
        return {"ip": self.ip, "port": s.getsockname()[1]}

    def connect(self, peers: dict[int, dict], timeout_s: float = 30.0) -> None:
        """No handshake: a PDC's PSN space starts at 0 on both ends (every agent listens before any connects)."""
        if self.sock is None:
            raise TransportError("connect() before listen()")
        for peer, addr in peers.items():
            self.peers[peer] = PeerState(peer, (addr["ip"], int(addr["port"])), Nscc(self.cc_params), self.n_ev)

    def entropy_ports(self) -> list[int]:
        return [e.getsockname()[1] for e in self.evs]

    # ---- posting ----

    def _peer(self, peer: int) -> PeerState:
        p = self.peers.get(peer)
        if p is None:
            raise TransportError(f"rank {self.rank}: no connection to rank {peer}")
        return p

    def post_send(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        p = self._peer(peer)
        mv = memoryview(buf).cast("B")
        req = Request("send", peer, tag, len(mv), mv, context=context)
        p.sendq.append(TxMessage(req, p.next_msg_id))
        p.next_msg_id += 1
        self._pump(p)
        return req

    def post_recv(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        self._peer(peer)
        mv = memoryview(buf).cast("B")
        req = Request("recv", peer, tag, len(mv), mv, context=context)
        key = (peer, tag)
        if key in self.posted:
            raise TransportError(f"rank {self.rank}: receive from {peer} tag {tag} posted twice")
        held = self.held.pop(key, None)
        if held is not None:
            self._deliver_held(req, held)
            return req
        self.posted[key] = req
        self.pending_recvs += 1
        return req

    def _deliver_held(self, req: Request, held: np.ndarray) -> None:
        if len(held) != req.nbytes:
            raise TransportError(f"rank {self.rank}: message from {req.peer} tag {req.tag} has {len(held)} bytes, "
                                 f"the receive expects {req.nbytes}")
        req.buf[:] = held
        self._done(req)

    def _done(self, req: Request) -> None:
        req.done = True
        req.t_done = time.monotonic()
        self.ready.append(req)

    # ---- receiving ----

    def _reply(self, p: PeerState, typ: int, h: up.Header, ce: bool, rx_ns: int) -> None:
        base, bits = p.rx.sack()
        out = up.Header(typ, up.FLAG_ECN_ECHO if ce else 0, self.rank, p.rank, p.rx.cack_psn, ack_psn=h.psn,
                        msg_id=h.msg_id, offset=rx_ns, sack_psn=base, sack_bitmap=bits, ts_ns=h.ts_ns).pack()
        try:
            self.sock.sendto(out, p.addr)
        except (BlockingIOError, InterruptedError):
            p.stats["ack_send_blocked"] += 1  # the sender recovers by its timer or the next ACK's SACK
        p.stats["acks_sent" if typ == up.TYPE_ACK else "nacks_sent"] += 1

    def _on_data(self, p: PeerState, h: up.Header, data: bytes, ce: bool, rx_ns: int) -> None:
        self.t_last_data = time.monotonic()
        if ce:
            p.stats["ce_received"] += 1
        if h.flags & up.FLAG_TRIMMED:
            p.stats["trimmed_received"] += 1
            self._reply(p, up.TYPE_NACK, h, ce, rx_ns)
            return
        if len(data) - up.HEADER_BYTES != h.payload_bytes:
            raise TransportError(f"rank {self.rank}: packet from rank {p.rank} psn {h.psn} has "
                                 f"{len(data) - up.HEADER_BYTES} payload bytes, its header says {h.payload_bytes}")
        if p.rx.add(h.psn):
            self._place(p, h, data)
        else:
            p.stats["duplicates_received"] += 1
        self._reply(p, up.TYPE_ACK, h, ce, rx_ns)

    def _place(self, p: PeerState, h: up.Header, data: bytes) -> None:
        m = p.rx_msgs.get(h.msg_id)
        if m is None:
            req = self.posted.get((p.rank, h.tag))
            if req is not None and req.nbytes != h.msg_bytes:
                raise TransportError(f"rank {self.rank}: message from {p.rank} tag {h.tag} has {h.msg_bytes} "
                                     f"bytes, the receive expects {req.nbytes}")
            m = p.rx_msgs[h.msg_id] = _RxMsg(h.tag, h.msg_bytes, req)
        n = h.payload_bytes
        if h.offset + n > m.nbytes:
            raise TransportError(f"rank {self.rank}: packet from {p.rank} beyond its message ({h.offset}+{n})")
        m.target[h.offset:h.offset + n] = memoryview(data)[up.HEADER_BYTES:]
        m.got += n
        self.bytes_in += n
        if m.got == m.nbytes:
            del p.rx_msgs[h.msg_id]
            self._finish(p, m)

    def _finish(self, p: PeerState, m: _RxMsg) -> None:
        key = (p.rank, m.tag)
        req = m.req
        if req is None:
            req = self.posted.get(key)  # posted while the message was arriving
            if req is None:
                if key in self.held:
                    raise TransportError(f"rank {self.rank}: rank {p.rank} sent tag {m.tag} twice")
                self.held[key] = m.held
                return
            if len(m.held) != req.nbytes:
                raise TransportError(f"rank {self.rank}: message from {p.rank} tag {m.tag} has {len(m.held)} "
                                     f"bytes, the receive expects {req.nbytes}")
            req.buf[:] = m.held
        del self.posted[key]
        self.pending_recvs -= 1
        self._done(req)

    def _recv_all(self) -> None:
        anc = socket.CMSG_SPACE(4)
        for _ in range(_RECV_BATCH):
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(65536, anc)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                raise TransportError(f"rank {self.rank}: receive: {e}") from None
            tos = 0
            for level, kind, value in ancdata:
                if level == socket.IPPROTO_IP and kind == socket.IP_TOS and value:
                    tos = value[0]
            try:
                h = up.unpack(data)
            except up.BadPacket:
                self.stats["bad_packets"] += 1
                continue
            p = self.peers.get(h.src)
            if p is None or h.dst != self.rank:
                self.stats["stray_packets"] += 1
                continue
            now_ns = time.monotonic_ns()
            if h.type == up.TYPE_DATA:
                self._on_data(p, h, data, tos & 3 == CE, now_ns)
            elif h.type == up.TYPE_ACK:
                self._on_ack(p, h, now_ns)
            else:
                self._on_nack(p, h, now_ns)

    # ---- progress ----

    def progress(self, timeout_s: float) -> list[Request]:
        self._recv_all()
        for p in self.peers.values():
            self._pump(p)
        wait = min(self._check_rto(time.monotonic_ns()), self._check_reorder(time.monotonic_ns()))
        if self.ready:
            timeout_s = 0.0
        t = time.monotonic()
        events = self.sel.select(min(timeout_s, wait, self._pace_wait_s())) if self.sock is not None else []
        waited = time.monotonic() - t
        self.blocked_s += waited
        if self.pending_recvs:
            self.blocked_recv_s += waited
        if events:
            self._recv_all()
        self._check_rto(time.monotonic_ns())
        self._check_reorder(time.monotonic_ns())
        for p in self.peers.values():
            self._pump(p)
        out, self.ready = self.ready, []
        return out

    def sends_outstanding(self) -> int:
        return sum(len(p.outstanding) + len(p.sendq) for p in self.peers.values())

    def drain(self, timeout_s: float) -> None:
        """Until every send is acknowledged, then ``linger_s`` after the last data packet arrived (answering
        retransmissions whose ACK was lost); at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = time.monotonic()
            if not self.sends_outstanding() and now - self.t_last_data >= self.linger_s:
                return
            self.ready.extend(self.progress(0.02))
        if self.sends_outstanding():
            raise TransportError(f"rank {self.rank}: {self.sends_outstanding()} packets unacknowledged after "
                                 f"{timeout_s:g} s")

    # ---- statistics and teardown ----

    def conn_info(self) -> dict[int, dict[str, float]]:
        out = {}
        for r, p in self.peers.items():
            d = {k: float(v) for k, v in p.stats.items()}
            d.update(cwnd_bytes=round(p.cc.cwnd_bytes), srtt_us=round(p.srtt_s * 1e6), rto_ms=self._rto_s(p) * 1e3,
                     inflight_bytes=p.inflight_bytes)
            # under TCP_INFO's names too, so the run's retransmission/RTT/RTO summary covers this transport
            d.update(total_retrans=d.get("retransmitted_packets", 0.0), rtt_us=d["srtt_us"],
                     rto_us=round(d["rto_ms"] * 1e3))
            out[r] = d
        return out

    def totals(self) -> dict[str, int]:
        """Every counter summed over the peers, plus the transport's own (bad/stray packets, blocked sends)."""
        c: Counter[str] = Counter(self.stats)
        for p in self.peers.values():
            c.update(p.stats)
            c.update({f"cc_{k}": v for k, v in p.cc.events.items()})
        return dict(c)

    def describe(self) -> dict:
        return {"transport": self.name, "cc": ["nscc"], "dscp": self.dscp, "mtu": self.mtu,
                "entropy_values": self.n_ev, "loss_rule": self.loss_rule, "connections": len(self.peers),
                "pid": os.getpid(), "counters": self.totals()}

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sel.unregister(self.sock)
            except (KeyError, ValueError):
                pass
            self.sock.close()
            self.sock = None
        for e in self.evs:
            e.close()
        self.evs.clear()
        self.sel.close()


__all__ = ["UetTransport"]
