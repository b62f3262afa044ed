"""What every spec shares: the limits (Linux interface names, HTB rates, MTUs), :class:`SpecError` with the
field path it names, and the small validators each spec kind calls in ``__post_init__``."""

from __future__ import annotations

import math
import re
from typing import Any, Iterable


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
