"""DCQCN's end points as a pure reference model (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments",
SIGCOMM 2015): the notification point (NP) of a receiving RoCEv2 NIC, which answers CE-marked packets with at most
one CNP per QP per interval, and the reaction point (RP) of a sending NIC, which cuts a QP's rate on a CNP and
recovers it on timers and a byte counter. The design around rxe, and why each choice: docs/dcqcn.md.

This module is the oracle for the eBPF programs (testbed/kernel/dcqcn.bpf.c) that do the same beside SoftRoCE: it
uses the same integer arithmetic (rates in kbit/s, alpha in Q20 fixed point, times in ns) and the same lazy
evaluation (nothing runs on a timer: each packet and each CNP first advances the QP's state to "now"), so replaying
a run's CNP times and packet sizes through it must give the counters and rates the programs' maps report.
Pure Python: no kernel, no testbed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: alpha = 1 in the Q20 fixed point the state keeps (NICs expose alpha in 1/1024 units: rp_initial_alpha_value)
ALPHA_ONE = 1 << 20
#: g and the initial alpha are given in 1/1024 units, as mlx5's rp_dce_tcp_g and rp_initial_alpha_value
G_UNIT = 1024
#: exact rate-increase steps processed per packet before the steady part is jumped in closed form (the eBPF code's
#: bounded loop); see ReactionPoint._increase
MAX_CATCHUP = 64
#: rounds of MAX_CATCHUP exact steps and a jump; what remains after them is dropped and counted
MAX_ROUNDS = 4
#: the time constants of the paper (40 Gbit/s fabric, microseconds) are multiplied by this for the emulated links
TIME_SCALE = 100


@dataclass(frozen=True)
class Params:
    """One QP's DCQCN parameters, named after the NIC knobs (mlx5 cc_params) with the paper's symbol."""

    line_rate_kbps: int  # the rate a QP starts at and never exceeds
    min_rate_kbps: int  # rp_min_rate: the floor of a cut
    ai_rate_kbps: int  # rp_ai_rate, R_AI: target increase per additive-increase event
    hai_rate_kbps: int  # rp_hai_rate, R_HAI: target increase per hyper-increase event
    g: int  # rp_dce_tcp_g, g in 1/1024 units (paper: 1/256 = 4)
    alpha_timer_ns: int  # rp_dce_tcp_rtt, K: alpha decays once per K without a CNP
    increase_timer_ns: int  # rp_time_reset, T: one rate-increase event per T
    byte_reset: int  # rp_byte_reset, B: one rate-increase event per B bytes sent
    threshold: int  # rp_threshold, F: fast-recovery events before additive increase
    cnp_interval_ns: int  # np_min_time_between_cnps, N: at most one CNP per QP per N (NP)
    cut_interval_ns: int  # rp_rate_reduce_monitor_period: at most one cut per this (RP)
    initial_alpha: int = G_UNIT  # rp_initial_alpha_value in 1/1024 units: 1024 = 1, the first cut halves

    def __post_init__(self):
        if not 0 < self.min_rate_kbps <= self.line_rate_kbps:
            raise ValueError(f"min_rate_kbps must be in (0, line_rate_kbps={self.line_rate_kbps}], "
                             f"got {self.min_rate_kbps}")
        for name in ("ai_rate_kbps", "hai_rate_kbps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.g < G_UNIT:
            raise ValueError(f"g (1/{G_UNIT} units) must be in (0, {G_UNIT}), got {self.g}")
        if not 0 <= self.initial_alpha <= G_UNIT:
            raise ValueError(f"initial_alpha (1/{G_UNIT} units) must be in [0, {G_UNIT}], got {self.initial_alpha}")
        for name in ("alpha_timer_ns", "increase_timer_ns", "byte_reset", "cnp_interval_ns"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.cut_interval_ns < 0 or not 0 < self.threshold < 32:
            raise ValueError("cut_interval_ns must be >= 0 and threshold (F) in [1, 31]")


def scaled(line_rate_mbps: float, time_scale: int = TIME_SCALE) -> Params:
    """The paper's parameters (docs/dcqcn.md, table) for a link of `line_rate_mbps`: rates as the same fraction of
    the line rate, time constants times `time_scale`, the byte counter as the same time at line rate."""
    if not 0 < line_rate_mbps <= 100_000:
        raise ValueError(f"line_rate_mbps must be in (0, 100000], got {line_rate_mbps}")
    line = round(line_rate_mbps * 1000)
    us = 1000 * time_scale  # one paper microsecond, in ns here
    return Params(line_rate_kbps=line, min_rate_kbps=max(1, line // 100), ai_rate_kbps=max(1, line // 1000),
                  hai_rate_kbps=max(1, line // 100), g=4, alpha_timer_ns=55 * us, increase_timer_ns=55 * us,
                  byte_reset=max(1, round(line * 1000 / 8 * 0.002 * time_scale)), threshold=5,
                  cnp_interval_ns=50 * us, cut_interval_ns=50 * us)


def alpha_decay(alpha: int, g: int, n: int) -> int:
    """alpha (Q20) times (1 - g/1024)^n, by squaring in Q20 (at most 32 rounds: the eBPF code's loop)."""
    factor, result = (G_UNIT - g) << 10, ALPHA_ONE
    for _ in range(32):
        if n == 0:
            break
        if n & 1:
            result = result * factor >> 20
        factor = factor * factor >> 20
        n >>= 1
    if n:  # more than 2^32 periods: nothing is left
        return 0
    return alpha * result >> 20


@dataclass
class ReactionPoint:
    """One QP's rate limiter at the sender (the NIC's RP), advanced lazily: call :meth:`advance` (or the event
    methods, which call it) with non-decreasing times in ns."""

    p: Params
    now_ns: int = 0
    rc_kbps: int = field(init=False)  # current rate R_C
    rt_kbps: int = field(init=False)  # target rate R_T
    alpha: int = field(init=False)  # Q20
    alpha_t0_ns: int = field(init=False)  # start of the running alpha period
    inc_t0_ns: int = field(init=False)  # start of the running rate-increase timer period
    bytes_since: int = 0  # bytes sent since the last byte-counter event
    t_count: int = 0  # rate-increase timer events since the last cut
    bc_count: int = 0  # byte-counter events since the last cut
    last_cut_ns: int | None = None
    next_tx_ns: int = field(init=False)
    cnp_received: int = 0
    cnp_ignored: int = 0
    rate_cuts: int = 0
    dropped_events: int = 0
    max_catchup: int = MAX_CATCHUP

    def __post_init__(self):
        self.rc_kbps = self.rt_kbps = self.p.line_rate_kbps
        self.alpha = self.p.initial_alpha << 10
        self.alpha_t0_ns = self.inc_t0_ns = self.next_tx_ns = self.now_ns

    # --- time -------------------------------------------------------------------------------------------------
    def advance(self, now_ns: int) -> None:
        """Process the alpha and rate-increase timer events that fell between the last call and `now_ns`."""
        now_ns = max(now_ns, self.now_ns)  # a clock that steps back is held (the kernel's is monotonic)
        self.now_ns = now_ns
        k = (now_ns - self.alpha_t0_ns) // self.p.alpha_timer_ns
        if k:
            self.alpha = alpha_decay(self.alpha, self.p.g, k)
            self.alpha_t0_ns += k * self.p.alpha_timer_ns
        n = (now_ns - self.inc_t0_ns) // self.p.increase_timer_ns
        if n:
            self.inc_t0_ns += n * self.p.increase_timer_ns
            self._increase(n, timer=True)

    # --- events -----------------------------------------------------------------------------------------------
    def on_cnp(self, now_ns: int) -> bool:
        """A CNP for this QP arrived: cut (True) unless the last cut is younger than the cut interval."""
        self.advance(now_ns)
        now_ns = self.now_ns
        self.cnp_received += 1
        self.alpha_t0_ns = now_ns  # a CNP restarts the alpha period ("K without a CNP")
        if self.last_cut_ns is not None and now_ns - self.last_cut_ns < self.p.cut_interval_ns:
            self.cnp_ignored += 1
            return False
        self.rt_kbps = self.rc_kbps
        self.rc_kbps = max(self.p.min_rate_kbps, self.rc_kbps - (self.rc_kbps * self.alpha >> 21))
        g = self.p.g
        self.alpha = min(ALPHA_ONE, (self.alpha * (G_UNIT - g) >> 10) + (g << 10))
        self.inc_t0_ns = now_ns
        self.bytes_since = self.t_count = self.bc_count = 0
        self.last_cut_ns = now_ns
        self.rate_cuts += 1
        return True

    def on_sent(self, now_ns: int, length_bytes: int) -> None:
        """`length_bytes` left on this QP: the byte counter's events."""
        self.advance(now_ns)
        self.bytes_since += length_bytes
        n, self.bytes_since = divmod(self.bytes_since, self.p.byte_reset)
        if n:
            self._increase(n, timer=False)

    def departure(self, now_ns: int, length_bytes: int) -> int:
        """The time (ns) a packet of `length_bytes` handed over at `now_ns` may leave at the current rate (what the
        egress program writes into skb->tstamp for the fq qdisc), counted by the byte counter."""
        self.advance(now_ns)
        t = max(self.now_ns, self.next_tx_ns)
        self.next_tx_ns = t + length_bytes * 8_000_000 // self.rc_kbps
        self.on_sent(now_ns, length_bytes)
        return t

    # --- rate increase ----------------------------------------------------------------------------------------
    def phase(self) -> str:
        """The stage the next increase is in: fast recovery, additive or hyper increase."""
        f = self.p.threshold
        if max(self.t_count, self.bc_count) <= f:
            return "fast"
        return "hyper" if min(self.t_count, self.bc_count) > f else "additive"

    def _step_size(self, phase: str) -> int:
        return {"fast": 0, "additive": self.p.ai_rate_kbps, "hyper": self.p.hai_rate_kbps}[phase]

    def _one(self, timer: bool) -> None:
        if timer:
            self.t_count += 1
        else:
            self.bc_count += 1
        d = self._step_size(self.phase())
        self.rt_kbps = min(self.p.line_rate_kbps, self.rt_kbps + d)
        self.rc_kbps = (self.rt_kbps + self.rc_kbps + 1) >> 1  # rounded up, so Rc reaches Rt

    def _settled(self, timer: bool) -> tuple[bool, int]:
        """Whether every further event of this kind repeats the last one (same stage, the step size d, and the gap
        e = Rt - Rc at a fixed point of e -> floor((e + d) / 2), which is d or d - 1), so that m of them can be
        applied at once: Rt += m*d, Rc = Rt - e."""
        count, other = (self.t_count, self.bc_count) if timer else (self.bc_count, self.t_count)
        f = self.p.threshold
        if count < f:
            return False, 0  # the next event may still be fast recovery
        d = self.p.hai_rate_kbps if other > f else self.p.ai_rate_kbps
        if self.rt_kbps >= self.p.line_rate_kbps:
            d = 0
        e = self.rt_kbps - self.rc_kbps
        return (e + d) >> 1 == e, d

    def _increase(self, n: int, timer: bool) -> None:
        """n rate-increase events of one kind: exact steps, and when a bounded batch of them has not used them up
        and the state is settled, the steady remainder in closed form (stopping short of the line rate, where the
        step size changes); what is left after MAX_ROUNDS such rounds is counted in dropped_events."""
        for _ in range(MAX_ROUNDS):
            steps = min(n, self.max_catchup)
            for _ in range(steps):
                self._one(timer)
            n -= steps
            if n == 0:
                return
            ok, d = self._settled(timer)
            if not ok:
                break
            jump = n if d == 0 else min(n, max(0, (self.p.line_rate_kbps - self.rt_kbps - 1) // d))
            e = self.rt_kbps - self.rc_kbps
            self.rt_kbps += jump * d
            self.rc_kbps = self.rt_kbps - e
            if timer:
                self.t_count += jump
            else:
                self.bc_count += jump
            n -= jump
            if n == 0:
                return
        self.dropped_events += n


@dataclass
class NotificationPoint:
    """The receiving NIC's NP for all its QPs: a CE-marked packet for local QP `qpn` makes a CNP unless one went to
    that QP's sender less than the CNP interval ago."""

    cnp_interval_ns: int
    last_cnp_ns: dict[int, int] = field(default_factory=dict)
    ce_seen: int = 0
    cnp_sent: int = 0
    cnp_suppressed: int = 0

    def on_ce(self, now_ns: int, qpn: int) -> bool:
        self.ce_seen += 1
        last = self.last_cnp_ns.get(qpn)
        if last is not None and now_ns - last < self.cnp_interval_ns:
            self.cnp_suppressed += 1
            return False
        self.last_cnp_ns[qpn] = now_ns
        self.cnp_sent += 1
        return True


__all__ = ["ALPHA_ONE", "G_UNIT", "MAX_CATCHUP", "NotificationPoint", "Params", "ReactionPoint", "TIME_SCALE",
           "alpha_decay", "scaled"]
