"""RTOmin sets the incast tail: the same drop-tail incast (8 senders x 16 kB into an 8 kB buffer at 20 Mbit/s,
20 rounds) with the kernel's default rto_min of 200 ms and with 5 ms (per route, locked, as `ip route ... rto_min`).

On the real CPU (the host kernel has HTB and bfifo, all a drop-tail incast needs) RTT jitter is far below
200 ms, so the retransmission timer is rto_min-bound and every round that loses its tail waits for it: measured
p99 251-461 ms (200 ms) vs 94-99 ms (5 ms), p50 234-240 vs 55-66 ms, with 56-93 timeouts per run either way.
"""

from testbed.kernel import doctor
from testbed.commands.runner import run_scenario
from testbed.scenario import get

INCAST = get("incast")


def params(**kw):
    p = {x.name: x.default for x in INCAST.params}
    p.update(topology="dumbbell", senders=8, block_bytes=16_000, rounds=20, buffer_bytes=8_000, host_rate_mbps=20,
             fabric_rate_mbps=40)
    p.update(kw)
    return p


def test_low_rto_min_cuts_the_incast_round_tail(tmp_path):
    missing = doctor.missing(INCAST.needs_of(params()))
    assert not missing, f"this kernel lacks {', '.join(missing)}: the drop-tail incast cannot run here"
    s = {rto: run_scenario(INCAST, params(rto_min_ms=rto), 1, tmp_path / f"rto{rto}", quiet=True) for rto in (200, 5)}
    keys = ("round_ms_p50", "round_ms_p99", "round_ms_ideal", "bottleneck_drops", "tcp_timeouts")
    print({rto: {k: v[k] for k in keys} for rto, v in s.items()})
    for v in s.values():
        assert v["bottleneck_drops"] > 0 and v["tcp_timeouts"] > 0, v  # both runs lose whole tails
    # a round that waits for a timeout waits rto_min: >= 200 ms at the default
    assert s[200]["round_ms_p99"] > 200, s[200]
    # measured p99 251-461 vs 94-99 ms, p50 234-240 vs 55-66 ms
    assert s[200]["round_ms_p99"] > 2 * s[5]["round_ms_p99"], s
    assert s[200]["round_ms_p50"] > 2.5 * s[5]["round_ms_p50"], s
