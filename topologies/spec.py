"""Pure topology specifications: frozen, validated dataclasses. No kernel access.

Every spec validates itself in ``__post_init__`` and raises :class:`SpecError` with a one-line message that names
the field, e.g. ``link.rate_mbps: must be > 0 (got -5)``. Units are part of the field names (``_mbps``, ``_ms``,
``_bytes``, ``_packets``, ``_percent``).

The records a fabric builder consumes (:class:`Node`, :class:`Link`, :class:`PortSpec`, :class:`Interface`,
:class:`Route`, :class:`Hop`) also live here; the :class:`~topologies.topology.Topology` base shared by every
topology is in topology.py (above addressing and routing, which it uses), so the builder treats leaf-spine and
dumbbell fabrics the same way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Iterable, Mapping, NamedTuple

# ---- constants ------------------------------------------------------------------------------------------------

#: Linux IFNAMSIZ is 16 bytes including the terminating NUL: at most 15 characters per interface name.
IFNAMSIZ = 16
MAX_IFNAME_LEN = IFNAMSIZ - 1

#: The most a link may be shaped to. HTB takes 64-bit rates (``rate64``, Linux >= 3.13), so the kernel itself
#: accepts far more, but a veth pair shaped in software stops being a faithful wire long before this; there is
#: deliberately no silent lower cap (Mininet's TCLink silently clamps at 1000 Mbit/s; we do not).
MAX_RATE_MBPS = 100_000
#: Below ~10 kbit/s HTB's byte-granular rate tables and the burst computation stop making sense.
MIN_RATE_MBPS = 0.01
MAX_DELAY_MS = 10_000
MIN_MTU = 576
MAX_MTU = 9000
#: Bytes the qdisc sees on top of the IP MTU (Ethernet header; veth does not add an FCS).
ETH_HEADER_BYTES = 14
#: qdisc limits are 32-bit; we stop well before that.
MAX_BUFFER_BYTES = 1 << 30
MAX_BUFFER_PACKETS = 1_000_000

DISCIPLINES = ("droptail", "red", "step")
CONGESTION_CONTROLS = ("cubic", "reno", "dctcp", "bbr")
LOAD_BALANCING_MODES = ("ecmp", "spray", "flowlet", "adaptive")
ROLES = ("host", "leaf", "spine", "switch")
#: TCP_RTO_MAX in Linux is 120 s; per-route ``rto_min`` is in milliseconds.
MAX_RTO_MIN_MS = 120_000
MAX_CLASSES = 8  # 802.1p priorities / HTB prio levels 0..7

HOST_IFNAME = "eth0"

_NODE_NAME_RE = re.compile(r"^[a-z][a-z0-9]*$")
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
_CLASS_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,14}$")


# ---- errors and small validators --------------------------------------------------------------------------------


class SpecError(ValueError):
    """A specification is invalid. ``path`` names the field (``fabric_link.rate_mbps``), ``message`` says why."""

    def __init__(self, path: str, message: str, *, source: str | None = None):
        self.path = path
        self.message = message
        self.source = source
        super().__init__(self._text())

    def _text(self) -> str:
        head = f"{self.path}: {self.message}" if self.path else self.message
        text = f"{self.source}: {head}" if self.source else head
        # one line, whatever a file name or a document's key holds
        return text.replace("\r", "\\r").replace("\n", "\\n")

    def rebased(self, old: str, new: str) -> "SpecError":
        """The same error with the leading path component ``old`` (a spec kind like ``link``) replaced by ``new``.

        ``old == ""`` means the path is relative (top-level spec) and ``new`` is simply prepended.
        """
        path = self.path
        if old and (path == old or path.startswith(old + ".") or path.startswith(old + "[")):
            path = path[len(old):]
        elif old:
            return SpecError(path, self.message, source=self.source)
        if not new:
            path = path.lstrip(".")
        elif path and not path.startswith((".", "[")):
            path = new + "." + path
        else:
            path = new + path
        return SpecError(path, self.message, source=self.source)


def _got(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (frozenset, set)):
        return "{" + ", ".join(str(v) for v in sorted(value)) + "}"
    return str(value)


def _number(path: str, value: Any, *, integer: bool = False) -> int | float:
    """Check that ``value`` is a finite number (an int if ``integer``; integral floats are accepted and converted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(path, f"must be {'an integer' if integer else 'a number'} (got {_got(value)})")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(path, f"must be finite (got {value})")
    if integer:
        if isinstance(value, float):
            if not value.is_integer():
                raise SpecError(path, f"must be an integer (got {value})")
            value = int(value)
        return value
    return float(value)


def _range(path: str, value: Any, lo: float | None = None, hi: float | None = None, *, integer: bool = False,
           lo_open: bool = False, why_hi: str = "", why_lo: str = "") -> int | float:
    v = _number(path, value, integer=integer)
    if lo is not None:
        if lo_open and not v > lo:
            raise SpecError(path, f"must be > {_fmt(lo)}{why_lo} (got {_got(value)})")
        if not lo_open and not v >= lo:
            raise SpecError(path, f"must be >= {_fmt(lo)}{why_lo} (got {_got(value)})")
    if hi is not None and not v <= hi:
        raise SpecError(path, f"must be <= {_fmt(hi)}{why_hi} (got {_got(value)})")
    return v


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _bool(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(path, f"must be true or false (got {_got(value)})")
    return value


def _choice(path: str, value: Any, allowed: Iterable[str], what: str) -> str:
    allowed = tuple(allowed)
    if value not in allowed:
        raise SpecError(path, f"unknown {what} {_got(value)} (allowed: {', '.join(allowed)})")
    return value


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def validate_ifname(path: str, name: Any) -> str:
    """Check a Linux interface name: 1..15 characters, not ``.``/``..``, no ``/``, ``:`` or whitespace."""
    if not isinstance(name, str) or not name:
        raise SpecError(path, f"interface name must be a non-empty string (got {_got(name)})")
    if len(name) > MAX_IFNAME_LEN:
        raise SpecError(path, f"interface name {name!r} is {len(name)} characters; Linux allows at most "
                              f"{MAX_IFNAME_LEN} (IFNAMSIZ {IFNAMSIZ} including the NUL)")
    if name in (".", "..") or any(c in name for c in "/:") or any(c.isspace() for c in name):
        raise SpecError(path, f"interface name {name!r} is not valid in Linux (no '/', ':' or whitespace)")
    return name


def validate_node_name(path: str, name: Any) -> str:
    """Node names are lowercase alphanumerics starting with a letter, and short enough to name a peer port."""
    if not isinstance(name, str) or not _NODE_NAME_RE.match(name):
        raise SpecError(path, f"node name must match [a-z][a-z0-9]* (got {_got(name)})")
    validate_ifname(path, name)  # routers name their ports after the peer node
    return name


def validate_prefix(path: str, prefix: Any) -> str:
    if not isinstance(prefix, str) or not _PREFIX_RE.match(prefix):
        raise SpecError(path, f"must be 1..8 characters matching [a-z][a-z0-9]* (got {_got(prefix)})")
    return prefix


def root_ifname(prefix: str, link_index: int, side: str) -> str:
    """A short, run-unique name for a veth end while it still sits in the root namespace (``tb12a``).

    Only needed by a builder that creates veth pairs in the root namespace before moving them; creating the pair
    directly inside the target namespaces avoids root names altogether.
    """
    if side not in ("a", "b"):
        raise ValueError("side must be 'a' or 'b'")
    return validate_ifname("root_ifname", f"{prefix}{link_index}{side}")


# ---- queues, classes, links, hosts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueSpec:
    """The queue discipline under a port's shaper.

    * ``droptail``: a FIFO of ``buffer_bytes`` (bfifo) xor ``buffer_packets`` (pfifo); drops on overflow.
    * ``red``: RED with ``min_bytes < max_bytes <= buffer``, marking ``probability`` at ``max_bytes``, optional
      ``burst_packets``; ``ecn = true`` marks ECN-capable packets instead of dropping them.
    * ``step``: DCTCP-style step marking: every ECN-capable packet is CE-marked while the instantaneous queue
      exceeds K (``k_packets`` xor ``k_bytes``); K must be below the buffer. Drops only on overflow.

    ``avpkt_bytes`` is the typical packet size: RED's ``avpkt``, and the conversion used when K and the buffer
    are given in different units.
    """

    discipline: str = "droptail"
    buffer_bytes: int | None = None
    buffer_packets: int | None = None
    avpkt_bytes: int = 1500
    min_bytes: int | None = None
    max_bytes: int | None = None
    probability: float | None = None
    ecn: bool = False
    burst_packets: int | None = None
    k_packets: int | None = None
    k_bytes: int | None = None

    KIND: ClassVar[str] = "queue"
    _OWN: ClassVar[dict[str, tuple[str, ...]]] = {
        "red": ("min_bytes", "max_bytes", "probability", "burst_packets"),
        "step": ("k_packets", "k_bytes"),
    }

    def __post_init__(self) -> None:
        k = self.KIND
        _choice(f"{k}.discipline", self.discipline, DISCIPLINES, "discipline")
        if (self.buffer_bytes is None) == (self.buffer_packets is None):
            got = "neither" if self.buffer_bytes is None else "both"
            raise SpecError(f"{k}.buffer_bytes", f"set exactly one of buffer_bytes or buffer_packets (got {got})")
        if self.buffer_bytes is not None:
            _set(self, "buffer_bytes", _range(f"{k}.buffer_bytes", self.buffer_bytes, 1, MAX_BUFFER_BYTES,
                                              integer=True))
        else:
            _set(self, "buffer_packets", _range(f"{k}.buffer_packets", self.buffer_packets, 1, MAX_BUFFER_PACKETS,
                                                integer=True))
        _set(self, "avpkt_bytes", _range(f"{k}.avpkt_bytes", self.avpkt_bytes, 64, 65535, integer=True))
        _bool(f"{k}.ecn", self.ecn)
        # fields that belong to another discipline must stay unset
        for disc, names in self._OWN.items():
            if disc == self.discipline:
                continue
            for name in names:
                if getattr(self, name) is not None:
                    raise SpecError(f"{k}.{name}", f"only used by discipline {disc!r} "
                                                   f"(discipline is {self.discipline!r})")
        if self.ecn and self.discipline != "red":
            raise SpecError(f"{k}.ecn", "only used by discipline 'red' (step always marks; droptail never does)")
        if self.discipline == "red":
            self._check_red()
        elif self.discipline == "step":
            self._check_step()

    def _check_red(self) -> None:
        k = self.KIND
        for name in ("min_bytes", "max_bytes", "probability"):
            if getattr(self, name) is None:
                raise SpecError(f"{k}.{name}", "required for discipline 'red'")
        lo = _range(f"{k}.min_bytes", self.min_bytes, 1, integer=True)
        hi = _range(f"{k}.max_bytes", self.max_bytes, 1, integer=True)
        _set(self, "min_bytes", lo)
        _set(self, "max_bytes", hi)
        if not lo < hi:
            raise SpecError(f"{k}.min_bytes", f"must be < max_bytes (got min {lo} >= max {hi})")
        if hi > self.limit_bytes:
            raise SpecError(f"{k}.max_bytes", f"must be <= the buffer (got max {hi} > buffer {self.limit_bytes} "
                                              f"bytes)")
        _set(self, "probability", _range(f"{k}.probability", self.probability, 0, 1, lo_open=True))
        if self.burst_packets is not None:
            _set(self, "burst_packets", _range(f"{k}.burst_packets", self.burst_packets, 1, integer=True))

    def _check_step(self) -> None:
        k = self.KIND
        if (self.k_packets is None) == (self.k_bytes is None):
            got = "neither" if self.k_packets is None else "both"
            raise SpecError(f"{k}.k_packets", f"discipline 'step' needs exactly one of k_packets or k_bytes "
                                              f"(got {got})")
        if self.k_packets is not None:
            kp = _range(f"{k}.k_packets", self.k_packets, 1, integer=True)
            _set(self, "k_packets", kp)
            if self.buffer_packets is not None:
                if not kp < self.buffer_packets:
                    raise SpecError(f"{k}.k_packets", f"K must be < the buffer (got K {kp} packets >= buffer "
                                                      f"{self.buffer_packets} packets)")
            elif not kp * self.avpkt_bytes < self.limit_bytes:
                raise SpecError(f"{k}.k_packets", f"K must be < the buffer (got K {kp} packets x "
                                                  f"{self.avpkt_bytes} bytes >= buffer {self.limit_bytes} bytes)")
        else:
            kb = _range(f"{k}.k_bytes", self.k_bytes, 1, integer=True)
            _set(self, "k_bytes", kb)
            if not kb < self.limit_bytes:
                raise SpecError(f"{k}.k_bytes", f"K must be < the buffer (got K {kb} bytes >= buffer "
                                                f"{self.limit_bytes} bytes)")

    @property
    def limit_bytes(self) -> int:
        """The buffer in bytes (``buffer_packets`` converted with ``avpkt_bytes``)."""
        if self.buffer_bytes is not None:
            return self.buffer_bytes
        return self.buffer_packets * self.avpkt_bytes  # type: ignore[operator]

    @property
    def threshold_bytes(self) -> int | None:
        """For ``step``: K in bytes; else None."""
        if self.discipline != "step":
            return None
        return self.k_bytes if self.k_bytes is not None else self.k_packets * self.avpkt_bytes  # type: ignore

    @property
    def marks_ecn(self) -> bool:
        return self.discipline == "step" or (self.discipline == "red" and self.ecn)

    @property
    def drops_early(self) -> bool:
        """RED without ECN drops packets before the buffer is full."""
        return self.discipline == "red" and not self.ecn


@dataclass(frozen=True)
class ClassSpec:
    """A traffic class on a port: DSCP values, strict ``priority`` (0 = highest) xor ``weight``, optional own
    ``queue`` (None = the port tier's queue), and optional losslessness (PFC on 802.1p priority ``pcp`` with
    ``xon_bytes < xoff_bytes`` and ``xoff_bytes + headroom_bytes <= buffer``).
    """

    name: str
    dscp: frozenset[int] = frozenset()
    priority: int | None = None
    weight: int | None = None
    queue: QueueSpec | None = None
    lossless: bool = False
    pcp: int | None = None
    xoff_bytes: int | None = None
    xon_bytes: int | None = None
    headroom_bytes: int | None = None
    default: bool = False

    KIND: ClassVar[str] = "class"

    def __post_init__(self) -> None:
        k = self.KIND
        if not isinstance(self.name, str) or not _CLASS_NAME_RE.match(self.name):
            raise SpecError(f"{k}.name", f"must be 1..15 characters matching [a-z][a-z0-9_-]* "
                                         f"(got {_got(self.name)})")
        if isinstance(self.dscp, (str, bytes, int)) or not isinstance(self.dscp, Iterable):
            raise SpecError(f"{k}.dscp", f"must be a set of DSCP values 0..63 (got {_got(self.dscp)})")
        _set(self, "dscp", frozenset(_range(f"{k}.dscp", d, 0, 63, integer=True) for d in self.dscp))
        if (self.priority is None) == (self.weight is None):
            got = "neither" if self.priority is None else "both"
            raise SpecError(f"{k}.priority", f"set exactly one of priority (strict) or weight (weighted) "
                                             f"(got {got})")
        if self.priority is not None:
            _set(self, "priority", _range(f"{k}.priority", self.priority, 0, 7, integer=True))
        else:
            _set(self, "weight", _range(f"{k}.weight", self.weight, 1, 1000, integer=True))
        if self.queue is not None and not isinstance(self.queue, QueueSpec):
            raise SpecError(f"{k}.queue", f"must be a QueueSpec (got {_got(self.queue)})")
        _bool(f"{k}.lossless", self.lossless)
        _bool(f"{k}.default", self.default)
        if self.pcp is not None:
            _set(self, "pcp", _range(f"{k}.pcp", self.pcp, 0, 7, integer=True))
        pfc = ("xoff_bytes", "xon_bytes", "headroom_bytes")
        if not self.lossless:
            for name in pfc:
                if getattr(self, name) is not None:
                    raise SpecError(f"{k}.{name}", "only used by lossless classes (lossless is false)")
            return
        if self.pcp is None:
            raise SpecError(f"{k}.pcp", "a lossless class needs the 802.1p priority (0..7) that PFC pauses")
        for name in pfc:
            if getattr(self, name) is None:
                raise SpecError(f"{k}.{name}", "required for a lossless class")
        _set(self, "xoff_bytes", _range(f"{k}.xoff_bytes", self.xoff_bytes, 1, integer=True))
        _set(self, "xon_bytes", _range(f"{k}.xon_bytes", self.xon_bytes, 0, integer=True))
        _set(self, "headroom_bytes", _range(f"{k}.headroom_bytes", self.headroom_bytes, 0, integer=True))
        if not self.xon_bytes < self.xoff_bytes:
            raise SpecError(f"{k}.xon_bytes", f"must be < xoff_bytes (got xon {self.xon_bytes} >= "
                                              f"xoff {self.xoff_bytes})")
        if self.queue is not None:
            self.check_queue(self.queue, where="its own queue", path=k)

    def check_queue(self, queue: QueueSpec, *, where: str, path: str) -> None:
        """Check this (lossless) class against the queue it will use; ``path`` prefixes the error."""
        if not self.lossless:
            return
        if queue.drops_early:
            raise SpecError(f"{path}.lossless", f"a lossless class cannot use a RED queue without ecn "
                                                f"({where} drops early)")
        need = self.xoff_bytes + self.headroom_bytes  # type: ignore[operator]
        if need > queue.limit_bytes:
            raise SpecError(f"{path}.xoff_bytes", f"xoff_bytes + headroom_bytes must fit the buffer (got "
                                                  f"{self.xoff_bytes} + {self.headroom_bytes} = {need} > "
                                                  f"{queue.limit_bytes} bytes of {where})")


def validate_classes(classes: Any, path: str = "classes") -> tuple[ClassSpec, ...]:
    """Check a port's class set: at most 8, unique names, disjoint DSCPs, unique pcp, exactly one default."""
    if isinstance(classes, (str, bytes)) or not isinstance(classes, Iterable):
        raise SpecError(path, f"must be a list of classes (got {_got(classes)})")
    classes = tuple(classes)
    if not classes:
        return ()
    if len(classes) > MAX_CLASSES:
        raise SpecError(path, f"at most {MAX_CLASSES} classes (got {len(classes)})")
    names: set[str] = set()
    dscp_owner: dict[int, str] = {}
    pcp_owner: dict[int, str] = {}
    for i, c in enumerate(classes):
        p = f"{path}[{i}]"
        if not isinstance(c, ClassSpec):
            raise SpecError(p, f"must be a ClassSpec (got {_got(c)})")
        if c.name in names:
            raise SpecError(f"{p}.name", f"duplicate class name {c.name!r}")
        names.add(c.name)
        for d in sorted(c.dscp):
            if d in dscp_owner:
                raise SpecError(f"{p}.dscp", f"DSCP {d} already belongs to class {dscp_owner[d]!r}")
            dscp_owner[d] = c.name
        if c.pcp is not None:
            if c.pcp in pcp_owner:
                raise SpecError(f"{p}.pcp", f"802.1p priority {c.pcp} already belongs to class "
                                            f"{pcp_owner[c.pcp]!r}")
            pcp_owner[c.pcp] = c.name
    defaults = [c.name for c in classes if c.default]
    if len(defaults) != 1:
        raise SpecError(path, f"exactly one class must have default = true (got {len(defaults)})")
    return classes


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


# ---- the records a builder consumes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PortSpec:
    """What sits on one port's egress: the tier it belongs to, the tier queue, and the resolved classes (each
    class's ``queue`` filled in with the tier queue when it had none). No classes = one classless queue.
    ``rate_mbps``: this egress's own shaped rate (a per-port override, topologies/overrides.py); None = the link's.
    """

    tier: str
    queue: QueueSpec
    classes: tuple[ClassSpec, ...] = ()
    rate_mbps: float | None = None

    @property
    def classless(self) -> bool:
        return not self.classes


def resolve_port(tier: str, queue: QueueSpec, classes: tuple[ClassSpec, ...], *, queue_path: str,
                 classes_path: str = "classes", frame_bytes: int | None = None) -> PortSpec:
    """Build the :class:`PortSpec` of a tier, checking the tier queue and each class's (effective) queue.

    ``frame_bytes``: the largest frame on the port; every queue must hold at least one.
    """
    if not isinstance(queue, QueueSpec):
        raise SpecError(queue_path, f"must be a QueueSpec (got {_got(queue)})")
    resolved = []
    for i, c in enumerate(classes):
        q = c.queue if c.queue is not None else queue
        where = f"class {c.name!r}'s own queue" if c.queue is not None else f"the {queue_path} buffer"
        c.check_queue(q, where=where, path=f"{classes_path}[{i}]")
        if frame_bytes is not None and q.limit_bytes < frame_bytes and c.queue is not None:
            raise SpecError(f"{classes_path}[{i}].queue.buffer_bytes",
                            f"must hold one {frame_bytes}-byte frame (got {q.limit_bytes} bytes)")
        resolved.append(c if c.queue is not None else _replace_queue(c, queue))
    if frame_bytes is not None and queue.limit_bytes < frame_bytes:
        field = "buffer_bytes" if queue.buffer_bytes is not None else "buffer_packets"
        raise SpecError(f"{queue_path}.{field}", f"must hold one {frame_bytes}-byte frame (MTU + Ethernet header) "
                                                 f"(got {queue.limit_bytes} bytes)")
    return PortSpec(tier, queue, tuple(resolved))


def _replace_queue(c: ClassSpec, queue: QueueSpec) -> ClassSpec:
    kw = {f.name: getattr(c, f.name) for f in fields(c)}
    kw["queue"] = queue
    return ClassSpec(**kw)


@dataclass(frozen=True)
class Node:
    """A namespace: ``name`` (``h1``, ``leaf1``, ``spine1``, ``s1``), ``role`` (host|leaf|spine|switch) and the
    network-namespace name ``<prefix>-<name>``."""

    name: str
    role: str
    namespace: str

    @property
    def is_host(self) -> bool:
        return self.role == "host"


@dataclass(frozen=True)
class Link:
    """A veth pair between ``a``:``a_port`` and ``b``:``b_port`` with its :class:`LinkSpec` and what sits on each
    end's egress (``a_egress`` shapes traffic a -> b, ``b_egress`` traffic b -> a)."""

    a: str
    a_port: str
    b: str
    b_port: str
    spec: LinkSpec
    a_egress: PortSpec
    b_egress: PortSpec

    KIND: ClassVar[str] = "link"

    def __post_init__(self) -> None:
        validate_ifname(f"{self.KIND}.a_port", self.a_port)
        validate_ifname(f"{self.KIND}.b_port", self.b_port)
        if self.a == self.b:
            raise SpecError(f"{self.KIND}.b", f"a link cannot join {self.a!r} to itself")

    @property
    def name(self) -> str:
        return f"{self.a}:{self.a_port}-{self.b}:{self.b_port}"

    def port_of(self, node: str) -> str:
        if node == self.a:
            return self.a_port
        if node == self.b:
            return self.b_port
        raise KeyError(node)

    def peer_of(self, node: str) -> tuple[str, str]:
        """(peer node, peer port) seen from ``node``."""
        if node == self.a:
            return self.b, self.b_port
        if node == self.b:
            return self.a, self.a_port
        raise KeyError(node)

    def egress_of(self, node: str) -> PortSpec:
        if node == self.a:
            return self.a_egress
        if node == self.b:
            return self.b_egress
        raise KeyError(node)


class EgressPort(NamedTuple):
    """One shaped egress: HTB at :attr:`rate_mbps` with ``port``'s queue(s) below it."""

    node: str
    ifname: str
    peer: str
    peer_ifname: str
    link: LinkSpec
    port: PortSpec

    @property
    def rate_mbps(self) -> float:
        """The shaped rate of this direction: the port's own (a per-port override) or else the link's."""
        return self.port.rate_mbps if self.port.rate_mbps is not None else self.link.rate_mbps


@dataclass(frozen=True)
class Interface:
    """An addressed interface. ``prefixlen`` is 32 for host-facing ports and hosts (routed, see addressing) and 31
    for router-to-router links."""

    node: str
    ifname: str
    ip: str
    prefixlen: int
    mac: str

    @property
    def cidr(self) -> str:
        return f"{self.ip}/{self.prefixlen}"


class NextHop(NamedTuple):
    ifname: str
    gateway: str | None  # None: the destination is directly on that interface (scope link)


@dataclass(frozen=True)
class Route:
    """A static route to install in ``node``. Several nexthops = an ECMP (multipath) route. ``onlink``: the gateway
    is reachable on the interface although no prefix covers it. ``rto_min_ms``: per-route TCP ``rto_min``."""

    node: str
    dst: str
    nexthops: tuple[NextHop, ...]
    onlink: bool = False
    rto_min_ms: int | None = None

    @property
    def ecmp(self) -> bool:
        return len(self.nexthops) > 1


class Hop(NamedTuple):
    """One directed hop of a path: leaves ``node`` through egress ``port`` and arrives at ``peer``:``peer_port``.
    ``(node, port)`` is the queue the packet waited in (the ``node``/``port`` columns of ``queues.csv``)."""

    node: str
    port: str
    peer: str
    peer_port: str


def check_graph(nodes: Iterable[Node], links: Iterable[Link]) -> None:
    """Structural checks every topology must pass: unique names, valid roles, links between known nodes, unique
    port names per node, hosts attached by exactly one link to a router."""
    seen: dict[str, Node] = {}
    for n in nodes:
        validate_node_name("nodes", n.name)
        _choice("nodes.role", n.role, ROLES, "role")
        if n.name in seen:
            raise SpecError("nodes", f"duplicate node name {n.name!r}")
        seen[n.name] = n
    ports: set[tuple[str, str]] = set()
    degree: dict[str, int] = {}
    for l in links:
        for node, port, peer in ((l.a, l.a_port, l.b), (l.b, l.b_port, l.a)):
            if node not in seen:
                raise SpecError("links", f"link {l.name} names unknown node {node!r}")
            if (node, port) in ports:
                raise SpecError("links", f"port {port!r} used twice on node {node!r}")
            ports.add((node, port))
            degree[node] = degree.get(node, 0) + 1
        if seen[l.a].is_host and seen[l.b].is_host:
            raise SpecError("links", f"link {l.name} joins two hosts; hosts attach to a router")
    for n in seen.values():
        if n.is_host and degree.get(n.name, 0) != 1:
            raise SpecError("links", f"host {n.name!r} must have exactly one link (got {degree.get(n.name, 0)})")


def spec_dict(obj: Any) -> Any:
    """A JSON-friendly dict of a spec (frozensets as sorted lists, tuples as lists, None fields dropped)."""
    if hasattr(obj, "__dataclass_fields__"):
        out = {}
        for f in fields(obj):
            v = getattr(obj, f.name)
            if v is None:
                continue
            out[f.name] = spec_dict(v)
        return out
    if isinstance(obj, (frozenset, set)):
        return sorted(obj)
    if isinstance(obj, (list, tuple)):
        return [spec_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: spec_dict(v) for k, v in obj.items()}
    return obj


__all__ = [
    "SpecError", "QueueSpec", "ClassSpec", "LinkSpec", "HostTcpSpec", "PortSpec", "Node", "Link", "EgressPort",
    "Interface", "NextHop", "Route", "Hop", "validate_ifname", "validate_node_name", "validate_prefix",
    "validate_classes", "resolve_port", "check_graph", "load_balancing_sysctls", "root_ifname", "spec_dict",
    "DISCIPLINES", "CONGESTION_CONTROLS", "LOAD_BALANCING_MODES", "ROLES", "IFNAMSIZ", "MAX_IFNAME_LEN",
    "MAX_RATE_MBPS", "MIN_RATE_MBPS", "HOST_IFNAME", "ETH_HEADER_BYTES",
]
