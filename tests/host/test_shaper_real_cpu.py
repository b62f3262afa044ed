"""The shaper's fidelity on the real CPU: the host kernel has HTB and bfifo (all a drop-tail dumbbell needs), so the
shaped single path runs here at 10 and 100 Mbit/s, where no emulated CPU stands between the shaper and its rate.
Counted in bytes as the shaper counts them (HTB root sent_bytes, Ethernet headers included).

The property is the shaper's, so it is asserted where the kernel's counters say the shaper was the limit: over the
intervals that began with more bytes queued in front of the shaper (HTB backlog) than it could send before the next
reading, its queue never ran dry, and what it sent is its rate, however starved the one sender was at other times.
The earlier form took the whole window's ratio and, when that fell short, re-ran up to three times and kept the best
(fresh-clone CI runs measured 0.81 and 0.86 at 100 Mbit/s with timers on time: the sender, on a machine that shares
its CPUs, had not kept the queue full). Over the whole window the shaper must never send more than its rate (the
upper bound holds whatever the CPU does)."""

import socket
import threading
import time

import pytest

from tests.fabricdrive import built, bulk, timer_lateness_ms
from testbed.kernel import doctor, netns
from testbed.kernel.qdiscdump import RawQdiscDump
from topologies import DumbbellSpec, LinkSpec, QueueSpec

SECONDS = 3.0
#: a reading every ~2 ms: at 100 Mbit/s the 100 kB buffer drains in 8 ms, so most intervals can qualify
READ_EVERY_S = 0.002
#: the backlogged intervals must add up to this much time for the ratio over them to be read to ~1%
MIN_BACKLOGGED_S = 0.3


def shaper_readings(rate_mbps: float) -> tuple[list[tuple[float, int, int]], list[int], tuple[float, float]]:
    """One kernel TCP flow h1 -> r1 over a dumbbell whose s1 -> s2 link is shaped to `rate_mbps` (drop-tail 100 kB):
    (time, HTB root backlog_bytes, HTB root sent_bytes) every ~2 ms for SECONDS after 1 s of slow start, the bytes
    received, and how late 1 ms sleeps woke (p50, p95 ms)."""
    topo = DumbbellSpec(senders=1, sender_link=LinkSpec(5 * rate_mbps), bottleneck_link=LinkSpec(rate_mbps),
                        bottleneck_queue=QueueSpec("droptail", buffer_bytes=100_000))
    readings: list[tuple[float, int, int]] = []
    with built(topo) as fab:
        ns = fab.ns("s1")
        with netns.entered(ns):
            idx = socket.if_nametoindex("s2")
        raw = RawQdiscDump(ns)  # a read takes microseconds: its timestamp is the counters'

        def read():
            time.sleep(1.0)  # past slow start
            end = time.monotonic() + SECONDS
            while time.monotonic() < end:
                t = time.monotonic()
                q = raw.root_stats(idx)
                assert q.kind == "htb", q
                readings.append(((t + time.monotonic()) / 2, q.backlog_bytes, q.sent_bytes))
                time.sleep(READ_EVERY_S)

        m = threading.Thread(target=read)
        m.start()
        got = bulk(fab, [("h1", "r1")], SECONDS + 1.5)
        m.join()
        raw.close()
        late = timer_lateness_ms()
    return readings, got, late


def backlogged_ratio(readings: list[tuple[float, int, int]], rate_mbps: float) -> tuple[float, float]:
    """Sent over the configured rate, summed over the intervals whose starting backlog alone would keep the shaper
    busy to the interval's end (backlog_bytes >= rate x interval), and the total time of those intervals."""
    rate_bps = rate_mbps * 1e6
    sent = secs = 0.0
    for (t0, backlog0, sent0), (t1, _, sent1) in zip(readings, readings[1:]):
        if backlog0 * 8 >= rate_bps * (t1 - t0):
            sent += (sent1 - sent0) * 8
            secs += t1 - t0
    return (sent / secs / rate_bps if secs else float("nan")), secs


@pytest.mark.parametrize("rate", [10.0, 100.0])
def test_shaped_path_holds_the_rate_on_the_real_cpu(rate):
    """Measured (host kernel, 2-CPU machine shared with other developers' runs, 3 passes): over the backlogged
    intervals 0.997-1.000 of the rate at 10 Mbit/s and 0.998-1.000 at 100 Mbit/s, backlogged 2.91-3.00 s of the
    3 s; whole windows 0.992-1.000. The bands (0.95-1.02, at least 0.3 s backlogged) are the shaper's own (HTB's
    rate tables, a packet's rounding per ~2 ms reading), not the CPU's: a run whose sender starves no longer fails
    it, and one shaper that misses its rate fails every run."""
    missing = doctor.missing(["qdisc:htb", "qdisc:bfifo"])
    assert not missing, f"this kernel lacks {', '.join(missing)}: the shaped path cannot be built here"
    readings, got, late = shaper_readings(rate)
    (t0, _, s0), (t1, _, s1) = readings[0], readings[-1]
    whole = (s1 - s0) * 8 / (t1 - t0) / (rate * 1e6)
    busy, busy_s = backlogged_ratio(readings, rate)
    why = (f"{rate} Mbit/s: whole window {whole:.3f} of the rate, backlogged intervals {busy:.3f} over {busy_s:.2f} s "
           f"of {t1 - t0:.2f} s ({len(readings)} readings); received {got[0]} B; 1 ms sleeps woke late by "
           f"p50 {late[0]:.2f} / p95 {late[1]:.2f} ms")
    print(why)
    assert whole <= 1.02, why  # never more than the rate, whatever the CPU does
    # the one sender kept the queue full for part of the window (it takes a fraction of one CPU at these rates)
    assert busy_s >= MIN_BACKLOGGED_S, why
    assert 0.95 <= busy <= 1.02, why
