"""The agents' kernel-TCP transport (traffic.tcp) over loopback in this namespace (no fabric, no root): a rank
that waits while a peer's message sits unread in its socket must sleep, not spin a CPU."""

from __future__ import annotations

import threading
import time

import numpy as np

from traffic.tcp import TcpTransport

#: a progress(0.05) call that waits as asked takes 50 ms: 0.5 s of waiting is about 10 calls. The busy loop this
#: guards against (a paused socket left registered for reading) made every call return at once: over 10 000 calls
#: and a whole CPU in 0.5 s (measured before the fix: 153 641 calls, 0.25 s of CPU in 0.5 s on a 2-CPU machine)
WAIT_S = 0.5
CALLS_MAX = 30
CPU_MAX_S = 0.1


def _pair() -> tuple[TcpTransport, TcpTransport]:
    a, b = TcpTransport(0, "127.0.0.1", cc="reno"), TcpTransport(1, "127.0.0.1", cc="reno")
    addr_a, addr_b = a.listen(), b.listen()
    a.connect({1: addr_b}, timeout_s=10)  # rank 0 connects to rank 1 (the listener backlog accepts it)
    b.connect({0: addr_a}, timeout_s=10)  # rank 1 accepts rank 0
    return a, b


def test_a_message_nobody_awaits_yet_leaves_the_receiver_asleep_and_arrives_once_awaited():
    a, b = _pair()
    stop = threading.Event()
    payload = np.arange(256 << 10, dtype=np.uint8)
    sender = threading.Thread(target=lambda: [a.progress(0.05) for _ in iter(stop.is_set, True)], daemon=True)
    try:
        send = a.post_send(1, 7, memoryview(payload))
        sender.start()
        deadline = time.monotonic() + 5
        while not b.conns[0].paused:  # the header is in, no receive from rank 0 is posted: the payload waits
            assert time.monotonic() < deadline, "the message's header never arrived"
            b.progress(0.05)
        calls, cpu0, t_end = 0, time.process_time(), time.monotonic() + WAIT_S
        while time.monotonic() < t_end:
            b.progress(0.05)
            calls += 1
        cpu_s = time.process_time() - cpu0
        assert calls <= CALLS_MAX and cpu_s <= CPU_MAX_S, (calls, cpu_s)
        # posted now: the socket is read again and the message lands whole
        got = np.zeros_like(payload)
        recv = b.post_recv(0, 7, memoryview(got))
        deadline = time.monotonic() + 5
        while not recv.done:
            assert time.monotonic() < deadline, "the awaited message never completed"
            b.progress(0.05)
        assert np.array_equal(got, payload)
        deadline = time.monotonic() + 5
        while not send.done:
            assert time.monotonic() < deadline, "the send never completed"
            time.sleep(0.01)
    finally:
        stop.set()
        if sender.is_alive():
            sender.join(timeout=2)
        a.close()
        b.close()
