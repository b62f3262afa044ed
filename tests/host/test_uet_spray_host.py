"""UET's entropy values spray ONE flow over both spines of a real 2-spine leaf-spine fabric, where kernel TCP's one
flow stays on the one spine its 5-tuple hashes to: `testbed run incast --set senders=1` (h5 on leaf2 -> h1 on
leaf1, 8 rounds of 128 kB at 20 Mbit/s) with transport=uet and with transport=tcp, on the host kernel.

Asserted on the spines' own ports toward the receiver's leaf (spine1:leaf1, spine2:leaf1: the kernel's sent_bytes
counters of their qdiscs, queues.csv): they carry only the flow's data (its ACKs go back through spineX:leaf2).
UET with 64 entropy values (`--set entropy_values=64`: 64 UDP source ports used in turn, packet by packet, so each
carries 1/64 of the data): each spine carries at least 25%. The fabric's L4 hash (fib_multipath_hash_policy=1)
puts each source port on a spine as a fair coin, so a spine gets under 25% when at most 15 of the 64 ports land on
it: 2 x P(Binomial(64, 1/2) <= 15) = 2.4e-5 per run (with the default 16 values it would be 2.1%, at k <= 3).
TCP: one spine carries at least 95% (all of it, by construction of the hash).
Measured (host kernel, shared 2-CPU machine, 3 runs): UET 503 / 605, 592 / 516 and 549 / 559 kB (the smaller
spine's share 45%, 47%, 50%), TCP all 1071 kB on one spine (spine2, spine1, spine2). No timing is asserted. 2.3-2.9 s
for both runs."""

from __future__ import annotations

import os

import pytest

from analysis import summary as asum
from testbed.commands.runner import run_scenario
from testbed.kernel import netns
from testbed.scenario import get

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")

INCAST = get("incast")
SPINE_PORTS = (("spine1", "leaf1"), ("spine2", "leaf1"))


def spine_bytes(tmp_path, transport: str, **extra) -> dict[str, int]:
    """One single-sender incast run; the bytes each spine sent down to the receiver's leaf."""
    p = {x.name: x.default for x in INCAST.params}
    p.update(transport=transport, senders=1, block_bytes=128_000, rounds=8, spines=2, sample_interval_ms=5.0, **extra)
    INCAST.validate(p)
    s = run_scenario(INCAST, p, 1, tmp_path / transport, quiet=True)
    assert s["rounds_n"] == 8, s
    q = asum.load_quietly(tmp_path / transport).queues
    return {f"{n}:{port}": asum.port_backlog(q, n, port)["sent_bytes"] for n, port in SPINE_PORTS}


def test_uet_sprays_one_flow_over_both_spines_and_tcp_keeps_it_on_one(tmp_path):
    before = set(netns.list_ours())
    uet = spine_bytes(tmp_path, "uet", entropy_values=64)
    tcp = spine_bytes(tmp_path, "tcp")
    print("bytes down from each spine to leaf1: uet", uet, "tcp", tcp)
    for got in (uet, tcp):
        assert sum(got.values()) >= 8 * 128_000, got  # the flow's data crossed the spines, all of it counted
    assert min(uet.values()) >= 0.25 * sum(uet.values()), uet
    assert max(tcp.values()) >= 0.95 * sum(tcp.values()), tcp
    assert not set(netns.list_ours()) - before  # nothing left behind
