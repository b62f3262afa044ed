"""Selective acknowledgement for the agents' UET transport (traffic.uet): which PSNs a receiver holds, as UEC 1.0's
PDS ACK says it (CACK_PSN, the cumulative point: every PSN below it has arrived; SACK_PSN and a 64-bit SACK bitmap:
bit i set = PSN SACK_PSN + i has arrived), and what a sender learns from one (which outstanding PSNs are delivered,
which are lost by the time rule below).

Loss detection here is time-based, as RACK (RFC 8985) does it and as a sprayed transport needs: packets sent over
different paths arrive out of order, so a hole in the PSN space is not a loss by itself. A packet is declared lost
when a packet sent more than ``reorder_s`` after it has been delivered (its ACK echoes that packet's send time).
The UEC specification leaves the loss rule to the implementation beyond NACKs and the retransmission timer; a
packet-count threshold would misfire under spraying."""

from __future__ import annotations

SACK_BITS = 64


class ReceiveWindow:
    """The receiver's PSN state for one sending peer (one PDC in UEC terms): the cumulative point and the PSNs
    received above it."""

    def __init__(self) -> None:
        self.cack_psn = 0  # every PSN below this has arrived
        self.above: set[int] = set()  # PSNs >= cack_psn that have arrived

    def has(self, psn: int) -> bool:
        return psn < self.cack_psn or psn in self.above

    def add(self, psn: int) -> bool:
        """Record `psn`; False if it had arrived before (a duplicate: the caller re-ACKs and drops the payload)."""
        if self.has(psn):
            return False
        self.above.add(psn)
        while self.cack_psn in self.above:
            self.above.discard(self.cack_psn)
            self.cack_psn += 1
        return True

    def sack(self) -> tuple[int, int]:
        """(SACK_PSN, bitmap): the 64 PSNs from the cumulative point on. Bit 0 is always clear (the cumulative
        point is the first missing PSN); PSNs further above are reported by later ACKs."""
        base = self.cack_psn
        bits = 0
        for p in self.above:
            i = p - base
            if 0 <= i < SACK_BITS:
                bits |= 1 << i
        return base, bits


def acked(outstanding, cack_psn: int, sack_psn: int, bitmap: int, ack_psn: int) -> list[int]:
    """The PSNs of `outstanding` (an iterable of PSNs) this ACK reports delivered: below CACK_PSN, set in the SACK
    bitmap, or the ACK_PSN it answers."""
    out = []
    for p in outstanding:
        if p < cack_psn or p == ack_psn:
            out.append(p)
        else:
            i = p - sack_psn
            if 0 <= i < SACK_BITS and bitmap >> i & 1:
                out.append(p)
    return out


def lost(sent_ns: dict[int, int], delivered_sent_ns: int, reorder_ns: int) -> list[int]:
    """The PSNs (of `sent_ns`: outstanding PSN -> its last transmission time) that a delivery of a packet sent at
    `delivered_sent_ns` proves lost: sent more than `reorder_ns` before it (RACK's rule)."""
    limit = delivered_sent_ns - reorder_ns
    return [p for p, t in sent_ns.items() if t < limit]


__all__ = ["ReceiveWindow", "SACK_BITS", "acked", "lost"]
