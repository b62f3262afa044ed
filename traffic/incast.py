"""Synchronized incast rounds over kernel TCP: N senders each write one block to one receiver at the same instant.

    inc = IncastRounds(senders, receiver, endpoints, enter, block_bytes=4000, cc="cubic")  # host -> (namespace, ip)
    inc.connect()                     # one persistent connection per sender, sockets made inside each namespace
    rows = inc.run(rounds=10)         # [(round, sender, start_s, end_s, bytes)], the rows of rounds.csv
    inc.close()

A round starts when every sender passes a barrier (each records its own start just before it writes its block) and
ends when the receiver holds all N blocks (the time it read each block's last byte); the next round starts only then.
``enter(ns)`` is a context manager that enters a network namespace (testbed.kernel.netns.entered), so sockets are
created in-process inside the hosts' namespaces. Used by the incast scenario and by ``Lab.burst``.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from typing import Callable, ContextManager, Sequence

from traffic.tcpinfo import set_cc

PORT = 5301
ROUND_TIMEOUT_S = 60.0
ROUNDS_COLUMNS = ["round", "sender", "start_s", "end_s", "bytes"]


class _Receiver(threading.Thread):
    """Reads every connection with a selector; per round, notes when each sender's block is complete."""

    def __init__(self, conns: dict[socket.socket, int], n: int, block: int):
        super().__init__(name="incast-receiver", daemon=True)
        self.conns = conns
        self.n = n
        self.block = block
        self.got = [0] * n
        self.end = [0.0] * n
        self.done_count = 0
        self.round_done = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def arm(self) -> None:
        with self.lock:
            self.got = [0] * self.n
            self.end = [0.0] * self.n
            self.done_count = 0
            self.round_done.clear()

    def _read(self, sock: socket.socket, i: int, view: memoryview) -> bool:
        """One read of sender ``i``'s connection; False at its end of stream."""
        try:
            k = sock.recv_into(view)
        except BlockingIOError:
            return True
        now = time.monotonic()
        if k == 0:
            return False
        with self.lock:
            self.got[i] += k
            if self.got[i] > self.block:
                raise RuntimeError(f"sender {i} sent {self.got[i]} bytes in one round (block {self.block})")
            if self.got[i] == self.block:
                self.end[i] = now
                self.done_count += 1
                if self.done_count == self.n:
                    self.round_done.set()
        return True

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        for c, i in self.conns.items():
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ, i)
        view = memoryview(bytearray(1 << 18))
        try:
            while not self.stopping.is_set():
                for key, _ in sel.select(timeout=0.1):
                    if not self._read(key.fileobj, key.data, view):
                        sel.unregister(key.fileobj)
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            self.error = e
            self.round_done.set()
        finally:
            sel.close()


class IncastRounds:
    """One persistent TCP connection from each of ``senders`` to ``receiver`` (see the module docstring)."""

    def __init__(self, senders: Sequence[str], receiver: str, endpoints: dict[str, tuple[str, str]],
                 enter: Callable[[str], ContextManager], block_bytes: int, port: int = PORT, cc: str | None = None,
                 timeout_s: float = 30.0, cc_by_host: dict[str, str] | None = None):
        if not senders:
            raise ValueError("incast: no senders")
        for h in (receiver, *senders):
            if h not in endpoints:
                raise ValueError(f"incast: unknown host {h!r}")
        if receiver in senders:
            raise ValueError(f"incast: the receiver {receiver} cannot also send")
        self.senders = list(senders)
        self.receiver = receiver
        self.endpoints = endpoints
        self.enter = enter
        self.block = int(block_bytes)
        self.port = port
        self.cc = cc
        self.cc_by_host = dict(cc_by_host or {})  # hosts that use their own congestion control
        self.timeout_s = timeout_s
        self.socks: list[socket.socket] = []  # the senders', in sender order
        self.conns: dict[socket.socket, int] = {}  # the receiver's accepted connections -> sender index
        self._others: list[socket.socket] = []

    def _socket(self, host: str) -> socket.socket:
        with self.enter(self.endpoints[host][0]):
            s = socket.socket()
        self._others.append(s)
        set_cc(s, self.cc_by_host.get(host, self.cc))
        return s

    def connect(self) -> None:
        """Open every connection (the listener's congestion control is inherited by the accepted sockets, so
        DCTCP's ACKs come from DCTCP sockets)."""
        rip = self.endpoints[self.receiver][1]
        n = len(self.senders)
        lsock = self._socket(self.receiver)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((rip, self.port))
        lsock.listen(n + 8)
        for h in self.senders:
            s = self._socket(h)
            s.settimeout(self.timeout_s)
            s.connect((rip, self.port))
            self.socks.append(s)
        ip_of = {self.endpoints[h][1]: i for i, h in enumerate(self.senders)}
        lsock.settimeout(self.timeout_s)
        while len(self.conns) < n:
            c, (addr, _) = lsock.accept()
            self._others.append(c)
            self.conns[c] = ip_of[addr]
        lsock.close()

    def run(self, rounds: int, first_round: int = 0, round_timeout_s: float = ROUND_TIMEOUT_S
            ) -> list[tuple[int, str, float, float, int]]:
        """``rounds`` rounds, back to back; returns one row per (round, sender): the sender's start and the time the
        receiver read its block's last byte (monotonic seconds), numbered from ``first_round``."""
        n = len(self.senders)
        rx = _Receiver(self.conns, n, self.block)
        rx.start()
        barrier = threading.Barrier(n + 1)
        starts = [[0.0] * n for _ in range(rounds)]
        errors: list[BaseException] = []
        payload = bytes(self.block)

        def send(i: int, s: socket.socket) -> None:
            try:
                s.settimeout(None)
                for r in range(rounds):
                    barrier.wait()
                    starts[r][i] = time.monotonic()
                    s.sendall(payload)
            except threading.BrokenBarrierError:
                pass
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=send, args=(i, s), name=f"incast-{self.senders[i]}", daemon=True)
                   for i, s in enumerate(self.socks)]
        for t in threads:
            t.start()
        rows = []
        completed = False
        try:
            for r in range(rounds):
                rx.arm()
                barrier.wait(timeout=round_timeout_s)
                if not rx.round_done.wait(timeout=round_timeout_s):
                    raise RuntimeError(f"round {r} did not finish in {round_timeout_s} s "
                                       f"(received {sum(rx.got)} of {n * self.block} bytes)")
                if rx.error:
                    raise rx.error
                if errors:
                    raise errors[0]
                rows += [(first_round + r, h, starts[r][i], rx.end[i], self.block) for i, h in enumerate(self.senders)]
            completed = True
        finally:
            rx.stopping.set()
            if not completed:
                barrier.abort()
            for t in threads:
                t.join(timeout=10)
            rx.join(timeout=5)
        return rows

    def close(self) -> None:
        for s in self._others:
            try:
                s.close()
            except OSError:
                pass
        self._others.clear()
