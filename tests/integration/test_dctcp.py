"""DCTCP with step marking at K keeps the bottleneck's queue near K; CUBIC over drop-tail fills the buffer."""

import pytest

from testbed.commands.runner import run_scenario
from testbed.scenario import get

DCTCP = get("dctcp")


def run(tmp_path, name, **kw):
    """One run, never repeated: a run that says it was not faithful (fidelity_ok false: the flows carried less than
    80% of the link, or the CPU was saturated) is reported by the test, not replaced by a better one."""
    p = {x.name: x.default for x in DCTCP.params}
    p.update(duration_s=6, warmup_s=2, senders=2, host_rate_mbps=20, buffer_bytes=150_000, k_bytes=30_000, **kw)
    DCTCP.validate(p)
    s = run_scenario(DCTCP, p, 1, tmp_path / name, quiet=True)
    print(f"{name}: queue median {s['queue_median_packets']} p90 {s['queue_p90_packets']} packets, goodput "
          f"{s['goodput_mbps']:.2f} Mbit/s, marks {s['ecn_marks']}, drops {s['bottleneck_drops']}, fidelity_ok "
          f"{s['fidelity_ok']} {s['fidelity_reasons']}")
    return s


def test_dctcp_holds_the_queue_near_k_while_cubic_fills_the_buffer(tmp_path):
    """What each queue discipline did is graded on every run, from the bottleneck qdisc's own counters: DCTCP's
    step marking marks and never drops, CUBIC's drop-tail drops and never marks. Where the queues sat (DCTCP's
    median near K, CUBIC's p90 past half the buffer) and the goodput are graded only on faithful runs: a run whose
    senders could not fill the link (the emulated VM's CPU) did not build the queue the claim is about. Such a run
    is reported as an expected failure carrying the run's own fidelity reasons (visible in the summary, never a
    silent pass, never a re-run); the counter claims above it have been asserted by then. Measured in the lab VM
    (3 runs in one boot, 2026-12-04, machine shared): DCTCP 1741-2665 marks and 0 drops, CUBIC 11-129 drops and 0
    marks in all 3; faithful in 2 of 3 (DCTCP queue median 20 and 20 packets against the band [5, 49.5]; CUBIC
    p90 97 and 97 against 49.5; goodput 18.7-19.0 Mbit/s both). The third run was not faithful on either side
    (13.4 Mbit/s of 20: the host busy with other VMs) and ended as an expected failure, its queues in band anyway
    (median 18, p90 89). Earlier: DCTCP 16.1-17.4 Mbit/s, once 12.6 (fresh-clone CI, flagged unfaithful). Every
    graded number sits several times its spread inside its band: a false failure far rarer than 1 in 100."""
    d = run(tmp_path, "dctcp", cc="dctcp", ecn=True, discipline="step")
    c = run(tmp_path, "cubic", cc="cubic", ecn=False, discipline="droptail")
    k_pk = 30_000 / 1514
    buf_pk = 150_000 / 1514
    # the mechanism, from kernel counters: holds whatever the machine's speed
    assert d["ecn_marks"] > 0 and d["bottleneck_drops"] == 0, d
    assert c["bottleneck_drops"] > 0 and c["ecn_marks"] == 0, c
    spoiled = {n: s["fidelity_reasons"] for n, s in (("dctcp", d), ("cubic", c)) if not s["fidelity_ok"]}
    if spoiled:
        pytest.xfail(f"queue and goodput claims not graded: run not faithful: {spoiled}")
    # ordering, and bands: DCTCP's median within [K/4, 2.5 K]; CUBIC's p90 above half the buffer
    assert d["queue_median_packets"] < c["queue_median_packets"], (d, c)
    assert 0.25 * k_pk <= d["queue_median_packets"] <= 2.5 * k_pk, d
    assert c["queue_p90_packets"] >= 0.5 * buf_pk, c
    # same link, similar throughput
    assert d["goodput_mbps"] > 0.7 * c["goodput_mbps"], (d, c)
