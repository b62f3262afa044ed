"""The sender's half of the agents' UET transport (traffic.uet): the state of one peer pair (UEC's PDC: its PSN
space, the packets in flight, the window) and what the packet delivery sublayer does with it on the sending side:
transmission over the entropy values, the window (traffic.uet_cc.Nscc) with pacing below one packet, retransmission
on NACK, on SACK-revealed loss (per entropy value, traffic.uet_sack.lost_on_paths, or RACK's rule over the peer
pair, traffic.uet_sack.lost) and on the timer, and the processing of ACKs and NACKs.

:class:`PdsSender` is a mixin of traffic.uet.UetTransport (it uses the transport's sockets, clock settings and
counters); the module docstring of traffic.uet says what each mechanism stands for and what is simplified."""

from __future__ import annotations

import time
from collections import Counter, deque

from traffic import uet_packet as up
from traffic import uet_sack
from traffic.transport import Request, TransportError
from traffic.uet_cc import Nscc

class TxMessage:
    __slots__ = ("req", "buf", "msg_id", "next_off", "unacked", "sent_all")

    def __init__(self, req: Request, msg_id: int):
        self.req = req
        self.buf = req.buf
        self.msg_id = msg_id
        self.next_off = 0
        self.unacked = 0
        self.sent_all = False


class TxPacket:
    __slots__ = ("psn", "msg", "offset", "nbytes", "t_sent_ns", "ev", "tx_log", "sends", "in_flight")

    def __init__(self, psn: int, msg: TxMessage, offset: int, nbytes: int):
        self.psn, self.msg, self.offset, self.nbytes = psn, msg, offset, nbytes
        self.t_sent_ns = 0
        self.ev = -1  # the entropy value (index of the EV socket) of its last transmission
        self.tx_log: list[tuple[int, int]] = []  # (send time ns, EV) of every transmission: an ACK echoes one
        self.sends = 0
        self.in_flight = False  # counted in the window: sent and neither acknowledged nor known lost

    @property
    def wire_bytes(self) -> int:
        return self.nbytes + up.HEADER_BYTES


class PeerState:
    """Both directions of one peer pair: what this rank sends it (PSNs, window, timers) and receives from it."""

    def __init__(self, rank: int, addr: tuple[str, int], cc: Nscc, n_ev: int = 1):
        self.rank = rank
        self.addr = addr
        self.next_psn = 0
        self.next_msg_id = 0
        self.sendq: deque[TxMessage] = deque()
        self.outstanding: dict[int, TxPacket] = {}
        self.retxq: deque[int] = deque()
        self.queued: set[int] = set()
        self.inflight_bytes = 0
        self.cc = cc
        self.srtt_s = 0.0
        self.rttvar_s = 0.0
        self.paths = uet_sack.PathRtt(n_ev)  # per-EV RTT: the loss rule's allowance follows each path's delay
        self.rack_xmit_ns = 0  # send time of the latest-sent transmission delivered so far (RACK.xmit_ts)
        self.reorder_at_ns: int | None = None  # the reordering timer: re-check the time rule then
        self.backoff = 1
        self.next_tx_s = 0.0  # paced (window below one packet): no transmission before this instant
        self.rx = uet_sack.ReceiveWindow()
        self.rx_msgs: dict = {}  # msg_id -> traffic.uet._RxMsg: messages from this peer being placed
        self.stats: Counter[str] = Counter()


class PdsSender:
    """Sending-side methods of UetTransport."""

    def _transmit(self, p: PeerState, pkt: TxPacket) -> bool:
        retx = pkt.sends > 0
        m = pkt.msg
        now_ns = time.monotonic_ns()
        hdr = up.Header(up.TYPE_DATA, up.FLAG_RETX if retx else 0, self.rank, p.rank, pkt.psn, msg_id=m.msg_id,
                        payload_bytes=pkt.nbytes, tag=m.req.tag, msg_bytes=m.req.nbytes, offset=pkt.offset,
                        ts_ns=now_ns).pack()
        ev = self.evs[self.ev_next]
        try:
            ev.sendmsg([hdr, m.buf[pkt.offset:pkt.offset + pkt.nbytes]], [], 0, p.addr)
        except (BlockingIOError, InterruptedError):
            self.stats["send_blocked"] += 1
            return False
        except OSError as e:
            raise TransportError(f"rank {self.rank}: send to rank {p.rank}: {e}") from None
        pkt.t_sent_ns, pkt.ev = now_ns, self.ev_next
        pkt.tx_log.append((now_ns, self.ev_next))
        self.ev_next = (self.ev_next + 1) % self.n_ev
        pkt.sends += 1
        if not pkt.in_flight:
            pkt.in_flight = True
            p.inflight_bytes += pkt.wire_bytes
        p.stats["retransmitted_packets" if retx else "data_packets"] += 1
        if retx:
            p.stats["retransmitted_bytes"] += pkt.nbytes
        self.bytes_out += pkt.nbytes
        return True

    def _pump(self, p: PeerState) -> None:
        """Send what the window allows: retransmissions first, then new packets of the queued messages in order.
        Retransmissions take window like new packets (a packet known lost has left it): resent the instant its NACK
        came, whatever the window, a trimmed packet is trimmed again while the queue stays above the threshold, and
        the NACK/retransmit loop runs at CPU speed (measured: 170 000 trims in 8 s, the data starved)."""
        cwnd = p.cc.cwnd_bytes
        while p.retxq:
            psn = p.retxq[0]
            pkt = p.outstanding.get(psn)
            if pkt is None:  # delivered meanwhile
                p.retxq.popleft()
                p.queued.discard(psn)
                continue
            if not self._window_allows(p, pkt.wire_bytes, cwnd) or not self._transmit(p, pkt):
                return
            p.retxq.popleft()
            p.queued.discard(psn)
        while p.sendq:
            m = p.sendq[0]
            n = min(self.payload_bytes, m.req.nbytes - m.next_off)
            pkt = TxPacket(p.next_psn, m, m.next_off, n)
            if not self._window_allows(p, pkt.wire_bytes, cwnd) or not self._transmit(p, pkt):
                return
            p.next_psn += 1
            p.outstanding[pkt.psn] = pkt
            m.unacked += 1
            m.next_off += n
            if m.next_off >= m.req.nbytes:
                m.sent_all = True
                p.sendq.popleft()

    def _window_allows(self, p: PeerState, wire_bytes: int, cwnd: float) -> bool:
        """Room in the window for a packet of `wire_bytes`. A window below one packet (NSCC's window may shrink below
        an MTU: N senders sharing a port whose bandwidth-delay product is under N packets) sends one packet at a time,
        paced to one every srtt * packet / cwnd; otherwise at least one packet may always be in flight."""
        if cwnd < wire_bytes:
            now = time.monotonic()
            if p.inflight_bytes or now < p.next_tx_s:
                return False
            p.next_tx_s = now + max(p.srtt_s, self.rto_min_s / 20) * wire_bytes / cwnd
            return True
        return not p.inflight_bytes or p.inflight_bytes + wire_bytes <= cwnd

    def _pace_wait_s(self) -> float:
        now = time.monotonic()
        waits = [p.next_tx_s - now for p in self.peers.values() if (p.retxq or p.sendq) and p.next_tx_s > now]
        return min(waits, default=float("inf"))

    def _retransmit(self, p: PeerState, psns, counter: str, front: bool = False) -> None:
        """Queue `psns` for retransmission: they are known lost, so they leave the window until resent."""
        for psn in psns:
            if psn in p.queued:
                continue
            pkt = p.outstanding[psn]
            if pkt.in_flight:
                pkt.in_flight = False
                p.inflight_bytes -= pkt.wire_bytes
            p.queued.add(psn)
            (p.retxq.appendleft if front else p.retxq.append)(psn)
            p.stats[counter] += 1

    def _rto_s(self, p: PeerState) -> float:
        base = self.rto_init_s if p.srtt_s == 0 else max(self.rto_min_s, p.srtt_s + 4 * p.rttvar_s)
        return base * p.backoff

    def _check_rto(self, now_ns: int) -> float:
        """Retransmit what the timer says is lost; return the seconds until the next expiry (inf if none)."""
        nxt = float("inf")
        for p in self.peers.values():
            if not p.outstanding:
                continue
            rto_ns = int(self._rto_s(p) * 1e9)
            expired = [psn for psn, k in p.outstanding.items()
                       if now_ns - k.t_sent_ns >= rto_ns and k.sends and psn not in p.queued]
            if expired:
                p.stats["rto_events"] += 1
                self._retransmit(p, expired, "rto_retransmits")
                p.cc.on_timeout(now_ns / 1e9)
                p.backoff = min(p.backoff * 2, 64)
                self._pump(p)
                rto_ns = int(self._rto_s(p) * 1e9)
            # a packet queued for retransmission is not timed (its send time is old: timed, the next expiry would be
            # now, and the caller's select would spin until the window lets it go)
            oldest = min((k.t_sent_ns for psn, k in p.outstanding.items() if k.sends and psn not in p.queued),
                         default=None)
            if oldest is not None:
                nxt = min(nxt, max(0.0, (oldest + rto_ns - now_ns) / 1e9))
        return nxt

    def _on_ack(self, p: PeerState, h: up.Header, now_ns: int) -> None:
        p.stats["acks_received"] += 1
        ce = bool(h.flags & up.FLAG_ECN_ECHO)
        if ce:
            p.stats["ecn_echoes"] += 1
        ev = self._acked_ev(p, h)
        done = uet_sack.acked(p.outstanding, h.psn, h.sack_psn, h.sack_bitmap, h.ack_psn)
        acked_bytes = 0
        for psn in done:
            pkt = p.outstanding.pop(psn)
            if pkt.in_flight:
                p.inflight_bytes -= pkt.wire_bytes
            acked_bytes += pkt.wire_bytes
            m = pkt.msg
            m.unacked -= 1
            if m.sent_all and m.unacked == 0:
                self._done(m.req)
        rtt_s = (now_ns - h.ts_ns) / 1e9 if 0 < h.ts_ns <= now_ns else None
        if rtt_s is not None:
            if p.srtt_s == 0:
                p.srtt_s, p.rttvar_s = rtt_s, rtt_s / 2
            else:
                p.rttvar_s = 0.75 * p.rttvar_s + 0.25 * abs(p.srtt_s - rtt_s)
                p.srtt_s = 0.875 * p.srtt_s + 0.125 * rtt_s
        if done:
            p.backoff = 1
        if ev is not None and rtt_s is not None:
            p.paths.sample(ev, now_ns - h.ts_ns)
        owd_s = (h.offset - h.ts_ns) / 1e9 if 0 < h.ts_ns <= h.offset else None
        p.cc.on_ack(now_ns / 1e9, acked_bytes, rtt_s, ce, owd_s)
        self._detect_losses(p, h, ev, now_ns)

    @staticmethod
    def _acked_ev(p: PeerState, h: up.Header) -> int | None:
        """The EV of the transmission this ACK answers (its echoed send time names it); None when the packet is no
        longer outstanding."""
        pkt = p.outstanding.get(h.ack_psn)
        if pkt is None:
            return None
        return next((ev for t, ev in pkt.tx_log if t == h.ts_ns), None)

    def _detect_losses(self, p: PeerState, h: up.Header, ev: int | None, now_ns: int) -> None:
        """Queue for retransmission what this ACK proves lost: loss_rule "path" (traffic.uet_sack.lost_on_paths:
        path order on the ACK's EV, else the time rule with each EV's own allowance) or "rack" (the time rule alone,
        its window max(reorder minimum, srtt / 4) of the whole peer pair)."""
        reorder_ns = int(max(self.reorder_min_s, p.srtt_s / 4) * 1e9)
        if self.loss_rule == "rack":
            lost = uet_sack.lost({psn: k.t_sent_ns for psn, k in p.outstanding.items()}, h.ts_ns, reorder_ns)
            if lost:
                self._retransmit(p, lost, "fast_retransmits")
            return
        p.rack_xmit_ns = max(p.rack_xmit_ns, h.ts_ns)
        self._path_losses(p, h.ts_ns, ev, now_ns)

    def _path_losses(self, p: PeerState, delivered_ns: int, ev: int | None, now_ns: int) -> None:
        """traffic.uet_sack.lost_on_paths for a delivery of a packet sent at `delivered_ns` on `ev` (None: the
        reordering timer's re-check against the latest delivery); resend what it finds and re-arm the timer."""
        reorder_ns = int(max(self.reorder_min_s, p.srtt_s / 4) * 1e9)
        reorder_min_ns = int(self.reorder_min_s * 1e9)
        peer_ns = int((p.srtt_s + max(4 * p.rttvar_s, p.srtt_s / 4, self.reorder_min_s)) * 1e9)

        def overdue(e: int) -> int:
            return p.paths.overdue_ns(e, reorder_min_ns, peer_ns)

        sent = {psn: (k.t_sent_ns, k.ev) for psn, k in p.outstanding.items() if psn not in p.queued}
        order, timed = uet_sack.lost_on_paths(sent, delivered_ns, ev, reorder_ns, now_ns, overdue)
        for lost, counter in ((order, "path_order_losses"), (timed, "path_time_losses")):
            if lost:
                p.stats[counter] += len(lost)
                self._retransmit(p, lost, "fast_retransmits")
                for psn in lost:
                    del sent[psn]
        p.reorder_at_ns = uet_sack.next_overdue_ns(sent, p.rack_xmit_ns, reorder_ns, overdue)

    def _check_reorder(self, now_ns: int) -> float:
        """The reordering timer of loss_rule "path": re-check the time rule of every peer whose timer is due (at a
        flow's tail no later ACK would); return the seconds until the next one (inf if none)."""
        nxt = float("inf")
        for p in self.peers.values():
            if p.reorder_at_ns is not None and now_ns >= p.reorder_at_ns:
                self._path_losses(p, p.rack_xmit_ns, None, now_ns)
                self._pump(p)
            if p.reorder_at_ns is not None:
                nxt = min(nxt, max(0.0, (p.reorder_at_ns - now_ns) / 1e9))
        return nxt

    def _on_nack(self, p: PeerState, h: up.Header, now_ns: int) -> None:
        p.stats["nacks_received"] += 1
        pkt = p.outstanding.get(h.ack_psn)
        if pkt is not None and pkt.t_sent_ns == h.ts_ns:  # a NACK of its latest transmission: resend at once
            self._retransmit(p, [h.ack_psn], "nack_retransmits", front=True)
        p.cc.on_nack(now_ns / 1e9)


__all__ = ["PdsSender", "PeerState", "TxMessage", "TxPacket"]
