"""The machine's CPU while a run goes (cpu.csv, and the fidelity verdict's "was the CPU saturated?"): the busy
fraction of all CPUs from /proc/stat. In the lab VM that is every emulated node together."""

from __future__ import annotations

import threading
import time


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
