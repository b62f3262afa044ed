"""The RDMA transport's completion queue (traffic.rdma): one CQ for every queue pair's sends and receives, polled in
batches, and waited on without spinning.

* ``poll(handle)``: ibv_poll_cq for up to :data:`BATCH` completions at a time until the CQ is empty, each handed
  to ``handle``; returns how many.
* ``wait(left_s)``: block until the CQ may have a completion: select() on the CQ's completion channel armed by
  ibv_req_notify_cq (polled once more after arming: a completion may have come in between), or, when the
  channel's descriptor cannot be found (traffic.rxe.completion_channel), short sleeps of 0.2..2 ms. Agents share
  the CPUs with rxe's kernel threads: a busy poll (as perftest's client does) would take the CPU rxe needs.
  ``spin_s`` > 0: poll that long first (a wakeup through the channel costs a select(), a read of the event and a
  re-arm; under emulation that is a gap on every message's path).
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable

from traffic.rxe import completion_channel

BATCH = 64
CQ_ENTRIES = 4096
_SLEEP_MIN_S, _SLEEP_MAX_S = 0.0002, 0.002


class CompletionQueue:
    """The CQ of device context ``ctx`` (``v``: traffic.rxe.verbs()) with its completion channel."""

    def __init__(self, v: dict, ctx, spin_s: float = 0.0):
        self.spin_s = spin_s
        self.channel, self.fd = completion_channel(v, ctx)
        self.cq = v["CQ"](ctx, CQ_ENTRIES, None, self.channel, 0)
        self.armed = False
        self.sleep_s = _SLEEP_MIN_S
        self.wakeups = 0  # select() returned with an event
        self.busy_polls = 0  # polls that found completions
        self.completions = 0  # handed to a handler, whether found by a poll, a spin or while arming

    def poll(self, handle: Callable) -> int:
        total = 0
        while True:
            n, wcs = self.cq.poll(num_entries=BATCH)
            if n <= 0:
                break
            total += n
            for wc in wcs[:n]:
                handle(wc)
        if total:
            self.completions += total
            self.busy_polls += 1
            self.sleep_s = _SLEEP_MIN_S
        return total

    def wait(self, left_s: float, handle: Callable) -> None:
        """Block up to ``left_s`` for a completion (completions found while spinning or arming go to ``handle``)."""
        if self.spin_s > 0:
            end = time.monotonic() + min(self.spin_s, left_s)
            while time.monotonic() < end:
                if self.poll(handle):
                    return
            left_s = max(0.0, left_s - self.spin_s)
        if self.fd is None:
            time.sleep(min(self.sleep_s, left_s))
            self.sleep_s = min(self.sleep_s * 2, _SLEEP_MAX_S)
            return
        if not self.armed:
            self.cq.req_notify()
            self.armed = True
            if self.poll(handle):
                return
        if select.select([self.fd], [], [], left_s)[0]:
            self.channel.get_cq_event(self.cq)
            self.cq.ack_events(1)
            self.armed = False
            self.wakeups += 1

    def objects(self) -> list:
        """The verbs objects to close (the CQ before its channel)."""
        return [self.cq, self.channel]
