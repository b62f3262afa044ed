"""The grant protocol of the RDMA transport (traffic.rdma, ``protocol="grant"``): the receiver hands the sender the
destinations of its posted receives ahead of time, as ib_write_bw's client knows the server's buffer before it
writes, and the sender writes each message straight into its destination. Pure accounting and wire formats; no
device needed (the data path: traffic.rdma_grant).

* Grant: one posted receive's destination, :data:`GRANT` (tag, address, length, rkey of the receive buffer, which
  is registered once and reused: traffic.rdma_regcache, and the grant id that the message's last write carries as
  its immediate). The receiver numbers grants (:class:`GrantIssuer`) and sends those of every receive posted
  towards one peer since its last grant message in one SEND (:func:`pack_grants`: up to :data:`MAX_PER_MESSAGE`),
  instead of one clear-to-send per message.
* The sender matches grants and sends by tag (:class:`GrantBook`): whichever comes second starts the message's
  writes. A message is written in pieces (traffic.rdma_credits.chunks) posted as one chain, only the last asking
  for a completion: RDMA WRITEs, the last one an RDMA WRITE WITH IMMEDIATE (immediate = the grant id), so the
  receiver sees exactly one completion per message and copies nothing.
* As many messages are in flight towards a receiver as it has receives posted for that sender.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

#: magic, number of grants (the grants follow)
GRANT_HDR = struct.Struct("<II")
GRANT_MAGIC = 0x74624752
#: tag, destination address, length, rkey, grant id
GRANT = struct.Struct("<QQQII")
MAX_PER_MESSAGE = 15
CTL_BYTES = 512  # a control slot of this protocol: one grant message
assert GRANT_HDR.size + MAX_PER_MESSAGE * GRANT.size <= CTL_BYTES
MAX_ID = 0x7FFFFFFF


class Grant(NamedTuple):
    tag: int
    addr: int
    length: int
    rkey: int
    gid: int


def pack_grants(grants: list[Grant]) -> bytes:
    """One grant message; ValueError for none or more than :data:`MAX_PER_MESSAGE`."""
    if not 1 <= len(grants) <= MAX_PER_MESSAGE:
        raise ValueError(f"a grant message carries 1..{MAX_PER_MESSAGE} grants (got {len(grants)})")
    return GRANT_HDR.pack(GRANT_MAGIC, len(grants)) + b"".join(GRANT.pack(*g) for g in grants)


def unpack_grants(raw: bytes) -> list[Grant]:
    """The grants of one grant message; ValueError if it is not one."""
    if len(raw) < GRANT_HDR.size:
        raise ValueError("grant message too short")
    magic, n = GRANT_HDR.unpack_from(raw)
    if magic != GRANT_MAGIC or not 1 <= n <= MAX_PER_MESSAGE or len(raw) < GRANT_HDR.size + n * GRANT.size:
        raise ValueError(f"not a grant message (magic {magic:#x}, {n} grants, {len(raw)} bytes)")
    return [Grant(*GRANT.unpack_from(raw, GRANT_HDR.size + k * GRANT.size)) for k in range(n)]


def swapped(gid: int) -> int:
    """``gid`` with its 4 bytes reversed (a binding that byte-swaps the immediate on one side only)."""
    return int.from_bytes(int(gid).to_bytes(4, "little"), "big")


class GrantIssuer:
    """The receiver's grants: an id per posted receive, the grants not yet sent per peer, and which receive a
    write's immediate completes."""

    __slots__ = ("next_id", "open", "unsent")

    def __init__(self):
        self.next_id = 1
        self.open: dict[int, Any] = {}  # grant id -> the caller's receive
        self.unsent: dict[int, list[Grant]] = {}  # peer -> grants not sent yet, oldest first

    def grant(self, peer: int, tag: int, addr: int, length: int, rkey: int, recv: Any) -> Grant:
        """A new grant for receive ``recv`` (queued for ``peer``)."""
        gid = self.next_id
        while gid in self.open:  # ids wrap after 2^31 receives; one still open is skipped
            gid = gid + 1 if gid < MAX_ID else 1
        self.next_id = gid + 1 if gid < MAX_ID else 1
        g = Grant(tag, addr, length, rkey, gid)
        self.open[gid] = recv
        self.unsent.setdefault(peer, []).append(g)
        return g

    def batch(self, peer: int) -> list[Grant]:
        """Up to :data:`MAX_PER_MESSAGE` unsent grants for ``peer``, oldest first (taken: send them now)."""
        q = self.unsent.get(peer)
        if not q:
            return []
        out, self.unsent[peer] = q[:MAX_PER_MESSAGE], q[MAX_PER_MESSAGE:]
        return out

    def unbatch(self, peer: int, grants: list[Grant]) -> None:
        """``grants`` (from :meth:`batch`) could not be sent: first in line again."""
        self.unsent[peer] = grants + self.unsent.get(peer, [])

    def pending(self, peer: int) -> int:
        return len(self.unsent.get(peer, ()))

    def complete(self, gid: int) -> Any:
        """The receive a write's immediate ``gid`` completes (also when the immediate arrives byte-swapped);
        KeyError if no grant of that id is open."""
        if gid in self.open:
            return self.open.pop(gid)
        return self.open.pop(swapped(gid))


class GrantBook:
    """The sender's side towards one peer: grants that came before their send, and sends waiting for a grant."""

    __slots__ = ("grants", "sends")

    def __init__(self):
        self.grants: dict[int, Grant] = {}  # tag -> grant
        self.sends: dict[int, Any] = {}  # tag -> the caller's send

    def add_grant(self, g: Grant) -> Any:
        """The peer granted ``g``: the send waiting for it (now matched), or None (kept). ValueError for a tag
        granted twice."""
        if g.tag in self.grants:
            raise ValueError(f"tag {g.tag} granted twice")
        send = self.sends.pop(g.tag, None)
        if send is None:
            self.grants[g.tag] = g
        return send

    def add_send(self, tag: int, send: Any) -> Grant | None:
        """A send of ``tag``: its grant (now matched), or None (the send waits). ValueError for a tag sent twice."""
        g = self.grants.pop(tag, None)
        if g is None:
            if tag in self.sends:
                raise ValueError(f"send of tag {tag} posted twice")
            self.sends[tag] = send
        return g
