"""The clock echo and prober (testbed.measure.clockprobe) over loopback UDP in this namespace: both ends stamp the
same CLOCK_MONOTONIC, so the true offset is 0 and the estimate's bound must contain it; the stamps' order (t1 first
after the read, t2 last before the reply) is what makes that hold under load. No root, no namespaces."""

from __future__ import annotations

import socket
import threading

from analysis.clockoffset import estimate
from testbed.measure import clockprobe


def test_one_clock_is_its_own_reference_within_the_bound():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    answered: list[int] = []
    echo = threading.Thread(target=lambda: answered.append(clockprobe.serve(sock, idle_s=10)), daemon=True)
    echo.start()
    try:
        assert clockprobe.wait_ready("127.0.0.1", port, within_s=5) < 5
        ex = clockprobe.probe("127.0.0.1", port, count=100, interval_s=0.002)
    finally:
        clockprobe.stop("127.0.0.1", port)
        echo.join(5)
        sock.close()
    assert not echo.is_alive() and answered == [101]   # the readiness ping + 100, then STOP ended it
    assert len(ex) >= 95, len(ex)                      # loopback loses nothing; a reply later than 0.5 s is dropped
    est = estimate(ex)
    assert abs(est.offset_s) <= est.uncertainty_s, est
    # loopback round trips through Python are tens of microseconds; 2 ms would mean the stamps are in the wrong place
    assert est.uncertainty_s < 2e-3 and est.delay_min_s >= 0, est
