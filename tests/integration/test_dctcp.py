"""DCTCP with step marking at K keeps the bottleneck's queue near K; CUBIC over drop-tail fills the buffer. The runs
are lab 03's (labs/03-dctcp-queue: 2 senders at 10 Mbit/s, 40 ms, a 150 kB buffer, K = 30 kB; DCTCP, ECN-Reno and
CUBIC), made once by the lab driver and graded as the lab too: one set of runs serves both (CI's time budget: this
test made two runs of its own, 28 s in the VM, beside the lab's three)."""


import pytest

from tests.labdrive import assert_complete_once, runs_once


def test_dctcp_holds_the_queue_near_k_while_cubic_fills_the_buffer(tmp_path):
    """What each queue discipline did is graded on every run, from the bottleneck qdisc's own counters: DCTCP's
    step marking marks, CUBIC's drop-tail drops and never marks (lab 03's INSTRUCTOR.md, 16-20 runs a side: DCTCP
    722-1012 marks). That DCTCP drops fewer packets than CUBIC (DCTCP 0-15 a run, all in slow start's first second;
    CUBIC 24-55), where the queues sat (DCTCP's median near K, CUBIC's p90 past half the buffer) and the goodput are
    graded only on faithful runs: a run whose senders could not fill the link (the emulated VM's CPU) did not build
    the queue the claim is about. Such a run is reported as an expected failure carrying the run's own
    fidelity reasons (visible in the summary, never a silent pass, never a re-run); the counter claims above it have
    been asserted by then. Measured (the lab's 16 faithful runs): DCTCP's queue median 16-18 packets against the band
    [5, 49.5], CUBIC's p90 88-98 against 49.5, goodput ratio 0.95-0.99 against 0.7: every graded number sits several
    times its spread inside its band."""
    out = tmp_path / "lab"
    lab, runs = runs_once("03", out)
    assert_complete_once(lab, out)  # the lab as `testbed lab run 3 --repeat 1` grades it (and a failed run: which)
    s = {name: summary for name, (summary, _) in runs.items()}
    for name, x in s.items():
        print(f"{name}: queue median {x['queue_median_packets']} p90 {x['queue_p90_packets']} packets, goodput "
              f"{x['goodput_mbps']:.2f} Mbit/s, marks {x['ecn_marks']}, drops {x['bottleneck_drops']}, fidelity_ok "
              f"{x['fidelity_ok']} {x['fidelity_reasons']}")
    d, c = s["dctcp"], s["cubic"]
    k_pk = 30_000 / 1514
    buf_pk = 150_000 / 1514
    # the mechanism, from kernel counters: holds whatever the machine's speed
    assert d["ecn_marks"] > 0 and s["ecn-reno"]["ecn_marks"] > 0, (d, s["ecn-reno"])
    assert c["bottleneck_drops"] > 0 and c["ecn_marks"] == 0, c
    spoiled = {n: x["fidelity_reasons"] for n, x in (("dctcp", d), ("cubic", c)) if not x["fidelity_ok"]}
    if spoiled:
        pytest.xfail(f"drop, queue and goodput claims not graded: run not faithful: {spoiled}")
    assert d["bottleneck_drops"] < c["bottleneck_drops"], (d, c)  # slow start's overshoot, when any, is smaller
    # ordering, and bands: DCTCP's median within [K/4, 2.5 K]; CUBIC's p90 above half the buffer
    assert d["queue_median_packets"] < c["queue_median_packets"], (d, c)
    assert 0.25 * k_pk <= d["queue_median_packets"] <= 2.5 * k_pk, d
    assert c["queue_p90_packets"] >= 0.5 * buf_pk, c
    # same link, similar throughput
    assert d["goodput_mbps"] > 0.7 * c["goodput_mbps"], (d, c)
