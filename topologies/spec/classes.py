"""Traffic classes on a port (DSCP -> HTB class, strict priority or weight, optional PFC losslessness)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterable

from .base import (MAX_CLASSES, SpecError, _CLASS_NAME_RE, _bool, _got, _range, _set)
from .queue import QueueSpec


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
