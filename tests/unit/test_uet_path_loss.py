"""The sender's per-entropy-value loss logic (traffic.uet_tx, loss_rule "path") driven without sockets: the EV an
ACK samples (PdsSender._acked_ev), the loss it reveals (_path_losses: path order on the same EV, the time rule across
EVs), RACK's latest delivered send time (rack_xmit_ns) and the reordering timer's arm / fire / clear cycle
(PeerState.reorder_at_ns, traffic.uet_sack.next_overdue_ns, PdsSender._check_reorder). Times are explicit
nanoseconds; the pure functions of traffic.uet_sack have their own tests in test_uet.py."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from traffic import uet_packet as up
from traffic.transport import Request
from traffic.uet_cc import Nscc
from traffic.uet_tx import PdsSender, PeerState, TxMessage, TxPacket

MS = 10**6
T0 = 10**9  # the clock's origin: a send time of 0 is what an ACK echoes when it names no transmission


class _Wire:
    """An EV socket that counts what is sent on it (the tests read the sender's bookkeeping, not the packets)."""

    def __init__(self):
        self.sent = 0

    def sendmsg(self, *_a):
        self.sent += 1


class _PathSender(PdsSender):
    """The sending side of one peer pair with loss_rule "path", a 1 ms reordering minimum and `n_ev` EVs; _pump
    only counts its calls (what it would resend is the retransmit queue the tests read)."""

    def __init__(self, n_ev: int = 2):
        self.rank, self.n_ev, self.ev_next = 0, n_ev, 0
        self.evs = [_Wire() for _ in range(n_ev)]
        self.rto_init_s = self.rto_min_s = 0.2
        self.reorder_min_s = 0.001
        self.loss_rule = "path"
        self.payload_bytes = 1000
        self.bytes_out = 0
        self.stats: Counter[str] = Counter()
        self.ready: list[Request] = []
        self.pumps = 0
        self.peers = {1: PeerState(1, ("10.0.0.1", up.UET_UDP_PORT), Nscc(), n_ev)}

    def _pump(self, p):
        self.pumps += 1

    def _done(self, req):
        self.ready.append(req)


def _send(p: PeerState, psn: int, t_ns: int, ev: int) -> TxPacket:
    """One transmission of `psn` at T0 + `t_ns` on `ev`, booked as PdsSender._transmit books it."""
    t_ns += T0
    pkt = p.outstanding.get(psn)
    if pkt is None:
        pkt = p.outstanding[psn] = TxPacket(psn, TxMessage(Request("send", 1, 0, 1000), psn), 0, 1000)
    pkt.t_sent_ns, pkt.ev = t_ns, ev
    pkt.tx_log.append((t_ns, ev))
    pkt.sends += 1
    p.queued.discard(psn)
    if not pkt.in_flight:
        pkt.in_flight = True
        p.inflight_bytes += pkt.wire_bytes
    return pkt


def _ack(s: _PathSender, psn: int, ts_ns: int, now_ns: int) -> None:
    """The ACK of `psn` alone (no cumulative point, empty bitmap) echoing the send time T0 + `ts_ns`, arriving at
    T0 + `now_ns`."""
    s._on_ack(s.peers[1], up.Header(up.TYPE_ACK, 0, 1, 0, 0, ack_psn=psn, ts_ns=T0 + ts_ns), T0 + now_ns)


def _check(s: _PathSender, now_ns: int) -> float:
    """The reordering timer's check at T0 + `now_ns`."""
    return s._check_reorder(T0 + now_ns)


def _tail_loss() -> tuple[_PathSender, PeerState]:
    """Sprayed over two EVs, PSN 2 (the last on EV 0) is lost; the ACKs of 0, 1 and 3 come back after 10 ms, and
    nothing is sent after PSN 3: no later ACK on EV 0 will reveal the loss by path order."""
    s = _PathSender()
    p = s.peers[1]
    for psn, t, ev in ((0, 0, 0), (1, 1 * MS, 1), (2, 2 * MS, 0), (3, 12 * MS, 1)):
        _send(p, psn, t, ev)
    _ack(s, 0, 0, 10 * MS)
    _ack(s, 1, 1 * MS, 11 * MS)
    _ack(s, 3, 12 * MS, 22 * MS)
    return s, p


def test_the_reordering_timer_resends_a_tail_loss_no_later_ack_reveals_once_it_falls_due():
    s, p = _tail_loss()
    assert list(p.outstanding) == [2] and not p.retxq  # across EVs, 10 ms is not yet late on EV 0's path
    assert p.rack_xmit_ns == T0 + 12 * MS
    due = p.reorder_at_ns
    # EV 0's estimator: srtt 10 ms, rttvar 5 ms -> allowance 10 + max(4 * 5, 10 / 4, 1) = 30 ms after PSN 2's send
    assert due == T0 + 2 * MS + p.paths.overdue_ns(0, MS, 0) == T0 + 32 * MS
    assert s._check_reorder(due - 1) == pytest.approx(1e-9) and not p.retxq  # not yet due: nothing
    s._check_reorder(due)
    assert list(p.retxq) == [2] and p.stats["path_time_losses"] == 1 and p.stats["fast_retransmits"] == 1
    assert not p.outstanding[2].in_flight and p.inflight_bytes == 0  # known lost: out of the window
    assert s.pumps == 1  # and the resend is attempted at once


def test_the_reordering_timer_is_cleared_once_every_packet_is_acknowledged():
    s, p = _tail_loss()
    s._check_reorder(p.reorder_at_ns)
    assert p.reorder_at_ns is None  # the lost packet waits in the retransmit queue: not timed again
    _send(p, 2, 33 * MS, 0)  # the resend
    _ack(s, 2, 33 * MS, 43 * MS)
    assert not p.outstanding and p.reorder_at_ns is None and _check(s, 10**12) == float("inf")


def test_a_late_delivery_of_the_awaited_packet_disarms_the_reordering_timer():
    s, p = _tail_loss()
    assert p.reorder_at_ns == T0 + 32 * MS
    _ack(s, 2, 2 * MS, 25 * MS)  # PSN 2 was slow, not lost: it arrives before the timer is due
    assert not p.outstanding and p.reorder_at_ns is None
    assert _check(s, 40 * MS) == float("inf") and not p.retxq and p.stats["fast_retransmits"] == 0


def _fire_due(s: _PathSender, p: PeerState, until_ns: int) -> int:
    """Run the reordering timer as the transport's loop does, up to T0 + `until_ns`; each time it fires, the timer it
    leaves must be later than the instant it fired at, or off. Returns how often it fired."""
    fires = 0
    while p.reorder_at_ns is not None and p.reorder_at_ns <= T0 + until_ns:
        due = p.reorder_at_ns
        wait_s = s._check_reorder(due)
        fires += 1
        assert p.reorder_at_ns is None or p.reorder_at_ns > due, (due, p.reorder_at_ns)
        assert wait_s > 0
    return fires


def test_the_reordering_timer_never_fires_twice_at_the_same_instant():
    """Random spraying over 3 EVs, 30 % loss, ACKs back after 5..15 ms in any order, events in time order: the
    timer never leaves itself due at the instant it fired (the caller's select would spin on it)."""
    rng = random.Random(7)
    fires = 0
    for _ in range(40):
        s = _PathSender(n_ev=3)
        p = s.peers[1]
        events, t = [], 0
        for psn in range(12):
            t += rng.randrange(1, 3 * MS)
            events.append((t, 0, psn, rng.randrange(3)))
            if rng.random() < 0.7:
                events.append((t + rng.randrange(5 * MS, 15 * MS), 1, psn, t))
        for t, kind, psn, arg in sorted(events):
            fires += _fire_due(s, p, t)
            if kind == 0:
                _send(p, psn, t, arg)
            else:
                _ack(s, psn, arg, t)
        fires += _fire_due(s, p, 10**12)
        assert p.reorder_at_ns is None
    assert fires >= 20  # the timer did fire in these runs (21 times with this seed)


def test_a_timer_left_due_by_a_resend_in_between_neither_declares_a_loss_nor_spins():
    s, p = _tail_loss()
    due = p.reorder_at_ns
    _send(p, 2, 30 * MS, 0)  # resent meanwhile (e.g. its NACK): the timer still points at the first send
    assert s._check_reorder(due) == float("inf")
    assert p.reorder_at_ns is None and not p.retxq and p.stats["fast_retransmits"] == 0


def test_a_packet_already_queued_for_resend_is_neither_declared_lost_again_nor_timed():
    s, p = _tail_loss()
    due = p.reorder_at_ns
    s._on_nack(p, up.Header(up.TYPE_NACK, 0, 1, 0, 0, ack_psn=2, ts_ns=T0 + 2 * MS), T0 + 20 * MS)
    assert list(p.retxq) == [2] and p.stats["nack_retransmits"] == 1  # the window holds its resend back
    assert _check(s, 40 * MS) == float("inf") and due <= T0 + 40 * MS
    assert list(p.retxq) == [2] and p.reorder_at_ns is None
    assert p.stats["path_time_losses"] == 0 and p.stats["fast_retransmits"] == 0


def test_an_ack_of_the_first_of_two_transmissions_samples_the_entropy_value_of_the_first():
    s = _PathSender()
    p = s.peers[1]
    pkt = TxPacket(0, TxMessage(Request("send", 1, 0, 1000, bytes(1000)), 0), 0, 1000)
    p.outstanding[0] = pkt
    assert s._transmit(p, pkt) and s._transmit(p, pkt)  # sent on EV 0, then resent on EV 1
    (t0, ev0), (t1, ev1) = pkt.tx_log
    assert (ev0, ev1) == (0, 1) and pkt.ev == 1 and [w.sent for w in s.evs] == [1, 1]
    h = up.Header(up.TYPE_ACK, 0, 1, 0, 0, ack_psn=0, ts_ns=t0)
    assert s._acked_ev(p, h) == 0
    assert s._acked_ev(p, h._replace(ts_ns=t1)) == 1
    assert s._acked_ev(p, h._replace(ts_ns=t0 + 1)) is None  # echoes no transmission of it: no EV
    s._on_ack(p, h, t1 + 5 * MS)
    assert p.paths.srtt_ns[0] == t1 + 5 * MS - t0 and p.paths.srtt_ns[1] == 0
    assert not p.outstanding and p.rack_xmit_ns == t0


def test_a_later_packet_acknowledged_on_the_same_entropy_value_proves_an_earlier_one_lost_at_once():
    s = _PathSender()
    p = s.peers[1]
    for psn, t, ev in ((0, 0, 0), (1, 1 * MS, 1), (2, 2 * MS, 0)):
        _send(p, psn, t, ev)
    _ack(s, 2, 2 * MS, 12 * MS)  # 2 ms after PSN 0, within the reorder window (max(1 ms, srtt / 4) = 2.5 ms)
    assert list(p.retxq) == [0] and p.stats["path_order_losses"] == 1 and p.stats["path_time_losses"] == 0
    assert 1 in p.outstanding and 1 not in p.queued  # sent on the other EV: still on its way


def test_a_later_packet_acknowledged_on_another_entropy_value_does_not_prove_a_loss_before_its_time_rule():
    s = _PathSender()
    p = s.peers[1]
    for psn, t, ev in ((0, 0, 0), (1, 10 * MS, 1)):
        _send(p, psn, t, ev)
    _ack(s, 1, 10 * MS, 20 * MS)  # 10 ms later, past RACK's window (2.5 ms), but on another path
    assert not p.retxq and p.stats["fast_retransmits"] == 0
    # EV 0 has no sample: the peer pair's allowance, srtt 10 + max(4 * 5, 2.5, 1) = 30 ms after PSN 0's send
    assert p.reorder_at_ns == T0 + 30 * MS
    assert _check(s, 30 * MS - 1) > 0 and not p.retxq  # just before: still nothing
    _check(s, 30 * MS)
    assert list(p.retxq) == [0] and p.stats["path_time_losses"] == 1 and p.stats["path_order_losses"] == 0
