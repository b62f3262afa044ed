"""The RDMA transport's grant data path (traffic.rdma, ``protocol="grant"``): the receiver grants destinations ahead
of time and the sender writes straight into them, in perftest's shape (accounting and wire format:
traffic.rdma_grants).

Receiver: ``post_recv`` looks the buffer up in the registration cache (registered once, reused) and queues a grant
(tag, address, length, rkey, grant id); the grants queued towards a peer go in one SEND when the agent next drives
progress (the receives of a step are posted together), or at once when a message's worth is queued. The message's
last write completes on our receive queue with the grant id as its immediate: one completion per message, nothing
copied.

Sender: a send whose grant is there (else when it comes) is cut into pieces of at most ``piece_bytes`` (0: one
write), posted as one chain of RDMA WRITEs, the last an RDMA WRITE WITH IMMEDIATE and the only one asking for a
completion (RC completes in order: when it comes every piece was acknowledged and the send is done). The payload
is read in place from the registered send buffer. As many messages are in flight as the receiver has granted.

Look-ahead (``lookahead`` K > 0, traffic.rdma_staging): the agent announces the receives of its next K ops
(``post_ahead``); each is granted at once into a registered staging buffer of the transport's, and the op's
receive, when posted, copies the data out of it (at once if it has landed). The sender then copies a send into a
registered buffer of its own (while fewer than K per peer are in use) and the send is done at once: its writes go
when the grant is there, and the agent's next op starts while they are on the wire. Up to K + 1 messages per peer
are in flight; ``max_msgs_in_flight`` (sender) and ``max_grants_open`` (receiver) count it.
"""

from __future__ import annotations

import time

import numpy as np

from traffic.rdma_credits import chunks
from traffic.rdma_grants import CTL_BYTES, MAX_PER_MESSAGE, GrantBook, GrantIssuer, pack_grants, unpack_grants
from traffic.rdma_staging import BufferPool, Staged, StagedReceives
from traffic.transport import Request, TransportError

K_GWRITE = 5  # the work-request kind of a grant write (traffic.rdma numbers the others)


class GrantProto:
    """The grant protocol of transport ``t`` (a traffic.rdma.RdmaTransport)."""

    ctl_bytes = CTL_BYTES

    def __init__(self, t, piece_bytes: int, lookahead: int = 0):
        self.t, self.piece_bytes, self.lookahead = t, int(piece_bytes), int(lookahead)
        self.pool = BufferPool(lambda arr: t.mr(arr.nbytes or 1, address=arr.ctypes.data))
        self.staged = StagedReceives()
        self.copies: dict[int, int] = {}  # peer -> send copies in use (their writes not acknowledged yet)
        self.in_flight: dict[int, int] = {}  # peer -> messages whose writes are posted, not yet acknowledged
        self.open: dict[int, int] = {}  # peer -> grants sent or queued whose message has not landed
        self.issuer = GrantIssuer()
        self.books: dict[int, GrantBook] = {}  # peer -> grants and sends towards it
        self.waiting_since: dict[tuple[int, int], float] = {}  # (peer, tag) of sends waiting for their grant
        self.dirty: set[int] = set()  # peers with grants queued

    # ---- setup ----

    def setup(self, p) -> tuple[int, int, int, int]:
        self.books[p.rank] = GrantBook()
        self.copies[p.rank] = self.in_flight[p.rank] = self.open[p.rank] = 0
        return 0, 0, 0, 0  # no ring

    @staticmethod
    def connected(p, theirs) -> None:
        pass

    # ---- receiving ----

    def post_recv(self, p, req: Request) -> None:
        try:
            s = self.staged.claim(p.rank, req.tag, req)
        except ValueError as exc:
            raise TransportError(f"rank {self.t.rank}: {exc}") from None
        if s is not None:  # granted ahead: the data is (or will be) in its staging buffer
            if s.landed:
                self._unstage(p, s)
            return
        addr, rkey = 0, 0
        if req.nbytes:
            mr, addr = self.t.region(req.buf)
            rkey = mr.rkey
        self._grant(p, req.tag, addr, req.nbytes, rkey, req)

    def post_ahead(self, peer: int, tag: int, nbytes: int) -> None:
        """A receive of ``nbytes`` from ``peer`` that a later op will post: granted now into a staging buffer."""
        p = self.t.peers.get(peer)
        if p is None:
            raise TransportError(f"rank {self.t.rank}: no connection to rank {peer}")
        buf = self.pool.take(nbytes) if nbytes else None
        try:
            s = self.staged.stage(peer, tag, nbytes, buf)
        except ValueError as exc:
            raise TransportError(f"rank {self.t.rank}: {exc}") from None
        addr, rkey = (buf[0].ctypes.data, buf[1].rkey) if buf is not None else (0, 0)
        p.stats["grants_ahead"] += 1
        self._grant(p, tag, addr, nbytes, rkey, s)

    def _grant(self, p, tag: int, addr: int, nbytes: int, rkey: int, recv) -> None:
        self.issuer.grant(p.rank, tag, addr, nbytes, rkey, recv)
        self.open[p.rank] += 1
        p.stats["max_grants_open"] = max(p.stats["max_grants_open"], self.open[p.rank])
        if self.issuer.pending(p.rank) >= MAX_PER_MESSAGE:
            self._send_grants(p)
        else:
            self.dirty.add(p.rank)

    def flush(self) -> None:
        """Send every peer the grants queued for it (the transport calls it before it waits)."""
        while self.dirty:
            self._send_grants(self.t.peers[self.dirty.pop()])

    def _send_grants(self, p) -> None:
        """One grant message per batch while control slots are free (the rest go when a completion frees one)."""
        while True:
            batch = self.issuer.batch(p.rank)
            if not batch:
                return
            if not self.t.send_ctl(p, pack_grants(batch)):
                self.issuer.unbatch(p.rank, batch)
                return
            p.stats["grant_msgs_sent"] += 1
            p.stats["grants_sent"] += len(batch)

    def on_write(self, p, gid: int) -> None:
        """A message's last write landed (its immediate: the grant id)."""
        try:
            req = self.issuer.complete(gid)
        except KeyError:
            raise TransportError(f"rank {self.t.rank}: write from rank {p.rank} for unknown grant {gid}") from None
        self.open[p.rank] -= 1
        if not isinstance(req, Staged):
            self.t.recv_done(p, req)
        elif self.staged.land(req):
            self._unstage(p, req)

    def _unstage(self, p, s: Staged) -> None:
        """The op's receive ``s.req`` is posted and its data is in the staging buffer: copied out, buffer reused."""
        if s.nbytes:
            c0 = time.perf_counter()
            np.frombuffer(s.req.buf, dtype=np.uint8)[:] = s.buf[0]
            self.t.prof["copy_s"] += time.perf_counter() - c0
            self.pool.give(s.buf)
        p.stats["staged_copied"] += 1
        self.t.recv_done(p, s.req)

    # ---- sending ----

    def on_message(self, p, i: int) -> None:
        """A grant message from ``p`` in control slot ``i``: start the sends that waited for these grants."""
        t = self.t
        try:
            grants = unpack_grants(p.ctl_recv.read(self.ctl_bytes, i * t.ctl_slot))
        except ValueError as exc:
            raise TransportError(f"rank {t.rank}: rank {p.rank}: {exc}") from None
        p.stats["grant_msgs_recv"] += 1
        p.stats["grants_recv"] += len(grants)
        book = self.books[p.rank]
        chain: list = []  # the writes of every send these grants start: one chain
        for g in grants:
            try:
                req = book.add_grant(g)
            except ValueError as exc:
                raise TransportError(f"rank {t.rank}: rank {p.rank}: {exc}") from None
            if req is not None:
                t.prof["cts_wait_s"] += time.monotonic() - self.waiting_since.pop((p.rank, g.tag))
                chain += self._writes(p, *req, g)
        if chain:
            t.push_chain(p, chain)

    def post_send(self, p, req: Request) -> None:
        """With look-ahead, a send is copied into a registered buffer of our own while fewer than ``lookahead``
        are in use towards ``p``, and is done at once; else its writes read it in place and it is done when they
        are acknowledged."""
        copy = None
        if self.lookahead and req.nbytes and self.copies[p.rank] < self.lookahead:
            copy = self.pool.take(req.nbytes)
            c0 = time.perf_counter()
            copy[0][:] = np.frombuffer(req.buf, dtype=np.uint8)
            self.t.prof["copy_s"] += time.perf_counter() - c0
            self.copies[p.rank] += 1
        try:
            g = self.books[p.rank].add_send(req.tag, (req, copy))
        except ValueError as exc:
            raise TransportError(f"rank {self.t.rank}: to rank {p.rank}: {exc}") from None
        if g is None:
            self.waiting_since[(p.rank, req.tag)] = time.monotonic()
        else:
            self.t.push_chain(p, self._writes(p, req, copy, g))
        if copy is not None:
            self.t.send_done(p, req)

    def _writes(self, p, req: Request, copy, g) -> list[tuple[tuple, bool]]:
        """The message's pieces into the granted destination, (record, signalled) for a chain: only the last is
        signalled and carries the grant id (and the send it completes, or the copy it frees)."""
        if g.length != req.nbytes:
            raise TransportError(f"rank {self.t.rank}: message to rank {p.rank} tag {req.tag} has {req.nbytes} "
                                 f"bytes, the receive expects {g.length}")
        lkey, src = p.ctl_send.lkey, p.ctl_send.buf  # an empty message: a 0-byte write with its immediate
        if copy is not None:
            lkey, src = copy[1].lkey, copy[0].ctypes.data
        elif req.nbytes:
            mr, src = self.t.region(req.buf)
            lkey = mr.lkey
        plan = chunks(req.nbytes, self.piece_bytes or max(req.nbytes, 1))
        last = len(plan) - 1
        p.stats["pieces"] += len(plan)
        self.in_flight[p.rank] += 1
        p.stats["max_msgs_in_flight"] = max(p.stats["max_msgs_in_flight"], self.in_flight[p.rank])
        return [((K_GWRITE, req if k == last and copy is None else None, -1, lkey, src + off, n, g.addr + off,
                  g.rkey, g.gid if k == last else -1, copy if k == last else None), k == last)
                for k, (off, n) in enumerate(plan)]

    def build_wr(self, p, record: tuple, wr_id: int, flags: int):
        v = self.t.v
        _, _, _, lkey, src, n, raddr, rkey, gid, _ = record
        sge = v["SGE"](src, n, lkey)
        if gid >= 0:
            wr = v["SendWR"](wr_id=wr_id, opcode=v["e"].IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge],
                             imm_data=gid, send_flags=flags)
        else:
            wr = v["SendWR"](wr_id=wr_id, opcode=v["e"].IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=flags)
        wr.set_wr_rdma(rkey, raddr)
        return wr

    def released(self, p, record: tuple) -> None:
        """A write is acknowledged; a message's last: it is no longer in flight, and its copy is free again."""
        if record[8] >= 0:
            self.in_flight[p.rank] -= 1
            if record[9] is not None:
                self.pool.give(record[9])
                self.copies[p.rank] -= 1

    def busy(self, p) -> bool:
        """Sends towards ``p`` not yet written (waiting for their grant): drain() waits for them."""
        return bool(self.books[p.rank].sends)

    def objects(self) -> list:
        """The memory regions to close with the transport."""
        return list(self.pool.mrs)

    def pump(self, p) -> None:
        """A control slot came free: grants that waited for one."""
        if self.issuer.pending(p.rank):
            self._send_grants(p)
