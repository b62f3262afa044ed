"""Pure logic of the RDMA transport's eager protocol: pieces, credits, the receive ring's accounting, the send
queue's selective signaling and the QP-info bootstrap (traffic.rdma_credits, rdma_sendq, rdma_connect). The
protocol on real queue pairs is exercised in the lab VM (tests/integration/test_rdma.py)."""

from __future__ import annotations

import random
import socket
import time
from collections import deque

import pytest

from traffic.rdma_connect import INFO, QpInfo, exchange, ready
from traffic.rdma_credits import RecvRing, SendWindow, auto_slots, check_ring, chunks
from traffic.rdma_sendq import Posted, SendQueue
from traffic.transport import TransportError


def test_chunks_cover_the_message_exactly_once():
    assert chunks(0, 4096) == [(0, 0)]
    assert chunks(1, 4096) == [(0, 1)]
    assert chunks(4096, 4096) == [(0, 4096)]
    assert chunks(10000, 4096) == [(0, 4096), (4096, 4096), (8192, 1808)]
    for n in (1, 4095, 4097, 1 << 20, (1 << 20) + 3):
        parts = chunks(n, 128 * 1024)
        assert sum(ln for _, ln in parts) == n
        assert all(off == k * 128 * 1024 for k, (off, _) in enumerate(parts))


def test_ring_shape_is_checked():
    check_ring(0, 0)  # rendezvous: no ring
    check_ring(64, 1 << 20)
    with pytest.raises(ValueError, match="credits must be 0..64"):
        check_ring(65, 4096)
    with pytest.raises(ValueError, match="slot_bytes must be 4096"):
        check_ring(8, 100)


def test_send_window_gives_each_slot_once():
    w = SendWindow(4)
    taken = [w.take() for _ in range(4)]
    assert sorted(taken) == [0, 1, 2, 3] and w.take() is None
    assert w.give(0b0101) == 2
    assert sorted([w.take(), w.take()]) == [0, 2] and w.take() is None
    w.give(0b0001)
    with pytest.raises(ValueError, match="not in use"):
        w.give(0b0001)  # slot 0 is already ours
    with pytest.raises(ValueError, match="slot >= 4"):
        w.give(0b10000)


def test_ring_reports_freed_slots_in_batches():
    r = RecvRing(8)  # a credit message per 2 freed slots
    assert r.free(3) == 0
    assert r.free(5) == (1 << 3) | (1 << 5)
    assert r.free(3) == 0  # reused and freed again after the report: fine
    with pytest.raises(ValueError, match="freed twice"):
        r.free(3)
    one = RecvRing(1)
    assert one.free(0) == 1  # a one-slot ring reports every slot at once


def test_ring_holds_at_most_half_of_its_slots():
    r = RecvRing(8)
    out = [r.hold(k) for k in range(6)]
    assert out[:4] == [[], [], [], []] and out[4] == [0] and out[5] == [1]
    r.release(3)
    assert list(r.held) == [2, 4, 5]


def _simulate(slots: int, messages: list[int], slot_bytes: int, recv_order: list[int], seed: int) -> int:
    """The sender and the receiver's ring driven by the protocol's rules, with the receive of each message posted
    in ``recv_order`` only when every earlier one in that order is complete (a schedule's dependency), pieces and
    credit messages delivered in order after random delays. Returns the messages received; a deadlock stops it."""
    rnd = random.Random(seed)
    win, ring = SendWindow(slots), RecvRing(slots)
    pending = deque((m, off, n) for m, size in enumerate(messages) for off, n in chunks(size, slot_bytes))
    to_recv, to_send = deque(), deque()  # pieces (slot, message, length) and credit bitmaps in flight
    held: dict[int, list] = {}  # message -> held records [slot or None, length]
    got = dict.fromkeys(range(len(messages)), 0)
    posted, done = None, 0
    order = deque(recv_order)
    for _ in range(100_000):
        if posted is None and order:
            posted = order.popleft()
            for rec in held.pop(posted, []):
                if rec[0] is not None:
                    ring.release(rec)
                    bm = ring.free(rec[0])
                    if bm:
                        to_send.append(bm)
                got[posted] += rec[1]
        while pending and win.free:
            m, off, n = pending.popleft()
            to_recv.append((win.take(), m, n))
        moved = False
        if to_recv and rnd.random() < 0.7:
            slot, m, n = to_recv.popleft()
            moved = True
            if m == posted:
                got[m] += n
                bm = ring.free(slot)
                if bm:
                    to_send.append(bm)
            else:
                rec = [slot, n]
                held.setdefault(m, []).append(rec)
                for old in ring.hold(rec):
                    bm = ring.free(old[0])
                    old[0] = None
                    if bm:
                        to_send.append(bm)
        if to_send and rnd.random() < 0.7:
            win.give(to_send.popleft())
            moved = True
        if posted is not None and got[posted] == messages[posted]:
            done += 1
            posted = None
            moved = True
        if done == len(messages):
            return done
        if not moved and not to_recv and not to_send and not (pending and win.free):
            return done  # nothing can move: deadlock
    return done


@pytest.mark.parametrize("slots", [1, 2, 3, 4, 8, 64])
def test_credits_never_deadlock_when_receives_come_in_another_order(slots):
    """The sender writes messages 0..5 in order; the receiver posts them in reverse, each only after the previous
    one completed (the case a bounded ring could deadlock: it fills with pieces nobody has asked for yet)."""
    messages = [3 * 4096, 4096, 5 * 4096 + 7, 0, 2 * 4096, 9 * 4096]
    for seed in range(20):
        assert _simulate(slots, messages, 4096, list(reversed(range(len(messages)))), seed) == len(messages)
        assert _simulate(slots, messages, 4096, list(range(len(messages))), seed) == len(messages)


def test_send_queue_signals_what_needs_a_completion_and_every_nth():
    q = SendQueue(depth=8, signal_every=4)
    posted = []
    for w in range(1, 7):
        posted += q.push(Posted(w, f"r{w}", must_signal=(w == 6)))
    assert [e.signaled for e in posted] == [False, False, False, True, False, True]
    done, more = q.completed(4)
    assert [e.wid for e in done] == [1, 2, 3, 4] and more == []  # one completion releases the 3 before it
    with pytest.raises(KeyError):
        q.completed(5)  # unsignaled: no completion names it
    done, _ = q.completed(6)
    assert [e.wid for e in done] == [5, 6] and q.in_flight == 0


def test_send_queue_signals_the_request_that_fills_it_and_keeps_a_backlog():
    q = SendQueue(depth=3, signal_every=100)
    out = []
    for w in range(1, 6):
        out += q.push(Posted(w, None, must_signal=False))
    assert [e.wid for e in out] == [1, 2, 3] and out[-1].signaled  # else nothing would ever make room
    assert q.in_flight == 3 and len(q.backlog) == 2
    done, more = q.completed(3)
    assert [e.wid for e in done] == [1, 2, 3]
    assert [e.wid for e in more] == [4, 5]


def test_qp_info_round_trip_and_protocol_mismatch_is_one_line():
    info = QpInfo(0x1234, 77, bytes(range(16)), 3, 0x7F0000001000, 0xABCD, 8, 131072)
    assert len(info.pack()) == INFO.size and QpInfo.unpack(info.pack(), 0, 1) == info
    with pytest.raises(TransportError, match="bad QP info from rank 1"):
        QpInfo.unpack(b"\0" * INFO.size, 0, 1)
    a, b = socket.socketpair()
    try:
        deadline = time.monotonic() + 5
        b.sendall(info._replace(slots=0, ring_addr=0, ring_rkey=0, slot_bytes=0).pack())
        with pytest.raises(TransportError, match="both ends must use the same protocol"):
            exchange(0, {1: a}, {1: info}, deadline)
        assert QpInfo.unpack(b.recv(INFO.size), 1, 0) == info  # ours went out before theirs was read
        b.sendall(info._replace(protocol=3).pack())  # the grant protocol against an eager end
        with pytest.raises(TransportError, match="data protocol 3 .* this rank 0"):
            exchange(0, {1: a}, {1: info}, deadline)
        b.recv(INFO.size)
        b.sendall(info.pack())
        assert exchange(0, {1: a}, {1: info}, deadline) == {1: info}
        assert b.recv(INFO.size) == info.pack()
        b.sendall(b"R")
        ready(0, {1: a}, deadline)
        assert b.recv(1) == b"R"
    finally:
        a.close()
        b.close()


def test_a_silent_peer_times_out_in_one_line():
    a, b = socket.socketpair()
    try:
        info = QpInfo(1, 2, bytes(16), 3)
        with pytest.raises(TransportError, match="rank 1 did not send its QP info in time"):
            exchange(0, {1: a}, {1: info}, time.monotonic() + 0.2)
    finally:
        a.close()
        b.close()


def test_an_unset_ring_shrinks_as_a_rank_has_more_peers():
    """4 MiB of 128 KiB slots per peer up to 4 peers, the old 1 MiB from 16 on: a rank's rings stay within 128 slots."""
    assert [auto_slots(n) for n in (0, 1, 4, 5, 8, 16, 64)] == [32, 32, 32, 25, 16, 8, 8]
    assert all(auto_slots(n) * n <= 128 for n in range(1, 17))


def test_a_fitted_ring_stays_within_the_receive_queue_and_a_given_one_is_kept():
    """Eager.fit: the unset ring follows the peers but leaves a receive for each slot's write and credit message
    (recv_depth >= 2 x slots + 2), never below 8 slots (traffic.rdma_options checks that much); credits=N stays N."""
    from types import SimpleNamespace

    from traffic.rdma_eager import Eager

    for depth, peers, want in ((128, 2, 32), (40, 2, 19), (18, 1, 8), (128, 16, 8)):
        t = SimpleNamespace(recv_depth=depth, credits=None)
        Eager(t, None, 128 * 1024).fit(peers)
        assert t.credits == want, (depth, peers, t.credits)
    t = SimpleNamespace(recv_depth=128, credits=12)
    Eager(t, 12, 128 * 1024).fit(2)
    assert t.credits == 12
