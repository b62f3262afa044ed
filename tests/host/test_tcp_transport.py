"""The agents' kernel-TCP transport (traffic.tcp) over loopback in this namespace (no fabric, no root): a rank
that waits while a peer's message sits unread in its socket must sleep, not spin a CPU; the connection mesh
(traffic.tcp_connect) opens one connection per pair and refuses a connection whose hello is not a waited-for
rank's."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from traffic.tcp import TcpTransport
from traffic.tcp_connect import HELLO, MAGIC
from traffic.transport import TransportError

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


def test_three_ranks_connect_each_pair_once_with_the_congestion_control_asked():
    ts = [TcpTransport(r, "127.0.0.1", cc="reno") for r in range(3)]
    try:
        addrs = {r: t.listen() for r, t in enumerate(ts)}
        for r, t in enumerate(ts):  # in rank order: a higher rank's listener backlog holds the lower ranks' dials
            t.connect({p: a for p, a in addrs.items() if p != r}, timeout_s=10)
        for r, t in enumerate(ts):
            assert sorted(t.conns) == [p for p in range(3) if p != r]
            assert t.describe()["cc"] == ["reno"] and t.listener is None
            ends = {c.sock.getpeername() for c in t.conns.values()}
            assert len(ends) == 2  # two distinct connections, not one reused
    finally:
        for t in ts:
            t.close()


@pytest.mark.parametrize("hello, says", [
    (HELLO.pack(b"XXXX", 0), "unexpected hello"),  # not an agent
    (HELLO.pack(MAGIC, 5), "unexpected hello"),  # an agent, but not the rank waited for
    (b"", "accepting peers [0]: timed out"),  # nobody dials
])
def test_a_connection_that_is_not_a_waited_for_rank_is_refused(hello, says):
    t = TcpTransport(1, "127.0.0.1")
    addr = t.listen()
    stranger = socket.create_connection((addr["ip"], addr["port"])) if hello else None
    try:
        if stranger is not None:
            stranger.sendall(hello)
        with pytest.raises(TransportError) as e:
            t.connect({0: {"ip": "127.0.0.1", "port": 1}}, timeout_s=0.5)
        assert says in str(e.value) and "\n" not in str(e.value)
        assert not t.conns
    finally:
        if stranger is not None:
            stranger.close()
        t.close()
