"""Synchronized incast rounds over the UET transport (traffic.uet): N senders each send one block to one receiver
at the same instant, the UET counterpart of traffic.incast.IncastRounds (kernel TCP).

    inc = UetIncastRounds(senders, receiver, endpoints, enter, block_bytes=32_000, uet={"rto_min_ms": 50})
    inc.connect()                     # one UetTransport per host, its sockets made inside the host's namespace
    rows = inc.run(rounds=10)         # [(round, sender, start_s, end_s, bytes)], as IncastRounds returns
    totals = inc.totals()             # every transport's counters summed: RTOs, NACKs, retransmissions, ...
    inc.close()

One thread per host, each driving its own transport (at the lab's rates a packet costs tens of microseconds of
Python, so the threads share the interpreter without becoming the bottleneck). A round starts when the receiver has
posted its N receives; every sender then sends its block and progresses until it is acknowledged; the round ends
when the receiver has all N blocks and every sender's send is complete. The receiver keeps answering (progress)
until then, so a sender whose last ACK was lost gets its retransmission answered. Each block's bytes are drawn from
(round, sender) and compared on arrival: ``mismatches`` counts blocks that arrived different."""

from __future__ import annotations

import threading
import time
from typing import Callable, ContextManager, Sequence

import numpy as np

from traffic.uet import UetTransport

ROUND_TIMEOUT_S = 60.0


def block(round_: int, sender: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(round_ * 1000 + sender).integers(0, 256, nbytes, dtype=np.uint8)


class UetIncastRounds:
    def __init__(self, senders: Sequence[str], receiver: str, endpoints: dict[str, tuple[str, str]],
                 enter: Callable[[str], ContextManager], block_bytes: int, uet: dict | None = None):
        if not senders:
            raise ValueError("incast: no senders")
        if receiver in senders:
            raise ValueError(f"incast: the receiver {receiver} cannot also send")
        for h in (receiver, *senders):
            if h not in endpoints:
                raise ValueError(f"incast: unknown host {h!r}")
        self.senders = list(senders)
        self.receiver = receiver
        self.endpoints = endpoints
        self.enter = enter
        self.block = int(block_bytes)
        self.opts = dict(uet or {})
        self.rx: UetTransport | None = None
        self.tx: list[UetTransport] = []
        self.mismatches = 0

    def connect(self) -> None:
        """Rank 0 is the receiver, ranks 1..N the senders."""
        n = len(self.senders)
        ns, ip = self.endpoints[self.receiver]
        self.rx = UetTransport(0, ip, **self.opts)
        with self.enter(ns):
            addr_rx = self.rx.listen()
        addrs = {}
        for i, h in enumerate(self.senders, 1):
            ns, ip = self.endpoints[h]
            t = UetTransport(i, ip, **self.opts)
            self.tx.append(t)
            with self.enter(ns):
                addrs[i] = t.listen()
        self.rx.connect(addrs)
        for t in self.tx:
            t.connect({0: addr_rx})
        assert len(self.tx) == n

    def run(self, rounds: int, first_round: int = 0, round_timeout_s: float = ROUND_TIMEOUT_S
            ) -> list[tuple[int, str, float, float, int]]:
        n = len(self.senders)
        go = [threading.Event() for _ in range(rounds)]
        sent = [[False] * n for _ in range(rounds)]
        starts = [[0.0] * n for _ in range(rounds)]
        errors: list[BaseException] = []
        stop = threading.Event()

        def sender(i: int, t: UetTransport) -> None:
            try:
                for r in range(rounds):
                    while not go[r].wait(0.005):
                        if stop.is_set():
                            return
                        t.progress(0)
                    starts[r][i] = time.monotonic()
                    req = t.post_send(0, first_round + r, memoryview(block(first_round + r, i + 1, self.block)))
                    while not req.done:
                        if stop.is_set():
                            return
                        t.progress(0.005)
                    sent[r][i] = True
            except BaseException as e:  # noqa: BLE001 - reported by run()
                errors.append(e)

        threads = [threading.Thread(target=sender, args=(i, t), name=f"uet-incast-{self.senders[i]}", daemon=True)
                   for i, t in enumerate(self.tx)]
        for th in threads:
            th.start()
        rows = []
        try:
            for r in range(rounds):
                rows += self._round(r, first_round, go[r], sent[r], starts[r], errors, round_timeout_s)
        finally:
            stop.set()
            for th in threads:
                th.join(timeout=10)
        return rows

    def _round(self, r: int, first_round: int, go: threading.Event, sent: list[bool], starts: list[float],
               errors: list, round_timeout_s: float) -> list[tuple[int, str, float, float, int]]:
        rx = self.rx
        bufs = [np.zeros(self.block, dtype=np.uint8) for _ in self.senders]
        reqs = [rx.post_recv(i, first_round + r, memoryview(b)) for i, b in enumerate(bufs, 1)]
        end = [0.0] * len(self.senders)
        go.set()
        deadline = time.monotonic() + round_timeout_s
        while not (all(q.done for q in reqs) and all(sent)):
            if errors:
                raise errors[0]
            if time.monotonic() > deadline:
                got = sum(q.done for q in reqs)
                raise RuntimeError(f"round {r} did not finish in {round_timeout_s} s ({got} of {len(reqs)} blocks)")
            for q in rx.progress(0.005):
                end[q.peer - 1] = q.t_done
        for i, b in enumerate(bufs):
            if not np.array_equal(b, block(first_round + r, i + 1, self.block)):
                self.mismatches += 1
        return [(first_round + r, h, starts[i], end[i], self.block) for i, h in enumerate(self.senders)]

    def totals(self) -> dict[str, dict[str, int]]:
        """{"senders": counters summed over the senders, "receiver": the receiver's}."""
        s: dict[str, int] = {}
        for t in self.tx:
            for k, v in t.totals().items():
                s[k] = s.get(k, 0) + v
        return {"senders": s, "receiver": self.rx.totals() if self.rx else {}}

    def per_host(self) -> dict[str, dict[str, int]]:
        """Each host's transport counters (UetTransport.totals()): the receiver's and every sender's."""
        out = {self.receiver: self.rx.totals()} if self.rx else {}
        return out | {h: t.totals() for h, t in zip(self.senders, self.tx)}

    def close(self) -> None:
        for t in (*self.tx, *([self.rx] if self.rx else [])):
            t.close()
        self.tx.clear()
        self.rx = None


__all__ = ["UetIncastRounds", "block"]
