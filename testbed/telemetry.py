"""Samplers that run beside an experiment: switch queues (queues.csv) and host CPU (cpu.csv, fidelity).

    with QueueSampler(fabric, interval_s=0.001) as qs:   # or qs.start() ... qs.stop()
        ... traffic ...
    qs.write(rundir)            # queues.csv + cpu.csv
    qs.achieved_interval_s      # what the loop really managed (an emulation on slow CPUs rarely makes 1 ms)

The queue sampler is one thread holding one pyroute2 socket per namespace; each tick dumps the leaf qdisc stats of
every watched port (testbed.kernel.qdisc.leaf_stats) and timestamps the row with time.monotonic() (the clock every
run-directory file uses). Rows are buffered in memory and written at the end, so the sampler never writes to disk
while traffic runs. The CPU sampler reads /proc/stat (whole machine: in the lab VM that is every emulated node).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterable

from testbed.kernel import netns, qdisc

QUEUE_COLUMNS = ["t_s", "node", "port", "class", "backlog_bytes", "backlog_packets", "drops", "marks", "sent_bytes",
                 "sent_packets", "overlimits"]
CPU_COLUMNS = ["t_s", "busy_fraction"]


def read_cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        parts = f.readline().split()
    vals = [int(x) for x in parts[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


class CpuSampler:
    """Busy fraction of all CPUs over each interval (default 100 ms)."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.rows: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first: tuple[int, int] | None = None
        self._last: tuple[int, int] | None = None

    def start(self) -> "CpuSampler":
        self._first = self._last = read_cpu_times()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        prev = self._last
        while not self._stop.wait(self.interval_s):
            cur = read_cpu_times()
            db, dt = cur[0] - prev[0], cur[1] - prev[1]
            if dt > 0:
                self.rows.append((time.monotonic(), db / dt))
            prev = cur
        self._last = read_cpu_times()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    @property
    def mean_busy(self) -> float:
        """Busy fraction over the whole sampled period."""
        if not self._first or not self._last or self._last[1] <= self._first[1]:
            return sum(r[1] for r in self.rows) / len(self.rows) if self.rows else 0.0
        return (self._last[0] - self._first[0]) / (self._last[1] - self._first[1])

    @property
    def peak_busy(self) -> float:
        return max((r[1] for r in self.rows), default=0.0)


class _OneDump:
    """Stands in for an IPRoute in qdisc.leaf_stats: one RTM_GETQDISC dump of the whole namespace, filtered per
    port, instead of one dump per port (the kernel dumps every device's qdiscs either way)."""

    def __init__(self, ipr):
        self.msgs = list(ipr.get_qdiscs())

    def get_qdiscs(self, index: int):
        return [m for m in self.msgs if m["index"] == index]


class QueueSampler:
    """Sample every shaped egress port of `fabric` (or only `ports`, a set of (node, ifname)) every `interval_s`.

    Also runs a CpuSampler (cpu_interval_s) so the fidelity of the run can be judged from the same object.
    """

    def __init__(self, fabric, interval_s: float = 0.001, ports: Iterable[tuple[str, str]] | None = None,
                 cpu_interval_s: float = 0.1):
        self.fabric = fabric
        self.interval_s = float(interval_s)
        wanted = set(ports) if ports is not None else None
        self.ports = [(node, ns, ifn) for node, ns, ifn in fabric.ports()
                      if wanted is None or (node, ifn) in wanted]
        if wanted is not None:
            missing = wanted - {(n, i) for n, _, i in self.ports}
            if missing:
                raise KeyError(f"not shaped egress ports of this fabric: {sorted(missing)}")
        self.rows: list[tuple] = []
        self.ticks = 0
        self.t_first = self.t_last = 0.0
        self.cpu = CpuSampler(cpu_interval_s)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._labels = {}
        for node, _, ifn in self.ports:
            plan = fabric.port_plan(node, ifn)
            self._labels[(node, ifn)] = plan

    # ---- control ----

    def start(self) -> "QueueSampler":
        self._thread = threading.Thread(target=self._loop, name="queue-sampler", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error:
            raise self._error
        self.cpu.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.cpu.stop()
        if self._error:
            raise self._error

    def __enter__(self) -> "QueueSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the loop ----

    def _loop(self) -> None:
        socks: dict[str, object] = {}
        try:
            by_ns: dict[str, list[tuple[str, str, int]]] = {}
            for node, ns, ifn in self.ports:
                if ns not in socks:
                    socks[ns] = netns.ipr(ns)
                idx = socks[ns].link_lookup(ifname=ifn)[0]
                by_ns.setdefault(ns, []).append((node, ifn, idx))
            work = [(socks[ns], items) for ns, items in by_ns.items()]
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()
            for s in socks.values():
                with contextlib.suppress(Exception):
                    s.close()
            return
        self._ready.set()
        rows = self.rows
        try:
            next_t = time.monotonic()
            self.t_first = next_t
            while not self._stop.is_set():
                for ipr, items in work:
                    t = time.monotonic()
                    dump = _OneDump(ipr)  # one netlink dump per namespace per round, shared by its ports
                    for node, ifn, idx in items:
                        plan = self._labels[(node, ifn)]
                        for s in qdisc.leaf_stats(dump, idx):
                            rows.append((t, node, ifn, plan.class_label(s.minor), s.backlog_bytes,
                                         s.backlog_packets, s.drops, s.marks, s.sent_bytes, s.sent_packets,
                                         s.overlimits))
                self.ticks += 1
                self.t_last = time.monotonic()
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_t = time.monotonic()  # late: do not try to catch up with a burst of samples
        except BaseException as e:  # noqa: BLE001
            self._error = e
        finally:
            for s in socks.values():
                with contextlib.suppress(Exception):
                    s.close()

    # ---- results ----

    @property
    def achieved_interval_s(self) -> float:
        """Mean time between the starts of two sampling rounds (every watched port once per round)."""
        if self.ticks < 2:
            return float("nan")
        return (self.t_last - self.t_first) / self.ticks

    def peak_backlog(self, node: str, port: str) -> int:
        return max((r[4] for r in self.rows if r[1] == node and r[2] == port), default=0)

    def mean_backlog(self, node: str, port: str, t0: float | None = None, t1: float | None = None) -> float:
        vals = [r[4] for r in self.rows if r[1] == node and r[2] == port
                and (t0 is None or r[0] >= t0) and (t1 is None or r[0] <= t1)]
        return sum(vals) / len(vals) if vals else 0.0

    def write(self, rundir) -> None:
        """queues.csv and cpu.csv into the run directory (testbed.rundir.RunDir)."""
        rundir.write_csv("queues.csv", QUEUE_COLUMNS,
                         ((f"{r[0]:.6f}", *r[1:]) for r in self.rows))
        rundir.write_csv("cpu.csv", CPU_COLUMNS, ((f"{t:.6f}", f"{b:.4f}") for t, b in self.cpu.rows))

    def stats(self) -> dict:
        return {"queue_sample_interval_s": self.achieved_interval_s, "queue_samples": self.ticks,
                "queue_ports_sampled": len(self.ports), "cpu_busy_fraction": self.cpu.mean_busy,
                "cpu_busy_peak": self.cpu.peak_busy}
