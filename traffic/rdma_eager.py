"""The RDMA transport's eager data path (traffic.rdma, ``credits`` > 0): messages written at once into the peer's
receive ring, as many pieces in flight as the peer gave credits for (the accounting: traffic.rdma_credits).

Sender: a send is cut into pieces of at most the peer's slot size; while it holds a credit (a free slot of the
peer's ring) and a control slot for the 64-byte header, each piece goes as one RDMA WRITE WITH IMMEDIATE of two
scatter elements (header; payload read in place from the registered send buffer) to the slot's address, the
immediate naming the slot. A message whose pieces all fit in free registered send buffers (as many as the ring
has slots, at least 4) is copied into them and its send is done at once, so the next one is posted while it is on
the wire; otherwise the payload is read in place, only the last piece asks for a completion, and when it comes
every piece has been acknowledged (RC completes in order) and the send is done. Credit messages from the peer give
slots back and release the pieces that waited for them.

Receiver: each piece's write consumes a pre-posted receive and completes with its immediate; the header says which
message (tag), where in it and how long. If the receive is posted the piece is copied into its buffer at once and
the slot freed; if not, it waits in its slot (more than half of the ring held: the oldest copied out). Freed slots
go back to the sender in batches, one SEND of a bitmap.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from traffic.rdma_connect import QpInfo
from traffic.rdma_credits import (CREDIT, CREDIT_MAGIC, HDR, HDR_BYTES, HDR_MAGIC, MIN_AUTO_SLOTS, RecvRing,
                                  SendWindow, auto_slots, chunks)
from traffic.transport import Request, TransportError

K_PIECE = 4  # the work-request kind of a piece (traffic.rdma numbers the others)
MIN_BOUNCE_SLOTS = 4  # registered send buffers per peer, slot-sized: as many as the ring has slots, at least this


class EagerPeer:
    """One connection's eager state: our ring for the peer's pieces, and our credits and waiting pieces towards it."""

    __slots__ = ("arr", "mr", "ring", "stride", "window", "r_addr", "r_rkey", "r_stride", "r_slot_bytes",
                 "pending", "owed", "stall_t0", "bounce", "bounce_mr", "bounce_free")

    def __init__(self, arr: np.ndarray, mr, slots: int, slot_bytes: int, bounce: np.ndarray, bounce_mr):
        self.arr, self.mr = arr, mr
        self.bounce, self.bounce_mr = bounce, bounce_mr  # send buffers of slot_bytes
        self.bounce_free = list(range(bounce.nbytes // slot_bytes))
        self.ring = RecvRing(slots)
        self.stride = HDR_BYTES + slot_bytes
        self.window: SendWindow | None = None
        self.r_addr = self.r_rkey = self.r_stride = self.r_slot_bytes = 0
        self.pending: deque = deque()  # (req, lkey, address, offset, length, last, bounce slot) waiting for a credit
        self.owed = 0  # freed slots not reported yet (no control slot was free)
        self.stall_t0 = 0.0  # when pieces began waiting for credits (0: not waiting)


class Eager:
    """The eager protocol of transport ``t`` (a traffic.rdma.RdmaTransport: its control slots, send queues,
    registered buffers, completed-request list and profile)."""

    def __init__(self, t, slots: int | None, slot_bytes: int):
        self.t, self.slots, self.slot_bytes = t, slots, slot_bytes  # slots None: auto_slots, fitted in fit()
        self.recvs: dict[tuple[int, int], list] = {}  # (peer, tag) -> [request, bytes landed, destination array]
        self.early: dict[tuple[int, int], list] = {}  # pieces that came before their receive

    # ---- setup ----

    def fit(self, peers: int) -> None:
        """The ring's slots per peer, unless ``credits`` was given: fewer as the rank has more peers (memory)."""
        if self.slots is None:   # a write and about one credit message per slot must find a posted receive
            self.slots = max(MIN_AUTO_SLOTS, min(auto_slots(peers), (int(self.t.recv_depth) - 2) // 2))
        self.t.credits = self.slots

    def setup(self, p) -> tuple[int, int, int, int]:
        """Register the ring for peer ``p``; (address, rkey, slots, slot bytes) to tell the peer."""
        arr = np.zeros(self.slots * (HDR_BYTES + self.slot_bytes), dtype=np.uint8)
        bounce = np.zeros(max(MIN_BOUNCE_SLOTS, self.slots) * self.slot_bytes, dtype=np.uint8)
        p.eager = EagerPeer(arr, self.t.mr(arr.nbytes, address=arr.ctypes.data), self.slots, self.slot_bytes,
                            bounce, self.t.mr(bounce.nbytes, address=bounce.ctypes.data))
        return arr.ctypes.data, p.eager.mr.rkey, self.slots, self.slot_bytes

    @staticmethod
    def connected(p, theirs: QpInfo) -> None:
        ep = p.eager
        ep.window = SendWindow(theirs.slots)
        ep.r_addr, ep.r_rkey, ep.r_slot_bytes = theirs.ring_addr, theirs.ring_rkey, theirs.slot_bytes
        ep.r_stride = HDR_BYTES + theirs.slot_bytes

    # ---- sending ----

    def post_send(self, p, req: Request) -> None:
        """If enough registered send buffers are free for all its pieces, the message is copied into them and done
        at once (as a TCP send is once in the socket buffer): the sender's next message is posted while this one
        is still on the wire, as perftest keeps writes queued. Else it is written in place and done when its last
        piece is acknowledged."""
        ep = p.eager
        plan = chunks(req.nbytes, ep.r_slot_bytes)
        if req.nbytes and ep.r_slot_bytes <= self.slot_bytes and len(plan) <= len(ep.bounce_free):
            src = np.frombuffer(req.buf, dtype=np.uint8)
            c0 = time.perf_counter()
            for k, (off, n) in enumerate(plan):
                b = ep.bounce_free.pop()
                a0 = b * self.slot_bytes
                ep.bounce[a0:a0 + n] = src[off:off + n]
                # the piece is read at address + offset: the buffer's start
                ep.pending.append((req, ep.bounce_mr.lkey, ep.bounce.ctypes.data + a0 - off, off, n,
                                   k == len(plan) - 1, b))
            self.t.prof["copy_s"] += time.perf_counter() - c0
            self.t.send_done(p, req)
            self.pump(p)
            return
        lkey, addr = 0, 0
        if req.nbytes:
            mr, addr = self.t.region(req.buf)
            lkey = mr.lkey
        for k, (off, n) in enumerate(plan):
            ep.pending.append((req, lkey, addr, off, n, k == len(plan) - 1, -1))
        self.pump(p)

    def pump(self, p) -> None:
        """Write the waiting pieces to ``p`` while we hold credits (and control slots for their headers)."""
        ep, t = p.eager, self.t
        while ep.pending and ep.window.free and len(p.free_ctl) > t.CTL_RESERVE:
            req, lkey, addr, off, n, last, bounce = ep.pending.popleft()
            slot = ep.window.take()
            h = p.free_ctl.pop()
            p.ctl_send.write(HDR.pack(req.tag, req.nbytes, off, n, HDR_MAGIC), HDR.size, h * t.CTL_SLOT)
            p.stats["pieces"] += 1
            # record: kind, the send it completes (last piece, unless bounced: done already), its control slot,
            # then how to build it, and the send buffer it frees
            t.push(p, (K_PIECE, req if last and bounce < 0 else None, h, slot, lkey, addr + off, n, bounce), last)
        if ep.pending and not ep.window.free and not ep.stall_t0:
            ep.stall_t0 = time.monotonic()
        if ep.owed:
            self._report(p)

    def build_wr(self, p, record: tuple, wr_id: int, flags: int):
        v = self.t.v
        _, _, h, slot, lkey, addr, n, _ = record
        sges = [v["SGE"](p.ctl_send.buf + h * self.t.CTL_SLOT, HDR_BYTES, p.ctl_send.lkey)]
        if n:
            sges.append(v["SGE"](addr, n, lkey))
        wr = v["SendWR"](wr_id=wr_id, opcode=v["e"].IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=len(sges), sg=sges,
                         imm_data=slot, send_flags=flags)
        wr.set_wr_rdma(p.eager.r_rkey, p.eager.r_addr + slot * p.eager.r_stride)
        return wr

    @staticmethod
    def released(p, record: tuple) -> None:
        """A piece's write is done: its send buffer, if it was copied into one, is free again."""
        if record[7] >= 0:
            p.eager.bounce_free.append(record[7])

    def on_message(self, p, i: int) -> None:
        """A SEND from ``p`` in its control slot ``i``: a credit message."""
        magic, _, bitmap = CREDIT.unpack(p.ctl_recv.read(CREDIT.size, i * self.t.CTL_SLOT))
        if magic != CREDIT_MAGIC:
            raise TransportError(f"rank {self.t.rank}: unexpected control message from rank {p.rank}")
        try:
            p.eager.window.give(bitmap)
        except ValueError as exc:
            raise TransportError(f"rank {self.t.rank}: rank {p.rank}: {exc}") from None
        p.stats["credit_msgs_recv"] += 1
        if p.eager.stall_t0:
            self.t.prof["credit_wait_s"] += time.monotonic() - p.eager.stall_t0
            p.eager.stall_t0 = 0.0
        self.pump(p)

    # ---- receiving ----

    def post_recv(self, p, req: Request) -> None:
        key = (p.rank, req.tag)
        if key in self.recvs:
            raise TransportError(f"rank {self.t.rank}: receive from {p.rank} tag {req.tag} posted twice")
        posted = self.recvs[key] = [req, 0, np.frombuffer(req.buf, dtype=np.uint8) if req.nbytes else None]
        for rec in self.early.pop(key, []):
            if rec[1] is not None:
                p.eager.ring.release(rec)
            self._land(key, posted, rec)

    def on_write(self, p, slot: int) -> None:
        """A piece from ``p`` landed in our ring's slot ``slot`` (the write's immediate)."""
        ep = p.eager
        if slot >= ep.ring.slots:  # a binding that byte-swaps the immediate on one side only
            slot = int.from_bytes(int(slot).to_bytes(4, "little"), "big")
        tag, total, off, n, magic = HDR.unpack_from(ep.arr, slot * ep.stride) if slot < ep.ring.slots else (0,) * 5
        if magic != HDR_MAGIC or n > self.slot_bytes or off + n > total:
            raise TransportError(f"rank {self.t.rank}: bad piece from rank {p.rank} (slot {slot})")
        rec = [p, slot, None, off, n, total]  # peer, ring slot (None: copied out), the copy, offset, length, total
        key = (p.rank, tag)
        posted = self.recvs.get(key)
        if posted is not None:
            self._land(key, posted, rec)
            return
        self.early.setdefault(key, []).append(rec)
        for old in ep.ring.hold(rec):  # more than half of the ring held: copy the oldest out, free its slot
            c0 = time.perf_counter()
            s0 = old[1] * ep.stride + HDR_BYTES
            old[2] = ep.arr[s0:s0 + old[4]].copy()
            self.t.prof["copy_s"] += time.perf_counter() - c0
            p.stats["held_copied_out"] += 1
            slot_old, old[1] = old[1], None
            self._free(p, slot_old)

    def _land(self, key: tuple[int, int], posted: list, rec: list) -> None:
        """Copy piece ``rec`` into the posted receive; complete it when every byte is there."""
        req = posted[0]
        p, slot, copy, off, n, total = rec
        if total != req.nbytes:
            raise TransportError(f"rank {self.t.rank}: message from rank {p.rank} tag {req.tag} has {total} "
                                 f"bytes, the receive expects {req.nbytes}")
        if n:
            c0 = time.perf_counter()
            s0 = slot * p.eager.stride + HDR_BYTES if slot is not None else 0
            posted[2][off:off + n] = copy if copy is not None else p.eager.arr[s0:s0 + n]
            self.t.prof["copy_s"] += time.perf_counter() - c0
        if slot is not None:
            self._free(p, slot)
        posted[1] += n
        if posted[1] >= req.nbytes:
            del self.recvs[key]
            self.t.recv_done(p, req)

    def _free(self, p, slot: int) -> None:
        p.eager.owed |= p.eager.ring.free(slot)
        if p.eager.owed:
            self._report(p)

    def _report(self, p) -> None:
        """Send the owed credits (kept owed if no control slot is free: sent when a send completion frees one)."""
        if self.t.send_ctl(p, CREDIT.pack(CREDIT_MAGIC, p.eager.ring.slots, p.eager.owed)):
            p.stats["credit_msgs_sent"] += 1
            p.eager.owed = 0
