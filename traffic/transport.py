"""The data-plane interface a collective agent talks to: connect to peers, post sends and receives of memory
regions, drive progress, read per-connection transport statistics, close.

The agent (traffic/agent.py) only uses this interface, so a second transport (RDMA verbs over SoftRoCE) can be
added beside the kernel-TCP one (traffic/tcp.py) without touching the DAG walker. The implementations import this
module, never the other way round: the agent picks one by name (``traffic.agent.make_transport``).

Semantics (the same as the schedule model's, docs/schedules.md):

* ``post_send(peer, tag, buf)``: send the bytes of ``buf`` to ``peer`` labelled ``tag``; the request is done when
  the data has left ``buf`` (handed to the transport; the caller may then reuse the memory).
* ``post_recv(peer, tag, buf)``: receive message ``tag`` from ``peer`` into the writable buffer ``buf`` (exactly
  ``len(buf)`` bytes); done when the data is in ``buf``. Tags are unsigned 64-bit and unique per ordered peer
  pair for the connection's lifetime (agents put the op's sequence number in the high 32 bits). A message may
  arrive before its receive is posted: the transport must then hold it (TCP does: eager) or the sender must wait
  for the receive (rendezvous, RDMA); the schedules are deadlock-free under both (``Schedule.validate``).
* ``progress(timeout)``: move data; returns the requests that completed since the last call (waits up to
  ``timeout`` seconds when nothing can move). ``blocked_s`` accumulates the time it spent waiting.
* ``conn_info()``: per-peer transport statistics (for TCP: TCP_INFO fields) as flat dicts of numbers.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any


class TransportError(RuntimeError):
    """The data plane failed: a peer closed its connection, a protocol violation, a timeout."""


@dataclass(eq=False)
class Request:
    """One posted send or receive. ``done`` flips once; ``t_done`` is time.monotonic() at completion."""

    kind: str  # "send" or "recv"
    peer: int
    tag: int
    nbytes: int
    buf: Any = field(repr=False, default=None)
    done: bool = False
    t_done: float = 0.0
    context: Any = field(repr=False, default=None)  # the caller's


class Transport(abc.ABC):
    """A set of connections from one rank to its peers."""

    name = "abstract"

    def __init__(self, rank: int):
        self.rank = rank
        self.blocked_s = 0.0  # time progress() spent waiting with nothing to move

    @abc.abstractmethod
    def listen(self) -> dict:
        """Prepare to accept peers; return this rank's address as JSON-able data for the peers' connect()."""

    @abc.abstractmethod
    def connect(self, peers: dict[int, dict], timeout_s: float) -> None:
        """Open a connection to every rank in ``peers`` ({rank: that rank's listen() result}); returns when all are
        up. Every rank must call it with a symmetric peer set (a in b's peers iff b in a's)."""

    @abc.abstractmethod
    def post_send(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        ...

    @abc.abstractmethod
    def post_recv(self, peer: int, tag: int, buf: memoryview, context: Any = None) -> Request:
        ...

    @abc.abstractmethod
    def progress(self, timeout_s: float) -> list[Request]:
        ...

    @abc.abstractmethod
    def conn_info(self) -> dict[int, dict[str, float]]:
        ...

    @abc.abstractmethod
    def close(self) -> None:
        ...

    def describe(self) -> dict:
        return {"transport": self.name}

