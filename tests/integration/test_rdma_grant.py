"""The RDMA transport's grant protocol (traffic.rdma_grant) between real agents over rxe, in the lab VM.

One leaf, 3 hosts with an rxe device each, HTB at 200 Mbit/s; the agents (traffic.agent, data verified) run an
all-to-all in 3 chunks, and a step that receives 3 messages of 256 KiB from one peer at once (their grants go in
one message, the 3 are in flight together, each written as a chain of 4 pieces). The assertions are on the
transports' own counts: every receive granted exactly once, grants batched, one completion per message at the
receiver (the completions a rank saw add up exactly to its messages and grant messages), nothing copied. The kept
protocols (rendezvous, eager) and grant with look-ahead run the same all-to-all and verify. With receive
look-ahead (``lookahead=3``), a point-to-point job of 1 MB messages has more than one message per peer in flight
(the transports' own maxima of grants open and of messages written but not acknowledged), every op after the
first takes its data from a staging buffer, and the data verifies; without look-ahead the same job has one in
flight. No timing is compared.
"""

from __future__ import annotations

import os

import pytest

from testbed.kernel import netns

RANKS = 3


@pytest.fixture(scope="module")
def fabric():
    """The path, built once for the module's tests (each runs its own job with agents of its own, on fresh QPs; the
    build and teardown with rxe took 1.4-2.1 + 1.5-1.7 s a test in the lab VM, ~0.2 + 0.2 s shared; the file 83, 108
    and 92 s per-test, 82 and 88 s shared, 2026-12-06, machine shared) and torn down after the last: then none of
    its namespaces may be left (conftest's no_leftovers checks each test's own)."""
    from testbed.network.fabric import Fabric
    from topologies import LeafSpineSpec, LinkSpec

    tag = f"g{os.getpid() % 100000}"
    fab = Fabric(LeafSpineSpec(spines=1, leaves=1, hosts_per_leaf=RANKS, host_link=LinkSpec(200.0),
                               fabric_link=LinkSpec(200.0)), tag, rxe=True)
    try:
        fab.build(None, None)
        yield fab
    finally:
        fab.teardown()
    left = [n for n in netns.list_ours() if n.startswith(f"tb-{tag}-")]
    assert not left, f"namespaces left behind: {left}"


def run_job(fab, workdir, options: dict, schedule, ranks: int):
    """Agents on h1..h<ranks> running ``schedule`` (3 measured iterations after a warm-up); the controller's
    results (raises with the agents' logs on failure)."""
    from traffic import job as jobm
    from traffic.controller import Controller, Member
    from traffic.rdma import find_device

    hosts = [f"h{k + 1}" for k in range(ranks)]
    devices = {str(r): find_device(fab.host_ip(h))[0] for r, h in enumerate(hosts)}
    spec = jobm.JobSpec(ranks=ranks, segments=(jobm.Segment((("op", "op"),), 3),), warmup=1)
    job = {"ranks": ranks, "seed": 3, "verify": True, "timeout_s": 200,
           "transport": {"kind": "rdma", "rdma": {"devices": devices, **options}}, "plan": jobm.iteration_plan(spec)}
    members = [Member(r, h, fab.ns(h), fab.host_ip(h)) for r, h in enumerate(hosts)]
    ctl = Controller(workdir, job, {"op": schedule}, members, netns.popen)
    try:
        ctl.start()
        res = ctl.run(setup_timeout_s=60, run_timeout_s=200)
    except Exception:
        for r in range(ranks):
            print(f"--- agent {r} log:\n{ctl.agent_log(r)}")
        raise
    finally:
        ctl.stop()
    return res


def alltoall():
    from traffic.collectives import make_schedule

    return make_schedule("alltoall", RANKS, 384 * 1024, chunks=3)


def last_stats(res) -> dict[tuple[int, int], dict]:
    """(rank, peer) -> the transport's per-connection counts at the end of the last op."""
    out = {}
    for _it, _k, rank, peer, phase, info in res.tcp_info:
        if phase == "end":
            out[(rank, peer)] = info
    return out


def test_grant_protocol_one_completion_per_message_nothing_copied(fabric, tmp_path):
    res = run_job(fabric, tmp_path / "a2a", {"protocol": "grant"}, alltoall(), RANKS)
    assert res.verified, res.per_rank
    stats = last_stats(res)
    ops = 4  # the warm-up and 3 measured
    for r in range(RANKS):
        tr = res.per_rank[r]["transport"]
        prof = tr["profile"]
        assert tr["protocol"] == "grant" and prof["copy_s"] == 0, tr
        grant_msgs = 0
        for peer in set(range(RANKS)) - {r}:
            st = stats[(r, peer)]
            # 3 chunks from each peer per op: every receive granted once
            assert st["recv_done"] == st["grants_sent"] == 3 * ops, st
            assert st["grants_recv"] == st["writes"] == 3 * ops, st
            assert st["grant_msgs_sent"] == st["grants_sent"], st  # the chunks' steps follow each other
            assert st["pieces"] == st["writes"], st  # 43 KB chunks: one write each
            grant_msgs += st["grant_msgs_sent"] + st["grant_msgs_recv"]
        # each completion is a message received (its last write's immediate), a message sent (its last write
        # acknowledged), or a grant message sent or received: nothing per piece, nothing more
        assert prof["completions"] == prof["messages_received"] + prof["messages_sent"] + grant_msgs, (r, prof)


def three_at_once(piece_count: int):
    """Rank 0 sends 3 messages of ``piece_count`` float32 to rank 1 in one step; rank 1 receives them in one."""
    from traffic.schedule.builder import ScheduleBuilder

    b = ScheduleBuilder(2)
    hs, hr = b.step(0, [], label="send 3"), b.step(1, [], label="receive 3")
    for k in range(3):
        b.transfer(hs, ("input", k * piece_count, piece_count), hr, ("output", k * piece_count, piece_count))
    n = 3 * piece_count
    return b.build(collective="pipeline", algorithm="chain", count=n, dtype="float32",
                   buffers=[{"input": n, "output": 0}, {"input": n, "output": n}], params={})


def test_grants_of_one_step_go_together_and_its_messages_are_in_flight_at_once(fabric, tmp_path):
    res = run_job(fabric, tmp_path / "three", {"protocol": "grant", "piece_bytes": 64 * 1024}, three_at_once(65536),
                  2)
    assert res.verified, res.per_rank
    st = last_stats(res)
    ops = 4
    assert st[(1, 0)]["grants_sent"] == st[(1, 0)]["recv_done"] == 3 * ops, st
    assert st[(1, 0)]["grant_msgs_sent"] == ops, st  # the step's 3 grants in one message
    assert st[(0, 1)]["writes"] == 3 * ops and st[(0, 1)]["pieces"] == 4 * 3 * ops, st  # 256 KiB in 4 pieces
    recv = res.per_rank[1]["transport"]["profile"]
    # the receiver, per op: 3 messages' completions and its grant message's; the 9 unsignalled pieces make none
    assert recv["completions"] == 4 * ops and recv["messages_received"] == 3 * ops, recv


@pytest.mark.parametrize("options", [{"credits": 0}, {}, {"protocol": "grant", "lookahead": 2}],
                         ids=["rendezvous", "eager", "grant-lookahead"])
def test_the_other_protocols_stay_selectable(fabric, tmp_path, options):
    res = run_job(fabric, tmp_path / "other", options, alltoall(), RANKS)
    assert res.verified, res.per_rank
    want = options.get("protocol", "rendezvous" if options else "eager")
    assert {res.per_rank[r]["transport"]["protocol"] for r in range(RANKS)} == {want}
    if "lookahead" in options:  # 3 chunks from each peer per op; ops 1..3 granted ahead and copied out
        for (r, peer), st in last_stats(res).items():
            assert st["grants_ahead"] == st["staged_copied"] == 3 * 3 and st["recv_done"] == 3 * 4, (r, peer, st)


def test_lookahead_keeps_several_messages_per_peer_in_flight_and_verifies(fabric, tmp_path):
    from traffic.collectives import make_schedule

    p2p = make_schedule("pipeline", 2, 1 << 20, chunks=1)
    ops = 4  # the warm-up and 3 measured
    res = run_job(fabric, tmp_path / "ahead", {"protocol": "grant", "lookahead": 3}, p2p, 2)
    assert res.verified, res.per_rank
    # both agents block on their CQ's completion channel (traffic.rxe.completion_channel told its descriptor apart:
    # the lab VM's kernel adds a second event file), not on sleeps between polls
    tr = [res.per_rank[r]["transport"] for r in range(2)]
    assert all(x["completion_channel"] and x["profile"]["wakeups"] > 0 for x in tr), [
        (x["completion_channel"], x["profile"]["wakeups"], x["profile"].get("polls_busy")) for x in tr]
    st = last_stats(res)
    recv, send = st[(1, 0)], st[(0, 1)]
    # the receiver granted ops 1..3 ahead (into staging buffers) with op 0's own receive: 4 grants open at once
    assert recv["grants_ahead"] == ops - 1 and recv["staged_copied"] == ops - 1, recv
    assert recv["grants_sent"] == recv["recv_done"] == ops and recv["max_grants_open"] > 1, recv
    # the sender's sends were done from copies, so its next op wrote while the last one was on the wire
    assert send["writes"] == ops and send["max_msgs_in_flight"] > 1, send
    base = run_job(fabric, tmp_path / "one", {"protocol": "grant"}, p2p, 2)
    assert base.verified, base.per_rank
    st = last_stats(base)
    assert st[(1, 0)]["max_grants_open"] == 1 and st[(1, 0)]["grants_ahead"] == 0, st[(1, 0)]
    assert st[(0, 1)]["max_msgs_in_flight"] == 1, st[(0, 1)]
