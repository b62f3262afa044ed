"""A port's queue discipline (droptail / RED / step marking) and its buffer: the qdisc under the HTB shaper."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import (DISCIPLINES, MAX_BUFFER_BYTES, MAX_BUFFER_PACKETS, SpecError, _bool, _choice, _range, _set)


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
