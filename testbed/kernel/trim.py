"""Packet trimming at one switch port (the program: trim.bpf.c beside this file; the transport that answers a
trimmed packet with a NACK: traffic/uet.py). On the port's clsact egress hook, before its HTB and leaf queue, a
cls_bpf filter in direct-action mode cuts UET data packets to their headers while the port's virtual queue (its
bytes in, capped at the port's buffer, minus its full rate times time: the program cannot read the qdisc's
backlog, see the program's comment) is above ``threshold_bytes``, and steers them into the port's high-priority
class (``trim_minor``: HTB class 1:<trim_minor>) when the port has one. A port with a single class still trims: the
header then waits in the same queue as the data, behind at most the threshold's worth of bytes, and arrives (the
NACK is late by that queue, not by a timeout); what it cannot get is the priority.

The maps stay open in this process: the caller reads the counters and the virtual queue's peak at the end, and
writes the port's new rate when a fault changes it at run time (:meth:`Trimmer.set_drain_rate`), so the virtual
queue drains as the slowed port does."""

from __future__ import annotations

import contextlib
import ctypes
import time
from pathlib import Path

from .ebpf import BpfObject, compile_object
from .spray import CLSACT_EGRESS, ETH_P_ALL

SOURCE = Path(__file__).with_name("trim.bpf.c")
PROGRAM = "uet_trim"
STATS = ("packets", "uet_data_packets", "trimmed_packets", "trimmed_bytes_cut", "too_short_to_trim")
UET_UDP_PORT = 4793  # traffic/uet_packet.py: UEC's port for UET over UDP
HTB_MAJOR = 1  # testbed/kernel/qdisc.py: every port's HTB is handle 1:
FILTER_PRIO = 3  # the filter's priority on the egress hook (a flowlet balancer's filter sits beside it)


class _Config(ctypes.Structure):
    _fields_ = [("ps_per_byte", ctypes.c_uint64), ("threshold_bytes", ctypes.c_uint64),
                ("uet_port", ctypes.c_uint32), ("trim_priority", ctypes.c_uint32), ("buffer_bytes", ctypes.c_uint64),
                ("prev_ps_per_byte", ctypes.c_uint64), ("rate_since_ns", ctypes.c_uint64)]


class _VQueue(ctypes.Structure):
    _fields_ = [("lock", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("bytes", ctypes.c_uint64),
                ("t_ns", ctypes.c_uint64), ("peak_bytes", ctypes.c_uint64)]


def ps_per_byte(rate_mbps: float) -> int:
    """Picoseconds one byte takes on the wire at `rate_mbps` (the virtual queue's drain rate)."""
    if not rate_mbps > 0:
        raise ValueError(f"rate_mbps must be > 0 (got {rate_mbps})")
    return max(1, round(8e6 / rate_mbps))


class Trimmer:
    """The program loaded for one port and attached to its egress."""

    def __init__(self, obj: BpfObject):
        self.obj = obj
        self.created_clsact = False  # install added the port's clsact (detach takes it off again)

    def stats(self) -> dict[str, int]:
        out = {}
        for i, name in enumerate(STATS):
            v = ctypes.c_uint64()
            out[name] = int(v.value) if self.obj.lookup("stats", ctypes.c_uint32(i), v) else 0
        q = _VQueue()
        out["vq_peak_bytes"] = int(q.peak_bytes) if self.obj.lookup("vq", ctypes.c_uint32(0), q) else 0
        return out

    def set_rate(self, rate_mbps: float, threshold_bytes: int, buffer_bytes: int, trim_minor: int = 0,
                 port: int = UET_UDP_PORT) -> None:
        """(Re)write the port's drain rate (its full rate: see the program's comment), the threshold, the port's
        buffer (the virtual queue's cap) and the class trimmed headers go to (0: none)."""
        _check(threshold_bytes, buffer_bytes)
        prio = (HTB_MAJOR << 16 | trim_minor) if trim_minor else 0
        self.obj.update("config", ctypes.c_uint32(0), _Config(ps_per_byte(rate_mbps), int(threshold_bytes),
                                                              int(port), prio, int(buffer_bytes)))

    def set_drain_rate(self, rate_mbps: float) -> float:
        """The port's rate changed now (a slow-port fault, or its end): drain the virtual queue at `rate_mbps` from
        now on, at the old rate up to now (the program's drained_bytes). Returns the rate the map now holds."""
        cfg = self._config()
        cfg.prev_ps_per_byte, cfg.rate_since_ns = cfg.ps_per_byte, time.monotonic_ns()  # bpf_ktime_get_ns's clock
        cfg.ps_per_byte = ps_per_byte(rate_mbps)
        self.obj.update("config", ctypes.c_uint32(0), cfg)
        return self.drain_rate_mbps()

    def drain_rate_mbps(self) -> float:
        """The rate the program drains its virtual queue at, as its config map holds it (Mbit/s)."""
        return 8e6 / self._config().ps_per_byte

    def vq_bytes(self) -> int:
        """The virtual queue's bytes at its last update (the last packet through the port)."""
        q = _VQueue()
        return int(q.bytes) if self.obj.lookup("vq", ctypes.c_uint32(0), q) else 0

    def _config(self) -> _Config:
        cfg = _Config()
        if not self.obj.lookup("config", ctypes.c_uint32(0), cfg) or cfg.ps_per_byte == 0:
            raise RuntimeError("the trimming program's config map holds no rate")
        return cfg

    def close(self) -> None:
        self.obj.close()


def _check(threshold_bytes: int, buffer_bytes: int) -> None:
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be > 0 (got {threshold_bytes})")
    if buffer_bytes < threshold_bytes:
        raise ValueError(f"buffer_bytes ({buffer_bytes}) must be >= threshold_bytes ({threshold_bytes})")


def install(ipr, ifindex: int, rate_mbps: float, threshold_bytes: int, buffer_bytes: int, trim_minor: int = 0,
            port: int = UET_UDP_PORT) -> Trimmer:
    """Load the program (through `ipr`, a socket in the switch's namespace) for port `ifindex`, whose HTB sends at
    `rate_mbps` from a leaf queue of `buffer_bytes`, and attach it to the port's egress. `trim_minor`: the HTB class
    (1:<minor>) for trimmed headers."""
    _check(threshold_bytes, buffer_bytes)
    obj = BpfObject(compile_object(SOURCE))
    t = Trimmer(obj)
    try:
        t.set_rate(rate_mbps, threshold_bytes, buffer_bytes, trim_minor, port)
        with contextlib.suppress(Exception):  # a clsact already there (a balancer on the same port) is shared
            ipr.tc("add", "clsact", index=ifindex)
            t.created_clsact = True
        ipr.tc("add-filter", "bpf", index=ifindex, parent=CLSACT_EGRESS, prio=FILTER_PRIO, protocol=ETH_P_ALL,
               fd=obj.program_fd(PROGRAM), name=PROGRAM, direct_action=True)
    except BaseException:
        if t.created_clsact:  # the clsact this call added goes again
            with contextlib.suppress(Exception):
                ipr.tc("del", "clsact", index=ifindex)
        obj.close()
        raise
    return t


def detach(ipr, ifindex: int, clsact: bool = False) -> None:
    """Take the program's filter off port `ifindex`'s egress (what :func:`install` attached at its priority), and
    the clsact qdisc too when `clsact` (install created it: :attr:`Trimmer.created_clsact`; one that was there
    before, a balancer's, stays). Closing the :class:`Trimmer` alone does not detach: the filter holds its own
    reference to the program."""
    try:
        ipr.tc("del-filter", "bpf", index=ifindex, parent=CLSACT_EGRESS, prio=FILTER_PRIO, protocol=ETH_P_ALL)
    finally:
        if clsact:
            ipr.tc("del", "clsact", index=ifindex)


__all__ = ["PROGRAM", "STATS", "Trimmer", "detach", "install", "ps_per_byte"]
