"""Selective acknowledgement for the agents' UET transport (traffic.uet): which PSNs a receiver holds, as UEC 1.0's
PDS ACK says it (CACK_PSN, the cumulative point: every PSN below it has arrived; SACK_PSN and a 64-bit SACK bitmap:
bit i set = PSN SACK_PSN + i has arrived), and what a sender learns from one (which outstanding PSNs are delivered,
which are lost by the time rule below).

Loss detection here is time-based, as RACK (RFC 8985) does it and as a sprayed transport needs: packets sent over
different paths arrive out of order, so a hole in the PSN space is not a loss by itself. A packet is declared lost
when a packet sent more than ``reorder_s`` after it has been delivered (its ACK echoes that packet's send time).
The UEC specification leaves the loss rule to the implementation beyond NACKs and the retransmission timer; a
packet-count threshold would misfire under spraying.

Path-aware loss (:func:`lost_on_paths`, the transport's default): the sender keeps state per entropy value (EV, the
UDP source port that the fabric's ECMP hash maps to one path; UEC's PDS lets a sender keep per-EV state for its
load balancing) and reads reordering per path. Packets on one EV follow one path and one FIFO queue per hop, so they
stay in order: a packet is lost at once when a packet sent later **on the same EV** has been delivered. Across EVs
the time rule above is kept only as a fallback, and with an allowance that follows the packet's own path: it must
also be overdue on its EV, older than that EV's smoothed RTT plus max(4 RTT variations, srtt/4, the reorder
minimum) (:class:`PathRtt`). On unequal paths (a slow spine) the packets still queued on the slow path are then not
judged lost because a fast path delivered later ones."""

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


class PathRtt:
    """Round-trip estimators per entropy value (per path) of one peer pair: RFC 6298's smoothed RTT and variation
    (gains 1/8 and 1/4), one pair per EV, fed with the RTT of each acknowledged transmission on that EV. What a
    sender's per-EV path state stands for: the delay of the path the fabric's hash gives that EV."""

    def __init__(self, n_ev: int) -> None:
        self.srtt_ns = [0] * n_ev  # 0: no sample yet
        self.rttvar_ns = [0] * n_ev

    def sample(self, ev: int, rtt_ns: int) -> None:
        if self.srtt_ns[ev] == 0:
            self.srtt_ns[ev], self.rttvar_ns[ev] = rtt_ns, rtt_ns // 2
        else:
            self.rttvar_ns[ev] = (3 * self.rttvar_ns[ev] + abs(self.srtt_ns[ev] - rtt_ns)) // 4
            self.srtt_ns[ev] = (7 * self.srtt_ns[ev] + rtt_ns) // 8

    def overdue_ns(self, ev: int, reorder_min_ns: int, fallback_ns: int) -> int:
        """How long after its transmission a packet on `ev` may still be on its way: srtt + max(4 rttvar, srtt/4,
        `reorder_min_ns`) of that EV; `fallback_ns` (the peer pair's own estimate) for an EV with no sample yet."""
        s = self.srtt_ns[ev]
        if s == 0:
            return fallback_ns
        return s + max(4 * self.rttvar_ns[ev], s // 4, reorder_min_ns)


def lost_on_paths(sent: dict[int, tuple[int, int]], delivered_sent_ns: int, delivered_ev: int | None,
                  reorder_ns: int, now_ns: int, overdue_ns) -> tuple[list[int], list[int]]:
    """The PSNs of `sent` (outstanding PSN -> (last transmission time, its EV)) that a delivery proves lost, as
    (by path order, by time). The delivered transmission was sent at `delivered_sent_ns` on `delivered_ev` (None:
    not known, e.g. the ACK answers an earlier transmission than the last).

    * path order: sent on `delivered_ev` before the delivered one (one path keeps its packets in order);
    * time (fallback): sent more than `reorder_ns` before the delivered one (RACK's rule) and more than
      ``overdue_ns(ev)`` before `now_ns` (late on its own path; :func:`next_overdue_ns` says when to look again)."""
    order, timed = [], []
    limit = delivered_sent_ns - reorder_ns
    for p, (t, ev) in sent.items():
        if ev == delivered_ev and t < delivered_sent_ns:
            order.append(p)
        elif t < limit and now_ns - t >= overdue_ns(ev):
            timed.append(p)
    return order, timed


def next_overdue_ns(sent: dict[int, tuple[int, int]], delivered_sent_ns: int, reorder_ns: int,
                    overdue_ns) -> int | None:
    """When the time rule of :func:`lost_on_paths` will next declare a packet of `sent` lost if nothing else is
    delivered: the earliest ``t + overdue_ns(ev)`` of the packets already a reorder window older than the latest
    delivered one (RACK's reordering timer, RFC 8985's RACK_detect_loss_and_arm_timer: at a flow's tail no later ACK
    comes to re-check); None if
    there is none."""
    limit = delivered_sent_ns - reorder_ns
    return min((t + overdue_ns(ev) for t, ev in sent.values() if t < limit), default=None)


__all__ = ["next_overdue_ns", "PathRtt", "ReceiveWindow", "SACK_BITS", "acked", "lost", "lost_on_paths"]
