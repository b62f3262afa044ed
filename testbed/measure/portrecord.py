"""Switch ports' kernel counters around an experiment: what ``tc -s qdisc`` shows for an egress port (packets and
bytes the port sent, packets it dropped, packets its RED/step queue ECN-marked, summed over the port's classes),
read once before the traffic and once after; the increases are what the traffic did to those queues (a drop is a
packet the emulated switch discarded, as a real one's tail drop)."""

from __future__ import annotations

from typing import Iterable

from testbed.measure.telemetry import port_totals

KEYS = ("drops", "marks", "sent_packets", "sent_bytes")


class PortCounters:
    """``PortCounters(ports)`` ((node, namespace, ifname), as ``Fabric.ports()``) reads the counters now;
    :meth:`stop` reads them again (once) and returns the per-port increases of :data:`KEYS`; :meth:`total` sums
    one of them over the ports."""

    def __init__(self, ports: Iterable[tuple[str, str, str]]):
        self.ports = list(ports)
        self.before = port_totals(self.ports)
        self.after: dict[tuple[str, str], dict[str, int]] | None = None

    def stop(self) -> dict[tuple[str, str], dict[str, int]]:
        if self.after is None:
            self.after = port_totals(self.ports)
        return {p: {k: self.after[p][k] - self.before[p][k] for k in KEYS} for p in self.before}

    def total(self, key: str) -> int:
        """The increase of ``key`` summed over the ports (reads the counters now if :meth:`stop` was not called)."""
        return sum(d[key] for d in self.stop().values())
