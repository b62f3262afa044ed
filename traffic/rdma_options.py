"""The RDMA transport's options (traffic.rdma.RdmaTransport), checked before any device is opened: a value out of
range is a ValueError of one line, which the agent reports and the job's validation can show before anything is
built. Pure; no device needed."""

from __future__ import annotations

from traffic.rdma_credits import MAX_AUTO_SLOTS, MIN_AUTO_SLOTS, check_ring
from traffic.rxe import IB_MTU_ENUM

#: the data protocols (``protocol``; "": eager with ``credits`` > 0, else rendezvous) and their numbers on the wire
PROTOCOLS = {"eager": 1, "rendezvous": 2, "grant": 3}
#: the most ops whose receives a rank grants ahead (``lookahead``; traffic.rdma_staging)
MAX_LOOKAHEAD = 16


def traffic_class_of(dscp: int, traffic_class: int | None) -> int:
    """The GRH traffic class: ``traffic_class`` if given (>= 0), else the DSCP in its upper 6 bits."""
    return (int(dscp) << 2) if traffic_class is None or int(traffic_class) < 0 else int(traffic_class)


def check(dscp, traffic_class, mtu, timeout, retry_cnt, rnr_retry, min_rnr_timer, signal_every, credits: int,
          slot_bytes: int, protocol: str, piece_bytes: int, send_depth: int, recv_depth: int,
          ctl_reserve: int, spin_us: int = 0, lookahead: int = 0) -> tuple[str, int]:
    """(the protocol, the receive queue's depth) the options mean; ValueError (one line) for one out of range."""
    if not 0 <= int(dscp) <= 63:
        raise ValueError(f"dscp must be 0..63 (got {dscp})")
    for nm, val, lo, hi in (("traffic_class", traffic_class_of(dscp, traffic_class), 0, 255),
                            ("timeout", timeout, 0, 31), ("retry_cnt", retry_cnt, 0, 7),
                            ("rnr_retry", rnr_retry, 0, 7), ("min_rnr_timer", min_rnr_timer, 0, 31),
                            ("signal_every", signal_every, 1, 1024), ("spin_us", spin_us, 0, 100_000)):
        if not lo <= int(val) <= hi:
            raise ValueError(f"{nm} must be {lo}..{hi} (got {val})")
    if mtu and int(mtu) not in IB_MTU_ENUM:
        raise ValueError(f"mtu must be one of {sorted(IB_MTU_ENUM)} (got {mtu})")
    # unset: the eager ring is fitted to the peers (auto_slots: at most MAX_AUTO_SLOTS), within what recv_depth
    # allows and never below MIN_AUTO_SLOTS (traffic.rdma_eager.Eager.fit); the checks below hold that least ring
    auto = credits is None
    credits = MIN_AUTO_SLOTS if auto else int(credits)
    check_ring(credits, slot_bytes)
    protocol = protocol or ("eager" if int(credits) else "rendezvous")
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)} (got {protocol!r})")
    if protocol == "eager" and not int(credits):
        raise ValueError("protocol eager needs credits > 0 (credits=0: rendezvous)")
    if int(piece_bytes) < 0:
        raise ValueError(f"piece_bytes must be >= 0 (got {piece_bytes}; 0: a message in one write)")
    if not 0 <= int(lookahead) <= MAX_LOOKAHEAD:
        raise ValueError(f"lookahead must be 0..{MAX_LOOKAHEAD} (got {lookahead}; 0: no receive posted ahead)")
    if int(lookahead) and protocol != "grant":
        raise ValueError(f"lookahead needs protocol grant (got {protocol}): only grants name a receive ahead")
    # receives in use at once: a write per slot of our ring and about as many credit messages
    recv_depth = int(recv_depth) or max(128, 2 * (MAX_AUTO_SLOTS if auto else int(credits)) + 2)
    if int(send_depth) < 2 * ctl_reserve or recv_depth < 2 * int(credits) + 2:
        raise ValueError(f"send_depth must be >= {2 * ctl_reserve} and recv_depth >= 2 x credits + 2")
    return protocol, recv_depth
