"""Receive look-ahead for the RDMA transport's grant protocol (traffic.rdma_grant, ``lookahead`` K > 0): the
receiver grants the receives of its next K ops ahead of time, each into a registered staging buffer of its own, so
the sender can have several messages per peer in flight, as perftest's ib_write_bw keeps writes queued into a
buffer it never reads. Pure accounting; no device needed (``register`` is the transport's).

Why staging buffers: the agent reuses one set of numpy buffers for every execution of an op and zeroes its output
when the op starts, so the next op's data cannot be written into its real destination while this op still uses
it (double buffering, as a GPU collective library keeps a second buffer per channel). The op, when it posts the
receive, takes the data from its staging buffer: at once if it has landed, else when its write's immediate comes.

* :class:`BufferPool`: the transport's own registered buffers, reused by size (registered once: ibv_reg_mr under
  emulation costs far more than a message's posting). The receiver's staging buffers and, on the sender, the copies
  that let a send be done at once (as TCP's is once in the socket buffer) come from it.
* :class:`StagedReceives`: the receives granted ahead, by (peer, tag) (tags carry the op's sequence number, so the
  receiver knows its next ops' tags: traffic.agent announces them), until their op posts them and the data is in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class BufferPool:
    """Registered byte buffers (numpy array, MR) of the transport's own, reused by size."""

    def __init__(self, register: Callable[[np.ndarray], Any]):
        self.register = register
        self.free: dict[int, list[tuple[np.ndarray, Any]]] = {}
        self.mrs: list = []  # every region registered (closed with the transport)

    def take(self, nbytes: int) -> tuple[np.ndarray, Any]:
        """A free buffer of exactly ``nbytes`` (registered the first time that many are in use at once)."""
        q = self.free.get(nbytes)
        if q:
            return q.pop()
        arr = np.empty(max(nbytes, 1), dtype=np.uint8)[:nbytes]
        mr = self.register(arr)
        self.mrs.append(mr)
        return arr, mr

    def give(self, buf: tuple[np.ndarray, Any]) -> None:
        self.free.setdefault(len(buf[0]), []).append(buf)

    @property
    def allocated(self) -> int:
        return len(self.mrs)


class Staged:
    """One receive granted ahead: its (peer, tag, length), the staging buffer the data lands in, whether it has
    landed, and the op's receive once posted."""

    __slots__ = ("peer", "tag", "nbytes", "buf", "landed", "req")

    def __init__(self, peer: int, tag: int, nbytes: int, buf):
        self.peer, self.tag, self.nbytes, self.buf = peer, tag, nbytes, buf
        self.landed = False
        self.req: Any = None


class StagedReceives:
    """The receiver's receives granted ahead of their op, by (peer, tag)."""

    __slots__ = ("by_key",)

    def __init__(self):
        self.by_key: dict[tuple[int, int], Staged] = {}

    def stage(self, peer: int, tag: int, nbytes: int, buf) -> Staged:
        """A receive of ``nbytes`` from ``peer`` announced ahead; ValueError if that tag is staged already."""
        if (peer, tag) in self.by_key:
            raise ValueError(f"receive from rank {peer} tag {tag} announced twice")
        s = self.by_key[(peer, tag)] = Staged(peer, tag, nbytes, buf)
        return s

    def claim(self, peer: int, tag: int, req) -> Staged | None:
        """The op posts receive ``req`` (``nbytes``): its staged receive (now attached; forgotten if its data has
        landed: the caller copies it out), or None if it was not announced. ValueError if the lengths differ."""
        s = self.by_key.get((peer, tag))
        if s is None:
            return None
        if s.nbytes != req.nbytes:
            raise ValueError(f"receive from rank {peer} tag {tag} has {req.nbytes} bytes, announced {s.nbytes}")
        s.req = req
        if s.landed:
            del self.by_key[(peer, tag)]
        return s

    def land(self, s: Staged) -> bool:
        """``s``'s data is in its staging buffer: True if its receive is posted (the caller copies it out now)."""
        s.landed = True
        if s.req is None:
            return False
        del self.by_key[(s.peer, s.tag)]
        return True

    def __len__(self) -> int:
        return len(self.by_key)
