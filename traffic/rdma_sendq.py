"""A queue pair's send queue as the RDMA transport (traffic.rdma) fills it: which work requests ask for a completion
and what each completion releases. Pure accounting; no device needed.

ibv_post_send without IBV_SEND_SIGNALED puts no completion on the CQ when the request is done, and on an RC queue
pair a completion says that every earlier request of the same send queue is done too (they complete in order).
perftest signals one request in ``--cq-mod`` (default 100) that way; here a request asks for a completion when its
caller needs one (the last piece of a message: the send request completes then; a control message: its slot is
reused), when ``signal_every`` requests in a row have not, and when it is the one that fills the queue (else no
completion would ever make room). Requests beyond ``depth`` wait in a backlog, posted in order as completions
make room. Each request carries the caller's record (what to release when it is done).
"""

from __future__ import annotations

from collections import deque


class Posted:
    """One send-queue entry: the caller's ``record``, whether it needs its own completion (``must_signal``) and,
    once posted, whether it asked for one (``signaled``)."""

    __slots__ = ("wid", "record", "must_signal", "signaled")

    def __init__(self, wid: int, record, must_signal: bool):
        self.wid = wid
        self.record = record
        self.must_signal = must_signal
        self.signaled = False


class SendQueue:
    """The send queue of one queue pair (``depth`` entries)."""

    __slots__ = ("depth", "signal_every", "posted", "backlog", "run")

    def __init__(self, depth: int, signal_every: int = 16):
        if depth < 1 or signal_every < 1:
            raise ValueError("depth and signal_every must be >= 1")
        self.depth = depth
        self.signal_every = signal_every
        self.posted: deque[Posted] = deque()  # on the queue, oldest first
        self.backlog: deque[Posted] = deque()  # waiting for room
        self.run = 0  # unsignaled requests posted since the last signaled one

    def _admit(self) -> list[Posted]:
        out = []
        while self.backlog and len(self.posted) < self.depth:
            e = self.backlog.popleft()
            e.signaled = e.must_signal or self.run + 1 >= self.signal_every or len(self.posted) + 1 >= self.depth
            self.run = 0 if e.signaled else self.run + 1
            self.posted.append(e)
            out.append(e)
        return out

    def push(self, e: Posted) -> list[Posted]:
        """Queue ``e``; returns the entries to post now (in order, ``signaled`` decided)."""
        self.backlog.append(e)
        return self._admit()

    def completed(self, wid: int) -> tuple[list[Posted], list[Posted]]:
        """The signaled request ``wid`` completed: (the entries it releases, itself last; the entries to post now).
        KeyError if ``wid`` is not a signaled request on the queue."""
        if not any(e.wid == wid and e.signaled for e in self.posted):
            raise KeyError(wid)
        done = []
        while True:
            e = self.posted.popleft()
            done.append(e)
            if e.wid == wid:
                break
        return done, self._admit()

    @property
    def in_flight(self) -> int:
        return len(self.posted)
