"""Pure logic of the grant protocol's receive look-ahead (traffic.rdma_staging) and its option check
(traffic.rdma_options): no RDMA device needed."""

from __future__ import annotations

import pytest

from traffic.rdma_options import MAX_LOOKAHEAD, check
from traffic.rdma_staging import BufferPool, StagedReceives


class _Req:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes


def test_pool_registers_once_per_buffer_in_use_and_reuses_by_size():
    calls = []
    pool = BufferPool(lambda arr: calls.append(arr.nbytes) or f"mr{len(calls)}")
    a, b = pool.take(1000), pool.take(1000)
    assert a[0] is not b[0] and (a[1], b[1]) == ("mr1", "mr2") and len(a[0]) == 1000
    pool.give(a)
    assert pool.take(1000) is a and pool.take(64)[1] == "mr3"  # another size: a buffer of its own
    assert calls == [1000, 1000, 64] and pool.allocated == 3


def test_staged_receive_completes_whichever_comes_first_data_or_the_ops_receive():
    st = StagedReceives()
    early = st.stage(1, (5 << 32) | 7, 100, "buf-a")
    late = st.stage(1, (6 << 32) | 7, 100, "buf-b")
    with pytest.raises(ValueError, match="announced twice"):
        st.stage(1, (5 << 32) | 7, 100, "again")
    # data first: kept until the op posts the receive, which then takes it (and forgets it)
    assert st.land(early) is False and len(st) == 2
    r = _Req(100)
    assert st.claim(1, (5 << 32) | 7, r) is early and early.req is r and early.landed and len(st) == 1
    # the op's receive first: the landing hands it over
    r2 = _Req(100)
    assert st.claim(1, (6 << 32) | 7, r2) is late and not late.landed and len(st) == 1
    assert st.land(late) is True and len(st) == 0
    # not announced: the caller grants the receive's own buffer as before
    assert st.claim(1, (7 << 32) | 7, _Req(100)) is None
    st.stage(2, 1, 100, None)
    with pytest.raises(ValueError, match="has 50 bytes, announced 100"):
        st.claim(2, 1, _Req(50))


def _opts(**kw):
    base = dict(dscp=0, traffic_class=None, mtu=0, timeout=16, retry_cnt=7, rnr_retry=7, min_rnr_timer=12,
                signal_every=16, credits=8, slot_bytes=131072, protocol="grant", piece_bytes=262144,
                send_depth=128, recv_depth=0, ctl_reserve=8)
    base.update(kw)
    return check(**base)


def test_lookahead_is_for_the_grant_protocol_and_bounded():
    assert _opts(lookahead=4)[0] == "grant" and _opts(lookahead=0)[0] == "grant"
    with pytest.raises(ValueError, match=rf"lookahead must be 0..{MAX_LOOKAHEAD} \(got 17"):
        _opts(lookahead=MAX_LOOKAHEAD + 1)
    with pytest.raises(ValueError, match="lookahead needs protocol grant"):
        _opts(protocol="", lookahead=2)


class _Announced:
    """A transport that records what the agent announces ahead (traffic.agent._announce)."""

    lookahead = 2

    def __init__(self):
        self.calls: list[tuple[int, int, int]] = []

    def post_ahead(self, peer: int, tag: int, nbytes: int) -> None:
        self.calls.append((peer, tag, nbytes))


def test_agent_announces_each_later_ops_receives_once_with_its_wire_tag():
    from traffic.agent import OpState, _announce
    from traffic.collectives import make_schedule

    s = make_schedule("pipeline", 2, 4000, chunks=1)
    states = {"p2p": OpState("p2p", s, 1, 7, False)}
    (rv,) = [r for st in s.programs[1].steps for r in st.recvs]
    t = _Announced()
    order = ["p2p"] * 4
    mark = _announce(t, states, order, 1, 0 + t.lookahead + 1)  # before op 0: ops 1 and 2
    assert mark == 3 and t.calls == [(0, (1 << 32) | rv.tag, 4000), (0, (2 << 32) | rv.tag, 4000)]
    assert _announce(t, states, order, mark, 1 + t.lookahead + 1) == 4 and t.calls[-1][1] == (3 << 32) | rv.tag
    assert _announce(t, states, order, 4, 2 + t.lookahead + 1) == 4 and len(t.calls) == 3  # the plan has 4 ops
