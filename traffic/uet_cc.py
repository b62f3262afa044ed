"""The sender's congestion window of the agents' UET transport (traffic.uet): an NSCC-style law (UEC 1.0's
Network-Signal-based Congestion Control: a sender-side window driven by ECN marks, delay and NACKs).

The law here, per ACK of ``acked_bytes`` with a round-trip sample ``rtt_s`` (queueing delay = rtt - base RTT, the
smallest RTT seen):

(the queueing delay is the one-way delay above its minimum when the ACK carries the arrival time, see
traffic/uet_packet.py; else the RTT above its minimum)

* unmarked and delay <= target: **proportional increase** + **fair increase**: cwnd grows by
  ``gain * acked * (target - delay) / target`` (fast when queues are empty) plus ``mtu * acked / cwnd`` (one MTU per
  window, as additive increase: what lets competing flows converge);
* unmarked and delay > target: **multiplicative decrease** by ``min(max_md, beta * (delay - target) / delay)``;
* ECN-CE echoed: multiplicative decrease by ``max_md``;
* NACK (a trimmed packet): multiplicative decrease by ``max_md`` (NACK_DECREASE);
* retransmission timeout: cwnd = the minimum (TIMEOUT_DECREASE).

Every decrease happens at most once per smoothed RTT (later signals of the same RTT are the same congestion).

Simplified against NSCC: the specification combines ECN and delay by quadrant (ECN with a low delay, say, is read as
transient noise rather than a cut; delay without ECN as congestion elsewhere), adds quick adapt (cwnd set to what
was delivered over the last RTT after a burst of trims) and a byte-counted update schedule, and keeps the base RTT
and target from configuration. Here either signal cuts, the base RTT is measured (its minimum), and there is no
quick adapt. The names of the events follow htsim's UEC model (FAIR_INCREASE, PROPORTIONAL_INCREASE,
MULTIPLICATIVE_DECREASE, NACK_DECREASE, TIMEOUT_DECREASE), counted in :attr:`Nscc.events`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class NsccParams:
    mtu_bytes: int = 1500
    init_cwnd_bytes: int = 16 * 1500
    min_cwnd_bytes: int = 1500
    max_cwnd_bytes: int = 256 * 1500
    target_delay_s: float = 0.002  # queueing delay above which the window shrinks
    gain: float = 0.5  # proportional increase: fraction of the acked bytes at zero delay
    beta: float = 0.5  # delay decrease: weight of (delay - target) / delay
    max_md: float = 0.5  # largest single cut

    def __post_init__(self):
        if not 0 < self.min_cwnd_bytes <= self.init_cwnd_bytes <= self.max_cwnd_bytes:
            raise ValueError("need 0 < min_cwnd_bytes <= init_cwnd_bytes <= max_cwnd_bytes")
        if not (self.target_delay_s > 0 and 0 < self.max_md < 1 and self.gain >= 0 and self.beta > 0):
            raise ValueError("need target_delay_s > 0, 0 < max_md < 1, gain >= 0, beta > 0")


class Nscc:
    """One sender's window toward one peer."""

    def __init__(self, p: NsccParams = NsccParams()):
        self.p = p
        self.cwnd_bytes = float(p.init_cwnd_bytes)
        self.base_rtt_s = float("inf")
        self.base_owd_s = float("inf")
        self.srtt_s = 0.0
        self.last_cut_s = -float("inf")
        self.events: Counter[str] = Counter()

    def _clamp(self) -> None:
        self.cwnd_bytes = min(float(self.p.max_cwnd_bytes), max(float(self.p.min_cwnd_bytes), self.cwnd_bytes))

    def _cut(self, now_s: float, fraction: float, event: str) -> bool:
        if now_s - self.last_cut_s < self.srtt_s:
            self.events["NO_CHANGE"] += 1
            return False
        self.cwnd_bytes *= 1.0 - fraction
        self._clamp()
        self.last_cut_s = now_s
        self.events[event] += 1
        return True

    def on_ack(self, now_s: float, acked_bytes: int, rtt_s: float | None, ecn_ce: bool,
               owd_s: float | None = None) -> None:
        """An ACK of `acked_bytes` newly delivered bytes; `rtt_s` the RTT of the packet it answers (None if unknown),
        `ecn_ce` whether that packet arrived marked, `owd_s` its one-way delay when the ACK says it. The queueing
        delay is the one-way delay above its smallest when given (the forward path's queues only), else the RTT
        above the smallest RTT."""
        if rtt_s is not None and rtt_s > 0:
            self.base_rtt_s = min(self.base_rtt_s, rtt_s)
            self.srtt_s = rtt_s if self.srtt_s == 0 else 0.875 * self.srtt_s + 0.125 * rtt_s
        if owd_s is not None and owd_s >= 0:
            self.base_owd_s = min(self.base_owd_s, owd_s)
            delay = owd_s - self.base_owd_s
        else:
            delay = max(0.0, (rtt_s if rtt_s is not None else self.srtt_s) - self.base_rtt_s) \
                if self.base_rtt_s < float("inf") else 0.0
        target = self.p.target_delay_s
        if ecn_ce:
            self._cut(now_s, self.p.max_md, "MULTIPLICATIVE_DECREASE")
            return
        if delay > target:
            self._cut(now_s, min(self.p.max_md, self.p.beta * (delay - target) / delay), "MULTIPLICATIVE_DECREASE")
            return
        if acked_bytes <= 0:
            return
        self.cwnd_bytes += self.p.gain * acked_bytes * (target - delay) / target
        self.events["PROPORTIONAL_INCREASE"] += 1
        self.cwnd_bytes += self.p.mtu_bytes * acked_bytes / self.cwnd_bytes
        self.events["FAIR_INCREASE"] += 1
        self._clamp()

    def on_nack(self, now_s: float) -> None:
        self._cut(now_s, self.p.max_md, "NACK_DECREASE")

    def on_timeout(self, now_s: float) -> None:
        self.cwnd_bytes = float(self.p.min_cwnd_bytes)
        self.last_cut_s = now_s
        self.events["TIMEOUT_DECREASE"] += 1


__all__ = ["Nscc", "NsccParams"]
