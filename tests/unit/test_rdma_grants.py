"""Pure logic of the RDMA transport's grant protocol (traffic.rdma_grants), its registration cache
(traffic.rdma_regcache) and its option checks (traffic.rdma_options): no RDMA device needed."""

from __future__ import annotations

import numpy as np
import pytest

from traffic.rdma_grants import (CTL_BYTES, GRANT_HDR, MAX_PER_MESSAGE, Grant, GrantBook, GrantIssuer, pack_grants,
                                 swapped, unpack_grants)
from traffic.rdma_options import check
from traffic.rdma_regcache import RegistrationCache


def test_grant_messages_round_trip_and_reject_garbage():
    gs = [Grant(tag=(7 << 32) | k, addr=0x7F0000000000 + k * 4096, length=65536, rkey=0x1234, gid=k + 1)
          for k in range(MAX_PER_MESSAGE)]
    raw = pack_grants(gs)
    assert len(raw) <= CTL_BYTES and unpack_grants(raw) == gs
    assert unpack_grants(pack_grants(gs[:1])) == gs[:1]
    with pytest.raises(ValueError, match="1..15 grants"):
        pack_grants(gs + gs[:1])
    with pytest.raises(ValueError, match="1..15 grants"):
        pack_grants([])
    with pytest.raises(ValueError, match="not a grant message"):
        unpack_grants(b"\0" * 64)
    with pytest.raises(ValueError, match="not a grant message"):  # says 15 grants, carries 1
        unpack_grants(GRANT_HDR.pack(0x74624752, 15) + raw[GRANT_HDR.size:GRANT_HDR.size + 32])


def test_issuer_batches_grants_per_peer_and_matches_immediates():
    iss = GrantIssuer()
    a = [iss.grant(1, tag, 0x1000 * tag, 100, 9, f"recv-{tag}") for tag in range(20)]
    b = iss.grant(2, 0, 0x9000, 8, 9, "other peer")
    assert [g.gid for g in a] == list(range(1, 21)) and b.gid == 21
    first = iss.batch(1)
    assert first == a[:MAX_PER_MESSAGE] and iss.pending(1) == 20 - MAX_PER_MESSAGE and iss.pending(2) == 1
    second = iss.batch(1)
    iss.unbatch(1, second)  # no control slot was free: sent with the next batch, first in line
    assert iss.batch(1) == a[MAX_PER_MESSAGE:] and iss.batch(1) == [] and iss.pending(1) == 0
    # the message's immediate completes exactly its receive, once; a byte-swapped immediate too
    assert iss.complete(3) == "recv-2"
    assert iss.complete(swapped(4)) == "recv-3"
    with pytest.raises(KeyError):
        iss.complete(3)
    assert iss.complete(21) == "other peer"


def test_issuer_ids_wrap_past_open_grants():
    iss = GrantIssuer()
    iss.next_id = 0x7FFFFFFF
    g1 = iss.grant(1, 1, 0, 0, 0, "a")
    g2 = iss.grant(1, 2, 0, 0, 0, "b")
    assert (g1.gid, g2.gid) == (0x7FFFFFFF, 1)
    iss.next_id = 1  # 1 is still open: skipped
    assert iss.grant(1, 3, 0, 0, 0, "c").gid == 2


def test_book_matches_sends_and_grants_whichever_comes_first():
    book = GrantBook()
    g = Grant(5, 0x1000, 64, 7, 1)
    assert book.add_grant(g) is None  # the grant came first: kept
    assert book.add_send(5, "send-5") == g  # the send takes it
    assert book.add_send(6, "send-6") is None  # the send came first: waits
    assert book.add_grant(Grant(6, 0x2000, 64, 7, 2)) == "send-6"
    assert not book.grants and not book.sends
    book.add_grant(Grant(8, 0, 0, 0, 3))
    with pytest.raises(ValueError, match="tag 8 granted twice"):
        book.add_grant(Grant(8, 0, 0, 0, 4))
    book.add_send(9, "x")
    with pytest.raises(ValueError, match="tag 9 posted twice"):
        book.add_send(9, "y")


def test_registration_cache_registers_each_array_once():
    calls = []
    cache = RegistrationCache(lambda length, start: calls.append((start, length)) or f"mr{len(calls)}")
    big = np.zeros(1 << 20, dtype=np.float32)
    u8 = big.view(np.uint8)
    mr, a = cache.region(memoryview(u8[4096:8192]))
    assert mr == "mr1" and a == big.ctypes.data + 4096
    assert calls == [(big.ctypes.data, big.nbytes)]  # the whole array, not the view
    for off in (0, 4096, 100000):  # other views of it, and the same view again: no new registration
        assert cache.region(memoryview(u8[off:off + 1024]))[0] == "mr1"
    assert cache.region(memoryview(u8[4096:8192])) == ("mr1", a)
    other = np.ones(64, dtype=np.uint8)
    assert cache.region(memoryview(other))[0] == "mr2" and len(calls) == 2
    assert (cache.hits, cache.misses) == (4, 2) and cache.regions() == ["mr1", "mr2"]
    cache.clear()
    assert cache.region(memoryview(other))[0] == "mr3"


def _opts(**kw):
    base = dict(dscp=0, traffic_class=None, mtu=0, timeout=16, retry_cnt=7, rnr_retry=7, min_rnr_timer=12,
                signal_every=16, credits=8, slot_bytes=131072, protocol="", piece_bytes=262144, send_depth=128,
                recv_depth=0, ctl_reserve=8)
    base.update(kw)
    return check(**base)


def test_an_unset_ring_asks_for_the_least_ring_of_an_explicit_receive_queue():
    """credits unset (the fitted eager ring, traffic.rdma_credits.auto_slots): the default receive queue holds the
    largest ring, and an explicit smaller one is accepted down to the least ring's 2 x 8 + 2 (Eager.fit then fits
    the ring to it), for every protocol as with credits=8."""
    assert _opts(credits=None) == ("eager", 128)
    for proto in ("eager", "grant", "rendezvous"):
        assert _opts(credits=None, protocol=proto, recv_depth=40) == (proto, 40)
    with pytest.raises(ValueError, match="recv_depth >= 2 x credits"):
        _opts(credits=None, recv_depth=17)


def test_protocol_follows_credits_unless_named():
    assert _opts() == ("eager", 128)
    assert _opts(credits=0) == ("rendezvous", 128)
    assert _opts(protocol="grant") == ("grant", 128)
    assert _opts(protocol="grant", credits=0, piece_bytes=0)[0] == "grant"
    with pytest.raises(ValueError, match="protocol must be one of eager, rendezvous, grant"):
        _opts(protocol="ring")
    with pytest.raises(ValueError, match="protocol eager needs credits > 0"):
        _opts(protocol="eager", credits=0)
    with pytest.raises(ValueError, match="piece_bytes must be >= 0"):
        _opts(protocol="grant", piece_bytes=-1)
    with pytest.raises(ValueError, match=r"spin_us must be 0..100000 \(got -1\)"):
        _opts(spin_us=-1)
