"""Flowlet load balancing on a built fabric: the balancer on every router with multipath routes
(testbed/kernel/flowlet.py) and, for ``adaptive``, the congestion feedback loop that stands in for CONGA's
leaf-to-leaf feedback: every ``poll_ms`` it reads the backlog of every queue on the balanced paths (one netlink dump
per namespace, as the queue sampler does) and writes each path's congestion (its most backlogged queue) into each
router's table. The table is as old as the poll interval, as CONGA's is as old as the last packet back."""

from __future__ import annotations

import contextlib
import threading
import time

from testbed.kernel import flowlet
from testbed.kernel.qdiscdump import RawQdiscDump
from topologies.flowlet import DEFAULT_GAP_MS, DEFAULT_POLL_MS, FlowletPlan, drain_delay_us, path_congestion


#: a port's drain rate is measured over at least this long a stretch of continuous backlog (a few packet times at
#: the lab's rates; shorter stretches see HTB's bursts, not its rate)
RATE_WINDOW_S = 0.05


class FlowletBalancing:
    """The balancers of one fabric. ``install`` during the build; ``stop`` before the namespaces go."""

    def __init__(self, plans: tuple[FlowletPlan, ...], adaptive: bool, gap_ms: float = DEFAULT_GAP_MS,
                 poll_ms: float = DEFAULT_POLL_MS, rate_mbps: dict[tuple[str, str], float] | None = None):
        self.plans = plans
        self.adaptive = adaptive
        self.gap_ms = float(gap_ms)
        self.poll_ms = float(poll_ms)
        #: each watched port's drain rate: configured, then what it sent while backlogged (a slow port's real rate)
        self.rate_mbps = dict(rate_mbps or {})
        self.balancers: list[flowlet.Balancer] = []
        self.polls = 0
        self.poll_late_ms_max = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self, iprs, ifindex: dict[str, dict[str, int]]) -> None:
        for p in self.plans:
            rates = {port: r for (node, port), r in self.rate_mbps.items() if node == p.node}
            self.balancers.append(flowlet.install(iprs[p.node], p, ifindex[p.node], self.gap_ms, self.adaptive,
                                                  rate_mbps=rates, dre_half_life_ms=self.gap_ms))

    def start(self, namespaces: dict[str, str], ifindex: dict[str, dict[str, int]]) -> None:
        """Start the feedback loop (adaptive only): `namespaces` node -> namespace, `ifindex` node -> {port: index}."""
        if not self.adaptive or not self.balancers:
            return
        watched: dict[str, dict[int, str]] = {}
        for p in self.plans:
            for node, port in p.queues:
                watched.setdefault(node, {})[ifindex[node][port]] = port
        dumps = {node: RawQdiscDump(namespaces[node]) for node in watched}
        self._thread = threading.Thread(target=self._loop, args=(dumps, watched), name="flowlet-feedback",
                                        daemon=True)
        self._thread.start()

    def _poll(self, dumps, watched, last: dict) -> dict[tuple[str, str], int]:
        """One reading of every watched queue: the delay in us a new flowlet's first burst would see there (the
        backlog and the burst at the port's rate); a port backlogged for a while updates its measured rate (the bytes
        it sent over that stretch), so a slow port far away weighs in before its queue grows."""
        now = time.monotonic()
        delay: dict[tuple[str, str], int] = {}
        for node, dump in dumps.items():
            ports = watched[node]
            for ifindex, qs in dump.leaf_stats().items():
                if ifindex not in ports:
                    continue
                q = (node, ports[ifindex])
                backlog, sent = sum(x.backlog_bytes for x in qs), sum(x.sent_bytes for x in qs)
                prev = last.get(q)
                if prev is None or prev[1] == 0 or backlog == 0:
                    last[q] = (now, backlog, sent)  # a backlogged stretch starts (or none goes on)
                elif now - prev[0] >= RATE_WINDOW_S and sent > prev[2]:
                    self.rate_mbps[q] = (sent - prev[2]) * 8 / (now - prev[0]) / 1e6
                    last[q] = (now, backlog, sent)
                # what a newcomer's first burst would wait behind, and take, at this port's measured rate
                delay[q] = drain_delay_us(backlog + flowlet.JOIN_BYTES, self.rate_mbps.get(q, 1000.0))
        return delay

    def _loop(self, dumps: dict[str, RawQdiscDump], watched: dict[str, dict[int, str]]) -> None:
        period = self.poll_ms / 1000
        due = time.monotonic()
        last: dict = {}
        told: dict[tuple[int, int], float] = {}
        try:
            while not self._stop.is_set():
                delay = self._poll(dumps, watched, last)
                for bi, b in enumerate(self.balancers):
                    b.set_congestion(path_congestion(b.plan, delay))
                    for i, port in enumerate(b.plan.ports):
                        r = self.rate_mbps.get((b.plan.node, port))
                        if r and abs(r - told.get((bi, i), 0)) > 0.05 * r:
                            b.set_rate(i, r)
                            told[(bi, i)] = r
                self.polls += 1
                due += period
                late = time.monotonic() - due
                if late > 0:
                    self.poll_late_ms_max = max(self.poll_late_ms_max, late * 1000)
                    due = time.monotonic()
                self._stop.wait(max(0.0, due - time.monotonic()))
        except OSError:
            pass  # a namespace went away under the loop: the run is ending
        finally:
            for d in dumps.values():
                with contextlib.suppress(Exception):
                    d.close()

    def stats(self) -> list[tuple[str, int, int, int]]:
        """(router, flowlets started, packets moved to another uplink, packets balanced) per router."""
        return [(b.plan.node, *(b.stats()[k] for k in flowlet.STATS)) for b in self.balancers]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def close(self) -> None:
        self.stop()
        for b in self.balancers:
            with contextlib.suppress(Exception):
                b.close()
        self.balancers.clear()


__all__ = ["FlowletBalancing"]
