"""The eager protocol of the RDMA transport (traffic.rdma): a ring of receive slots per connection and the credits
that say which of them the sender may write, as perftest's ib_write_bw keeps many RDMA WRITEs in flight instead of
waiting for the receiver before each one. Pure accounting and wire formats; no device needed.

* Ring: each receiver registers, per peer, ``slots`` slots of ``HDR_BYTES + slot_bytes`` bytes (once, reused for
  the connection's lifetime) and tells the peer their address and rkey at connection setup.
* Chunks: a message is cut into pieces of at most ``slot_bytes`` (:func:`chunks`); each goes by one RDMA WRITE
  WITH IMMEDIATE (immediate = the slot) whose first scatter element is a 64-byte header (:data:`HDR`: tag, the
  message's length, the piece's offset and length) and whose second is the payload, read in place from the
  sender's registered buffer.
* Credits: the sender writes only into slots it holds (:class:`SendWindow`: all of them at the start). The receiver
  frees a slot once the piece is copied into the posted receive buffer and gives freed slots back in batches, a
  bitmap in one small SEND (:data:`CREDIT`) per ``max(1, slots // 4)`` freed slots (:class:`RecvRing`). Unset,
  ``slots`` follows the number of peers (:func:`auto_slots`: 32 for up to 4 peers, 8 from 16 on).
* A piece whose receive is not posted yet stays in its slot; when more than half of the ring is held that way the
  oldest is copied out to memory of its own (the transport does it) and its slot freed: a schedule that is
  deadlock-free with unbounded eager buffering (kernel TCP) cannot then starve the sender of credits.
"""

from __future__ import annotations

import struct
from collections import deque

#: tag, message length, piece offset, piece length, magic (at the start of every slot; the payload follows)
HDR = struct.Struct("<QQQII")
HDR_MAGIC = 0x74624845
HDR_BYTES = 64
#: magic, number of slots, bitmap of the slots freed since the last credit message
CREDIT = struct.Struct("<IIQ")
CREDIT_MAGIC = 0x74624352
MAX_SLOTS = 64  # a credit bitmap is one 64-bit word
#: ``credits`` unset: each peer's ring gets RING_BUDGET_SLOTS / peers slots, between MIN_AUTO_SLOTS and
#: MAX_AUTO_SLOTS (of 128 KiB: 4 MiB with up to 4 peers, the old 1 MiB from 16 peers on). Measured in the lab VM
#: (benchmarks/verbs_steps.py, docs/collective.md): with 1 MiB in flight the writer waits for credits while rxe
#: idles; 4 MiB moved 1.11x [1.07, 1.26] as much at 1 MB
#: messages (the agent, paired rounds, n = 6; 1.17x [0.99, 1.28] in an earlier session, n = 5)
RING_BUDGET_SLOTS, MIN_AUTO_SLOTS, MAX_AUTO_SLOTS = 128, 8, 32


def check_ring(slots: int, slot_bytes: int) -> None:
    """ValueError (one line) unless the ring's shape is one the protocol can carry."""
    if not 0 <= int(slots) <= MAX_SLOTS:
        raise ValueError(f"credits must be 0..{MAX_SLOTS} (got {slots}; 0: rendezvous per message)")
    if int(slots) and not 4096 <= int(slot_bytes) <= (1 << 30):
        raise ValueError(f"slot_bytes must be 4096..{1 << 30} (got {slot_bytes})")


def auto_slots(peers: int) -> int:
    """The ring's slots per peer when ``credits`` is not set: a rank's rings (and as many send buffers) stay within
    RING_BUDGET_SLOTS slots up to RING_BUDGET_SLOTS / MIN_AUTO_SLOTS peers."""
    return min(MAX_AUTO_SLOTS, max(MIN_AUTO_SLOTS, RING_BUDGET_SLOTS // max(1, int(peers))))


def chunks(nbytes: int, slot_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of the pieces a message of ``nbytes`` is written in; one empty piece for an empty message."""
    if nbytes <= 0:
        return [(0, 0)]
    return [(off, min(slot_bytes, nbytes - off)) for off in range(0, nbytes, slot_bytes)]


class SendWindow:
    """The sender's credits towards one peer: which of the peer's ring slots it may write now."""

    __slots__ = ("slots", "free")

    def __init__(self, slots: int):
        self.slots = slots
        self.free: deque[int] = deque(range(slots))

    def take(self) -> int | None:
        """A slot to write next (oldest freed first), or None when every slot is in use."""
        return self.free.popleft() if self.free else None

    def give(self, bitmap: int) -> int:
        """The receiver freed the slots of ``bitmap``; returns how many. ValueError on a slot out of range or
        one this side already holds (the peer broke the protocol)."""
        if bitmap >> self.slots:
            raise ValueError(f"credit for slot >= {self.slots} (bitmap {bitmap:#x})")
        n = 0
        held = set(self.free)
        while bitmap:
            low = bitmap & -bitmap
            slot = low.bit_length() - 1
            if slot in held:
                raise ValueError(f"credit for slot {slot}, which was not in use")
            self.free.append(slot)
            n += 1
            bitmap ^= low
        return n


class RecvRing:
    """The receiver's side of one peer's ring: slots freed but not yet reported, and pieces held for receives not
    posted yet (``hold`` says which of them to copy out so that at most half of the ring is held)."""

    __slots__ = ("slots", "report_at", "unreported", "n_unreported", "held")

    def __init__(self, slots: int):
        self.slots = slots
        self.report_at = max(1, slots // 4)
        self.unreported = 0
        self.n_unreported = 0
        self.held: deque = deque()  # the transport's records of held pieces, oldest first

    def free(self, slot: int) -> int:
        """Slot ``slot`` may be written again; returns the bitmap to send as a credit message now, or 0."""
        bit = 1 << slot
        if self.unreported & bit:
            raise ValueError(f"slot {slot} freed twice")
        self.unreported |= bit
        self.n_unreported += 1
        if self.n_unreported < self.report_at:
            return 0
        out, self.unreported, self.n_unreported = self.unreported, 0, 0
        return out

    def hold(self, record) -> list:
        """Keep ``record`` (a piece that arrived before its receive); returns the records to copy out of the ring
        (then :meth:`free` their slots), oldest first."""
        self.held.append(record)
        out = []
        while len(self.held) > self.slots // 2:
            out.append(self.held.popleft())
        return out

    def release(self, record) -> None:
        """``record``'s receive was posted: it is no longer held (the caller copies it, then frees its slot)."""
        self.held.remove(record)
