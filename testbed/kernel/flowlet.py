"""The flowlet balancer in one router's namespace (the plan and the why: topologies/flowlet.py; the program:
flowlet.bpf.c beside this file). On every uplink's clsact egress hook, a cls_bpf filter in direct-action mode runs
the program: the kernel's ECMP route chose a port, the program keeps the packet there or redirects it
(``bpf_redirect``) to the uplink its flowlet uses. The maps stay open in this process: the adaptive controller
writes the congestion table, the run reads the counters at its end."""

from __future__ import annotations

import ctypes
import socket
from pathlib import Path

from topologies.flowlet import MAX_PORTS, FlowletPlan

from .ebpf import BpfObject, compile_object
from .spray import CLSACT_EGRESS, ETH_P_ALL

SOURCE = Path(__file__).with_name("flowlet.bpf.c")
PROGRAM = "flowlet_lb"
STATS = ("flowlets", "moved_packets", "packets")  # the program's stats map, in index order


class _Config(ctypes.Structure):
    _fields_ = [("gap_ns", ctypes.c_uint64), ("nports", ctypes.c_uint32), ("adaptive", ctypes.c_uint32),
                ("dre_half_life_ns", ctypes.c_uint64), ("join_bytes", ctypes.c_uint64)]

#: the first burst a new flowlet adds to its uplink, as the adaptive choice counts it: a new TCP flow's initial
#: window (10 segments of 1448 bytes, RFC 6928)
JOIN_BYTES = 10 * 1448


def ps_per_byte(rate_mbps: float) -> int:
    """Picoseconds one byte takes on the wire at `rate_mbps`."""
    return min(2**32 - 1, max(1, round(8e6 / rate_mbps)))


def _ip_key(ip: str) -> ctypes.c_uint32:
    """An IPv4 address as the program sees ip->daddr: network byte order in memory."""
    return ctypes.c_uint32.from_buffer_copy(socket.inet_aton(ip))


class Balancer:
    """The program loaded for one router, attached to its uplinks."""

    def __init__(self, plan: FlowletPlan, obj: BpfObject):
        self.plan = plan
        self.obj = obj

    def set_rate(self, port: int, rate_mbps: float) -> None:
        """The rate uplink `port` drains at, which weighs its recent bytes into a delay."""
        self.obj.update("tx_ps", ctypes.c_uint32(port), ctypes.c_uint32(ps_per_byte(rate_mbps)))

    def set_congestion(self, table: dict[tuple[int, int], int]) -> None:
        """(slot, uplink index) -> the path's remote delay in microseconds."""
        for (slot, port), value in table.items():
            self.obj.update("cong", ctypes.c_uint32(slot * MAX_PORTS + port), ctypes.c_uint32(min(value, 2**32 - 1)))

    def stats(self) -> dict[str, int]:
        out = {}
        for i, name in enumerate(STATS):
            v = ctypes.c_uint64()
            out[name] = int(v.value) if self.obj.lookup("stats", ctypes.c_uint32(i), v) else 0
        return out

    def close(self) -> None:
        self.obj.close()


def install(ipr, plan: FlowletPlan, ifindex: dict[str, int], gap_ms: float, adaptive: bool,
            rate_mbps: dict[str, float] | None = None, dre_half_life_ms: float = 10.0) -> Balancer:
    """Load the program for `plan.node` (through `ipr`, a socket in its namespace) and attach it to every uplink.
    `rate_mbps`: each uplink's configured rate (the controller corrects it with what the port drains)."""
    obj = BpfObject(compile_object(SOURCE))
    try:
        obj.update("config", ctypes.c_uint32(0),
                   _Config(int(gap_ms * 1e6), len(plan.ports), 1 if adaptive else 0, int(dre_half_life_ms * 1e6),
                           JOIN_BYTES))
        for i, port in enumerate(plan.ports):
            obj.update("ports", ctypes.c_uint32(i), ctypes.c_uint32(ifindex[port]))
            obj.update("tx_ps", ctypes.c_uint32(i), ctypes.c_uint32(ps_per_byte((rate_mbps or {}).get(port, 1000.0))))
        for ip, slot in plan.slot_of.items():
            obj.update("dst_slot", _ip_key(ip), ctypes.c_uint32(slot))
        fd = obj.program_fd(PROGRAM)
        for port in plan.ports:
            idx = ifindex[port]
            ipr.tc("add", "clsact", index=idx)
            ipr.tc("add-filter", "bpf", index=idx, parent=CLSACT_EGRESS, prio=1, protocol=ETH_P_ALL,
                   fd=fd, name=PROGRAM, direct_action=True)
    except BaseException:
        obj.close()
        raise
    return Balancer(plan, obj)


__all__ = ["Balancer", "CLSACT_EGRESS", "STATS", "install", "ps_per_byte"]
