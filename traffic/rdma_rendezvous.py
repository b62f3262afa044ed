"""The RDMA transport's rendezvous data path (traffic.rdma, ``credits=0``): the protocol the transport had before the
eager one, kept to measure against it (benchmarks/rdma_vs_ib_write_bw.py) and as zero-copy on both ends.

``post_recv`` registers the destination and SENDs a 32-byte clear-to-send (tag, address, length, rkey, slot) to the
peer; ``post_send`` waits for the matching clear-to-send, then does one RDMA WRITE WITH IMMEDIATE (immediate = the
receiver's slot) straight into the destination buffer. The receiver sees the write's completion on its receive
queue and completes the receive; the sender's request completes with the write's send completion. One message in
flight per clear-to-send: the receiver's next receive, its clear-to-send's trip and the sender's reaction to it are
a gap between messages that the eager protocol does not have.
"""

from __future__ import annotations

import struct
import time

from traffic.transport import Request, TransportError

CTS = struct.Struct("<QQQII")  # tag, remote address, length, rkey, slot
K_WRITE = 3  # the work-request kind of a write (traffic.rdma numbers the others)


class Rendezvous:
    """The rendezvous protocol of transport ``t`` (a traffic.rdma.RdmaTransport)."""

    def __init__(self, t):
        self.t = t
        self.cts_in: dict[tuple[int, int], tuple[int, int, int, int]] = {}  # (peer, tag) -> (addr, len, rkey, slot)
        self.sends: dict[tuple[int, int], tuple[Request, float]] = {}  # sends waiting for a clear-to-send, since
        self.recv_slots: dict[int, Request] = {}  # slot -> posted receive
        self.next_slot = 1

    @staticmethod
    def setup(p) -> tuple[int, int, int, int]:
        return 0, 0, 0, 0  # no ring

    @staticmethod
    def connected(p, theirs) -> None:
        pass

    def post_send(self, p, req: Request) -> None:
        key = (p.rank, req.tag)
        cts = self.cts_in.pop(key, None)
        if cts is not None:
            self._write(p, req, *cts)
            return
        if key in self.sends:
            raise TransportError(f"rank {self.t.rank}: send to {p.rank} tag {req.tag} posted twice")
        self.sends[key] = (req, time.monotonic())

    def _write(self, p, req: Request, addr: int, length: int, rkey: int, slot: int) -> None:
        if length != req.nbytes:
            raise TransportError(f"rank {self.t.rank}: message to rank {req.peer} tag {req.tag} has {req.nbytes} "
                                 f"bytes, the receive expects {length}")
        self.t.push(p, (K_WRITE, req, -1, addr, rkey, slot), True)

    def build_wr(self, p, record: tuple, wr_id: int, flags: int):
        v = self.t.v
        _, req, _, addr, rkey, slot = record
        if req.nbytes:
            mr, a = self.t.region(req.buf)
            sge = v["SGE"](a, req.nbytes, mr.lkey)
        else:
            sge = v["SGE"](p.ctl_send.buf, 0, p.ctl_send.lkey)
        wr = v["SendWR"](wr_id=wr_id, opcode=v["e"].IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge],
                         imm_data=slot, send_flags=flags)
        wr.set_wr_rdma(rkey, addr)
        return wr

    @staticmethod
    def released(p, record: tuple) -> None:
        pass

    def pump(self, p) -> None:
        pass  # nothing waits for send-queue room here: the send queue's backlog holds it

    def post_recv(self, p, req: Request) -> None:
        slot = self.next_slot
        self.next_slot = self.next_slot + 1 if self.next_slot < 0x7FFFFFFF else 1
        self.recv_slots[slot] = req
        addr, rkey = 0, 0
        if req.nbytes:
            mr, addr = self.t.region(req.buf)
            rkey = mr.rkey
        if not self.t.send_ctl(p, CTS.pack(req.tag, addr, req.nbytes, rkey, slot)):
            raise TransportError(f"rank {self.t.rank}: more than {self.t.send_depth} clear-to-sends in flight to "
                                 f"rank {p.rank}")
        p.stats["cts_sent"] += 1

    def on_write(self, p, slot: int) -> None:
        req = self.recv_slots.pop(slot, None)
        if req is None:  # a binding that byte-swaps the immediate on one side only
            req = self.recv_slots.pop(int.from_bytes(int(slot).to_bytes(4, "little"), "big"), None)
        if req is None:
            raise TransportError(f"rank {self.t.rank}: write from rank {p.rank} for unknown slot {slot}")
        self.t.recv_done(p, req)

    def on_message(self, p, i: int) -> None:
        """A clear-to-send from ``p`` in control slot ``i``."""
        tag, addr, length, rkey, slot = CTS.unpack(p.ctl_recv.read(CTS.size, i * self.t.CTL_SLOT))
        p.stats["cts_recv"] += 1
        key = (p.rank, tag)
        waiting = self.sends.pop(key, None)
        if waiting is not None:
            self.t.prof["cts_wait_s"] += time.monotonic() - waiting[1]
            self._write(p, waiting[0], addr, length, rkey, slot)
        else:
            if key in self.cts_in:
                raise TransportError(f"rank {self.t.rank}: rank {p.rank} asked for tag {tag} twice")
            self.cts_in[key] = (addr, length, rkey, slot)
