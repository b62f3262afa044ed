"""A link (rate, delay, loss, MTU per direction) and the TCP settings of every host: what a fabric's veths and
namespaces are configured with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable

from .base import (CONGESTION_CONTROLS, ETH_HEADER_BYTES, LOAD_BALANCING_MODES, MAX_DELAY_MS, MAX_MTU, MAX_RATE_MBPS,
                   MAX_RTO_MIN_MS, MIN_MTU, MIN_RATE_MBPS, SpecError, _bool, _choice, _fmt, _got, _range, _set)


@dataclass(frozen=True)
class LinkSpec:
    """One full-duplex link. ``delay_ms``/``jitter_ms``/``loss_percent`` apply at each end's egress, i.e. per
    direction: a link's RTT contribution is ``2 * delay_ms``. ``rate_mbps`` is the shaped rate per direction."""

    rate_mbps: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    mtu: int = 1500

    KIND: ClassVar[str] = "link"

    def __post_init__(self) -> None:
        k = self.KIND
        _set(self, "rate_mbps", _range(f"{k}.rate_mbps", self.rate_mbps, 0, lo_open=True))
        _range(f"{k}.rate_mbps", self.rate_mbps, MIN_RATE_MBPS,
               why_lo=" (10 kbit/s: HTB cannot shape meaningfully below that)")
        _range(f"{k}.rate_mbps", self.rate_mbps, hi=MAX_RATE_MBPS,
               why_hi=" (100 Gbit/s; HTB takes 64-bit rates, but a software-shaped veth cannot carry more; "
                      "nothing is capped silently)")
        _set(self, "delay_ms", _range(f"{k}.delay_ms", self.delay_ms, 0, MAX_DELAY_MS))
        _set(self, "jitter_ms", _range(f"{k}.jitter_ms", self.jitter_ms, 0))
        if self.jitter_ms > self.delay_ms:
            raise SpecError(f"{k}.jitter_ms", f"must be <= delay_ms (got jitter {_fmt(self.jitter_ms)} > delay "
                                              f"{_fmt(self.delay_ms)})")
        _set(self, "loss_percent", _range(f"{k}.loss_percent", self.loss_percent, 0, 100))
        _set(self, "mtu", _range(f"{k}.mtu", self.mtu, MIN_MTU, MAX_MTU, integer=True))

    @property
    def rate_bps(self) -> int:
        return int(round(self.rate_mbps * 1_000_000))

    @property
    def frame_bytes(self) -> int:
        """The largest frame the egress qdisc sees: MTU plus the Ethernet header."""
        return self.mtu + ETH_HEADER_BYTES


@dataclass(frozen=True)
class HostTcpSpec:
    """TCP settings applied in every host namespace.

    ``ecn = None`` means: on for dctcp (which requires it), off otherwise. ``rto_min_ms`` (None = kernel default,
    200 ms) is set per route (``ip route ... rto_min``) on the hosts' routes. ``tcp_rmem_bytes``/``tcp_wmem_bytes``
    are the (min, default, max) triples of ``net.ipv4.tcp_rmem``/``tcp_wmem`` (None = kernel default).
    """

    congestion_control: str = "cubic"
    ecn: bool | None = None
    rto_min_ms: int | None = None
    tcp_rmem_bytes: tuple[int, int, int] | None = None
    tcp_wmem_bytes: tuple[int, int, int] | None = None

    KIND: ClassVar[str] = "tcp"

    def __post_init__(self) -> None:
        k = self.KIND
        _choice(f"{k}.congestion_control", self.congestion_control, CONGESTION_CONTROLS, "congestion control")
        if self.ecn is not None:
            _bool(f"{k}.ecn", self.ecn)
            if self.congestion_control == "dctcp" and not self.ecn:
                raise SpecError(f"{k}.ecn", "dctcp requires ECN (got false)")
        if self.rto_min_ms is not None:
            _set(self, "rto_min_ms", _range(f"{k}.rto_min_ms", self.rto_min_ms, 1, MAX_RTO_MIN_MS, integer=True,
                                            why_hi=" (TCP_RTO_MAX is 120 s)"))
        for name in ("tcp_rmem_bytes", "tcp_wmem_bytes"):
            v = getattr(self, name)
            if v is None:
                continue
            p = f"{k}.{name}"
            if isinstance(v, (str, bytes)) or not isinstance(v, Iterable) or len(tuple(v)) != 3:
                raise SpecError(p, f"must be [min, default, max] in bytes (got {_got(v)})")
            t = tuple(_range(p, x, 4096, 2**31 - 1, integer=True) for x in v)
            if not t[0] <= t[1] <= t[2]:
                raise SpecError(p, f"must satisfy min <= default <= max (got {list(t)})")
            _set(self, name, t)

    @property
    def effective_ecn(self) -> bool:
        return self.ecn if self.ecn is not None else self.congestion_control == "dctcp"

    def sysctls(self) -> dict[str, str]:
        """The per-namespace sysctls a builder sets in each host (values as ``sysctl`` strings)."""
        out = {
            "net.ipv4.tcp_congestion_control": self.congestion_control,
            "net.ipv4.tcp_ecn": "1" if self.effective_ecn else "0",
        }
        if self.tcp_rmem_bytes:
            out["net.ipv4.tcp_rmem"] = " ".join(map(str, self.tcp_rmem_bytes))
        if self.tcp_wmem_bytes:
            out["net.ipv4.tcp_wmem"] = " ".join(map(str, self.tcp_wmem_bytes))
        return out


def load_balancing_sysctls(mode: str) -> dict[str, str]:
    """Router sysctls for a load-balancing mode. ``ecmp``: 5-tuple (L4) multipath hash. ``spray``, ``flowlet`` and
    ``adaptive`` keep the same ECMP routes (for anything the sprayer or the flowlet balancer does not handle) so the
    hash policy is the same."""
    _choice("load_balancing", mode, LOAD_BALANCING_MODES, "load-balancing mode")
    return {"net.ipv4.fib_multipath_hash_policy": "1", "net.ipv4.ip_forward": "1"}
