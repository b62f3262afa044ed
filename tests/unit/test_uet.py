"""The pure parts of the agents' UET transport: the packet format (traffic.uet_packet), SACK bookkeeping and the
loss rule (traffic.uet_sack), the NSCC-style window law (traffic.uet_cc)."""

from __future__ import annotations

import random

import pytest

from traffic import uet_packet as up
from traffic.jobplan import payload_efficiency
from traffic.uet_cc import Nscc, NsccParams
from traffic.uet_sack import SACK_BITS, PathRtt, ReceiveWindow, acked, lost, lost_on_paths, next_overdue_ns
from traffic.transport import Request
from traffic.uet_tx import PdsSender, PeerState, TxMessage, TxPacket


def test_a_header_packs_to_72_bytes_and_round_trips_every_field():
    h = up.Header(up.TYPE_DATA, up.FLAG_RETX, 3, 5, 2**32 - 1, ack_psn=7, msg_id=9, payload_bytes=1400,
                  tag=(12 << 32) | 4, msg_bytes=1 << 33, offset=1 << 32, sack_psn=11, sack_bitmap=2**64 - 1,
                  ts_ns=123456789012345)
    raw = h.pack()
    assert len(raw) == up.HEADER_BYTES == 72
    assert up.unpack(raw + b"payload") == h
    assert raw[up.TYPE_OFFSET] == up.TYPE_DATA and raw[up.FLAGS_OFFSET] == up.FLAG_RETX and raw[0] == up.MAGIC


@pytest.mark.parametrize("raw", [b"", bytes(71), b"\x54" + bytes(71), b"\x55\x09" + bytes(70)])
def test_what_is_not_a_uet_packet_is_refused(raw):
    with pytest.raises(up.BadPacket):
        up.unpack(raw)


def test_payload_fills_the_mtu_after_ipv4_udp_and_the_header():
    assert up.payload_bytes_for(1500) == 1500 - 20 - 8 - 72
    # the collective's alpha-beta bound counts the same bytes per frame (the shaper sees the Ethernet header too)
    assert payload_efficiency("uet", 1500) == pytest.approx(up.payload_bytes_for(1500) / 1514)
    with pytest.raises(ValueError):
        up.payload_bytes_for(100)


def test_the_receive_window_advances_its_cumulative_point_and_reports_the_rest_in_the_bitmap():
    w = ReceiveWindow()
    for psn in (1, 2, 5):
        assert w.add(psn)
    assert w.cack_psn == 0 and w.sack() == (0, 0b100110)
    assert w.add(0) and w.cack_psn == 3 and w.sack() == (3, 0b100)
    assert not w.add(1) and not w.add(5)  # duplicates
    assert w.has(2) and not w.has(3)
    w.add(3 + SACK_BITS)  # beyond the bitmap: held, not reported yet
    assert w.sack() == (3, 0b100)


def test_random_arrival_order_ends_with_everything_cumulatively_acked():
    rng = random.Random(3)
    psns = list(range(500)) * 2  # every packet twice (retransmissions)
    rng.shuffle(psns)
    w = ReceiveWindow()
    new = sum(w.add(p) for p in psns)
    assert new == 500 and w.cack_psn == 500 and not w.above


def test_the_sender_reads_delivered_psns_from_cack_bitmap_and_ack_psn():
    outstanding = [3, 4, 5, 6, 7, 70, 90]
    # cumulative up to 5, bitmap from 5: bit 2 = psn 7; ack_psn 90 itself (beyond the bitmap)
    assert acked(outstanding, 5, 5, 0b100, 90) == [3, 4, 7, 90]
    assert acked(outstanding, 0, 0, 0, 999) == []


def test_rack_rule_declares_lost_only_what_was_sent_a_reorder_window_before_a_delivered_packet():
    sent = {10: 1_000, 11: 1_900, 12: 2_500}
    assert lost(sent, 2_000, 500) == [10]  # 11 was sent 100 ns before: reordering, not loss
    assert lost(sent, 3_000, 500) == [10, 11]
    assert lost(sent, 900, 0) == []


def test_path_rule_declares_lost_what_was_sent_before_a_delivered_packet_on_the_same_entropy_value():
    # psn -> (send time, EV); the delivered packet was sent at 3_000 on EV 1
    sent = {10: (1_000, 1), 11: (2_900, 1), 12: (1_000, 0), 13: (3_500, 1)}
    never = lambda ev: 10**12  # noqa: E731 - no packet is overdue on its path
    # on EV 1, 10 and 11 were sent earlier: one path keeps order, so both are lost, 11 despite being sent 100 ns
    # before (inside any reorder window); 13 was sent after; 12 is on another path and not overdue there
    assert lost_on_paths(sent, 3_000, 1, 500, 4_000, never) == ([10, 11], [])
    # the ACK's EV unknown (it answers an earlier transmission): only the time rule can act
    assert lost_on_paths(sent, 3_000, None, 500, 4_000, never) == ([], [])


def test_path_rule_time_fallback_needs_both_racks_window_and_lateness_on_the_packets_own_path():
    sent = {20: (1_000, 0), 21: (1_000, 2), 22: (2_800, 2)}
    overdue = {0: 1_000, 2: 50_000}.__getitem__  # EV 0 a fast path, EV 2 a slow one
    # delivered on EV 1, sent at 3_000: 20 and 21 are a reorder window (500) older; at 4_000 only 20 is older than
    # its path's allowance (3_000 > 1_000); 21 is still within the slow path's 50_000; 22 is inside the window
    assert lost_on_paths(sent, 3_000, 1, 500, 4_000, overdue) == ([], [20])
    assert lost_on_paths(sent, 3_000, 1, 500, 52_000, overdue) == ([], [20, 21])
    # with no later ACK the reordering timer must look again when 20 (fast path) falls due: 1_000 + 1_000;
    # once 20 is resent, at 21's due time on the slow path; 22 is not yet a reorder window older than the delivery
    assert next_overdue_ns(sent, 3_000, 500, overdue) == 2_000
    del sent[20]
    assert next_overdue_ns(sent, 3_000, 500, overdue) == 51_000
    assert next_overdue_ns({22: (2_800, 2)}, 3_000, 500, overdue) is None


def test_path_rtt_keeps_an_estimator_per_entropy_value_and_falls_back_for_unsampled_ones():
    r = PathRtt(3)
    assert r.overdue_ns(0, 1_000, 77) == 77  # no sample yet: the peer pair's allowance
    r.sample(0, 8_000)  # first sample: srtt 8000, rttvar 4000 -> 8000 + 4 * 4000
    assert r.overdue_ns(0, 1_000, 77) == 24_000
    for _ in range(200):
        r.sample(1, 400_000)  # a steady slow path: the variation decays, srtt/4 is the allowance left
    assert r.srtt_ns[1] == 400_000 and r.overdue_ns(1, 1_000, 77) == 500_000
    assert r.overdue_ns(2, 1_000, 77) == 77 and r.srtt_ns[0] == 8_000  # one EV's samples leave the others alone
    r.sample(0, 16_000)  # RFC 6298: rttvar = 3/4 * 4000 + 1/4 * |8000 - 16000|, srtt = 7/8 * 8000 + 1/8 * 16000
    assert (r.srtt_ns[0], r.rttvar_ns[0]) == (9_000, 5_000)


P = NsccParams(mtu_bytes=1000, init_cwnd_bytes=10_000, min_cwnd_bytes=1000, max_cwnd_bytes=100_000,
               target_delay_s=0.001, gain=0.5, beta=0.5, max_md=0.5)


def test_unmarked_acks_at_base_delay_grow_the_window_proportionally_plus_one_mtu_per_window():
    cc = Nscc(P)
    cc.on_ack(0.0, 1000, 0.0001, False)  # the first sample is the base RTT: delay 0
    # proportional: 0.5 * 1000 * 1; fair: 1000 * 1000 / 10500
    assert cc.cwnd_bytes == pytest.approx(10_000 + 500 + 1000 * 1000 / 10_500)
    assert cc.events["PROPORTIONAL_INCREASE"] == cc.events["FAIR_INCREASE"] == 1


def test_delay_above_target_cuts_by_the_excess_and_only_once_per_rtt():
    cc = Nscc(P)
    cc.on_ack(0.0, 1000, 0.0001, False)
    w = cc.cwnd_bytes
    cc.on_ack(1.0, 1000, 0.0031, False)  # delay 3 ms, target 1 ms: cut min(0.5, 0.5 * 2/3)
    assert cc.cwnd_bytes == pytest.approx(w * (1 - 0.5 * 2 / 3))
    w = cc.cwnd_bytes
    cc.on_ack(1.0 + cc.srtt_s / 2, 1000, 0.0031, False)  # same RTT: no second cut
    assert cc.cwnd_bytes == w and cc.events["NO_CHANGE"] == 1


def test_with_one_way_delays_the_queue_on_the_way_back_does_not_cut():
    cc = Nscc(P)
    cc.on_ack(0.0, 1000, 0.0001, False, owd_s=0.00005)
    w = cc.cwnd_bytes
    cc.on_ack(1.0, 1000, 0.0101, False, owd_s=0.00005)  # RTT +10 ms, all of it on the ACK's way back
    assert cc.cwnd_bytes > w and cc.events["MULTIPLICATIVE_DECREASE"] == 0
    cc.on_ack(2.0, 1000, 0.0101, False, owd_s=0.00305)  # 3 ms more on the way there: cut
    assert cc.events["MULTIPLICATIVE_DECREASE"] == 1


def test_ecn_echo_and_nack_cut_by_max_md_and_a_timeout_drops_to_the_minimum():
    cc = Nscc(P)
    cc.on_ack(0.0, 0, 0.0001, True)
    assert cc.cwnd_bytes == 5000 and cc.events["MULTIPLICATIVE_DECREASE"] == 1
    cc.on_nack(1.0)
    assert cc.cwnd_bytes == 2500 and cc.events["NACK_DECREASE"] == 1
    cc.on_nack(2.0)
    cc.on_nack(3.0)
    assert cc.cwnd_bytes == 1000  # clamped at the minimum
    cc.cwnd_bytes = 50_000
    cc.on_timeout(4.0)
    assert cc.cwnd_bytes == 1000 and cc.events["TIMEOUT_DECREASE"] == 1


def test_the_window_never_exceeds_its_maximum():
    cc = Nscc(P)
    for i in range(10_000):
        cc.on_ack(i * 1e-3, 1000, 0.0001, False)
    assert cc.cwnd_bytes == P.max_cwnd_bytes


@pytest.mark.parametrize("kw", [dict(min_cwnd_bytes=0), dict(init_cwnd_bytes=10**9), dict(max_md=1.0),
                                dict(target_delay_s=0)])
def test_bad_window_parameters_are_refused(kw):
    with pytest.raises(ValueError):
        NsccParams(**kw)


class _Timers(PdsSender):
    """The sender's timer alone: one peer, nothing to pump."""

    def __init__(self):
        self.rto_init_s = self.rto_min_s = 0.05
        self.peers = {1: PeerState(1, ("10.0.0.1", up.UET_UDP_PORT), None)}

    def _pump(self, p):
        pass


def _sent(p: PeerState, psn: int, t_ns: int) -> TxPacket:
    pkt = TxPacket(psn, TxMessage(Request("send", 1, 0, 1000), 0), 0, 1000)
    pkt.t_sent_ns, pkt.sends = t_ns, 1
    p.outstanding[psn] = pkt
    return pkt


def test_a_packet_waiting_in_the_retransmit_queue_does_not_make_the_timer_expire_at_once():
    s = _Timers()
    p = s.peers[1]
    _sent(p, 0, 0)  # expired long ago, already queued for retransmission (the window holds it back)
    p.queued.add(0)
    p.retxq.append(0)
    now = 10**9
    assert s._check_rto(now) == float("inf") and p.stats["rto_events"] == 0
    _sent(p, 1, now - 10**7)  # in flight, sent 10 ms ago: its timer is the next expiry
    assert s._check_rto(now) == pytest.approx(0.04)
