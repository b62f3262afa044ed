"""Faults of a host rather than of the network: a straggler whose CPU is throttled, and a host that behaves
differently from the others (its own congestion control or ECN setting, a smaller MTU, an older RTOmin). Played
by testbed.faults.timeline.FaultTimeline, which hands each host fault's steps to :class:`HostFaults`.

- ``slow-host``: every process in the host's namespace (its rank's agent, a launched program, a shell) is moved
  into a CPU-limited cgroup (testbed.kernel.cgroup: CFS bandwidth control) at the step's time, and moved back when
  it ends. Processes started in the namespace after the step are not limited.
- ``host-config`` open-time settings (``cc``, ``ecn``): a connection takes them when it opens, and a workload's
  connections open before t = 0, so they are applied when the fault is added: ``net.ipv4.tcp_ecn`` in the host's
  namespace, and ``cc`` for that host's sockets (a collective job's agents read :meth:`HostFaults.cc_of`; sockets
  set their congestion control themselves, see traffic.tcp).
- ``host-config`` live settings: ``mtu_bytes`` on both ends of the host's link (so the switch port answers bigger
  packets with ICMP fragmentation-needed and senders lower their path MTU, as a fabric with one mis-set NIC does)
  and ``rto_min_ms`` on the host's routes (a host left at an older RTOmin), both restored at the fault's end.

Events: cpu_throttled / cpu_restored (with the kernel's throttled time from cpu.stat), host_config (open-time),
host_changed / host_restored (live).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

from testbed.faults.plan import Fault, Step
from testbed.kernel import linkfail, netns
from testbed.kernel.cgroup import PERIOD_US, CpuLimit


def _fmt(values: dict) -> str:
    return ";".join(f"{k}={v}" if isinstance(v, str) else f"{k}={v:g}" for k, v in sorted(values.items()))


class HostFaults:
    """The host faults of one timeline. `ipr(node)` and `index(node, ifname)` are the timeline's cached netlink
    sockets and interface indexes; `event(kind, target, detail)` records an event."""

    def __init__(self, fabric, ipr: Callable, index: Callable, event: Callable[[str, str, str], None]):
        self.fabric, self.topology = fabric, fabric.topology
        self._ipr, self._index, self._event = ipr, index, event
        self._cpu: dict[str, CpuLimit] = {}
        self._cc: dict[str, str] = {}
        self._ecn_before: dict[str, str] = {}
        self._live: dict[str, dict] = {}  # host -> live settings in effect

    # ---- before the workload ----

    def prepare(self, f: Fault) -> None:
        host = f.target
        if f.kind == "slow-host" and host not in self._cpu:
            self._cpu[host] = CpuLimit(self.fabric.ns(host))
        if f.kind == "host-config":
            if f.get("cc") is not None:
                self._cc[host] = str(f.get("cc"))
            if f.get("ecn") is not None:
                ns = self.fabric.ns(host)
                self._ecn_before.setdefault(host, netns.sysctl_read(ns, "net.ipv4.tcp_ecn"))
                netns.sysctl_write(ns, "net.ipv4.tcp_ecn", str(int(f.get("ecn"))))

    def cc_of(self, host: str) -> str | None:
        """The congestion control a host-config fault gave `host` (None: the workload's own)."""
        return self._cc.get(host)

    # ---- steps ----

    def action(self, st: Step) -> Callable[[], None]:
        host = st.fault.target
        if st.op == "cpu":
            return lambda: self._throttle(host, st.value, st.fault)
        if st.op == "host-open":
            return lambda: self._event("host_config", host, _fmt(st.value))
        if st.op == "host-live":
            return lambda: self._set_live(host, dict(st.value))
        return lambda: self._restore_live(host)

    def _unthrottle(self, host: str) -> None:
        """Lift `host`'s CPU limit, record what the kernel throttled, and give its processes back."""
        group = self._cpu[host]
        group.limit(None)
        stat = group.throttled()
        group.release()
        self._event("cpu_restored", host, f"throttled_ms={stat['throttled_ms']:.0f};"
                                          f"throttled_periods={stat['throttled_periods']:.0f}")

    def _throttle(self, host: str, fraction: float | None, f: Fault) -> None:
        if fraction is None:
            self._unthrottle(host)
            return
        group = self._cpu[host]
        period_us = int(float(f.get("period_ms", PERIOD_US / 1000)) * 1000)
        group.limit(fraction, period_us)
        moved = group.add([pid for pid in netns.pids_in(self.fabric.ns(host)) if pid != os.getpid()])
        self._event("cpu_throttled", host, f"cpu_fraction={fraction:g};period_ms={period_us / 1000:g};"
                                           f"processes={moved}")

    def _host_ports(self, host: str) -> list[tuple[str, str]]:
        """(node, ifname) of both ends of every link of `host`."""
        out = []
        for link in self.topology.links:
            if host in (link.a, link.b):
                out += [(link.a, link.a_port), (link.b, link.b_port)]
        return out

    def _set_mtu(self, host: str, mtu: int | None) -> None:
        for node, ifname in self._host_ports(host):
            link_mtu = next(l.spec.mtu for l in self.topology.links if (node, ifname) in
                            ((l.a, l.a_port), (l.b, l.b_port)))
            self._ipr(node).link("set", index=self._index(node, ifname), mtu=int(mtu or link_mtu))

    def _set_rto_min(self, host: str, rto_min_ms: int | None) -> None:
        routes = [dataclasses.replace(r, rto_min_ms=rto_min_ms) for r in self.topology.routes if r.node == host]
        ifindex = {nh.ifname: self._index(host, nh.ifname) for r in routes for nh in r.nexthops}
        linkfail.apply_routes(self._ipr(host), ifindex, routes, [])

    def _set_live(self, host: str, values: dict) -> None:
        if "mtu_bytes" in values:
            self._set_mtu(host, int(values["mtu_bytes"]))
        if "rto_min_ms" in values:
            self._set_rto_min(host, int(values["rto_min_ms"]))
        self._live[host] = {**self._live.get(host, {}), **values}
        self._event("host_changed", host, _fmt(values))

    def _restore_live(self, host: str) -> None:
        values = self._live.pop(host, {})
        if "mtu_bytes" in values:
            self._set_mtu(host, None)
        if "rto_min_ms" in values:
            self._set_rto_min(host, getattr(self.topology.tcp, "rto_min_ms", None))
        if values:
            self._event("host_restored", host, ";".join(sorted(values)))

    # ---- end ----

    def undo(self) -> None:
        """Lift every limit, restore every setting, remove the cgroups (also when the workload never started)."""
        for host in list(self._live):
            self._restore_live(host)
        for host, group in self._cpu.items():
            if group.origin:
                self._unthrottle(host)
            group.release()
        self._cpu.clear()
        for host, old in self._ecn_before.items():
            netns.sysctl_write(self.fabric.ns(host), "net.ipv4.tcp_ecn", old)
        self._ecn_before.clear()


__all__ = ["HostFaults"]
