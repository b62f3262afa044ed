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
"""

from __future__ import annotations

import time

from traffic.rdma_credits import chunks
from traffic.rdma_grants import CTL_BYTES, MAX_PER_MESSAGE, GrantBook, GrantIssuer, pack_grants, unpack_grants
from traffic.transport import Request, TransportError

K_GWRITE = 5  # the work-request kind of a grant write (traffic.rdma numbers the others)


class GrantProto:
    """The grant protocol of transport ``t`` (a traffic.rdma.RdmaTransport)."""

    ctl_bytes = CTL_BYTES

    def __init__(self, t, piece_bytes: int):
        self.t, self.piece_bytes = t, int(piece_bytes)
        self.issuer = GrantIssuer()
        self.books: dict[int, GrantBook] = {}  # peer -> grants and sends towards it
        self.waiting_since: dict[tuple[int, int], float] = {}  # (peer, tag) of sends waiting for their grant
        self.dirty: set[int] = set()  # peers with grants queued

    # ---- setup ----

    def setup(self, p) -> tuple[int, int, int, int]:
        self.books[p.rank] = GrantBook()
        return 0, 0, 0, 0  # no ring

    @staticmethod
    def connected(p, theirs) -> None:
        pass

    # ---- receiving ----

    def post_recv(self, p, req: Request) -> None:
        addr, rkey = 0, 0
        if req.nbytes:
            mr, addr = self.t.region(req.buf)
            rkey = mr.rkey
        self.issuer.grant(p.rank, req.tag, addr, req.nbytes, rkey, req)
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
        self.t.recv_done(p, req)

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
                chain += self._writes(p, req, g)
        if chain:
            t.push_chain(p, chain)

    def post_send(self, p, req: Request) -> None:
        try:
            g = self.books[p.rank].add_send(req.tag, req)
        except ValueError as exc:
            raise TransportError(f"rank {self.t.rank}: to rank {p.rank}: {exc}") from None
        if g is None:
            self.waiting_since[(p.rank, req.tag)] = time.monotonic()
        else:
            self.t.push_chain(p, self._writes(p, req, g))

    def _writes(self, p, req: Request, g) -> list[tuple[tuple, bool]]:
        """The message's pieces into the granted destination, (record, signalled) for a chain: only the last is
        signalled and carries the grant id."""
        if g.length != req.nbytes:
            raise TransportError(f"rank {self.t.rank}: message to rank {p.rank} tag {req.tag} has {req.nbytes} "
                                 f"bytes, the receive expects {g.length}")
        lkey, src = p.ctl_send.lkey, p.ctl_send.buf  # an empty message: a 0-byte write with its immediate
        if req.nbytes:
            mr, src = self.t.region(req.buf)
            lkey = mr.lkey
        plan = chunks(req.nbytes, self.piece_bytes or max(req.nbytes, 1))
        last = len(plan) - 1
        p.stats["pieces"] += len(plan)
        return [((K_GWRITE, req if k == last else None, -1, lkey, src + off, n, g.addr + off, g.rkey,
                  g.gid if k == last else -1), k == last) for k, (off, n) in enumerate(plan)]

    def build_wr(self, p, record: tuple, wr_id: int, flags: int):
        v = self.t.v
        _, _, _, lkey, src, n, raddr, rkey, gid = record
        sge = v["SGE"](src, n, lkey)
        if gid >= 0:
            wr = v["SendWR"](wr_id=wr_id, opcode=v["e"].IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[sge],
                             imm_data=gid, send_flags=flags)
        else:
            wr = v["SendWR"](wr_id=wr_id, opcode=v["e"].IBV_WR_RDMA_WRITE, num_sge=1, sg=[sge], send_flags=flags)
        wr.set_wr_rdma(rkey, raddr)
        return wr

    @staticmethod
    def released(p, record: tuple) -> None:
        pass

    def pump(self, p) -> None:
        """A control slot came free: grants that waited for one."""
        if self.issuer.pending(p.rank):
            self._send_grants(p)
