"""What the Lab hands back for traffic it started: :class:`Flows` (long-lived bulk TCP flows, ``lab.flows``) and
:class:`Burst` (the rounds of a synchronized incast, ``lab.burst``)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable


class Flows:
    """Long-lived TCP flows started by :meth:`Lab.flows`: ``snapshot()`` while they run, ``stop()`` (or
    ``wait()`` when a duration was given) for their stats, one dict per flow: src, dst, src_port, dst_port, dscp,
    start_s, end_s, bytes, seconds, goodput_mbps."""

    def __init__(self, bg, on_stop: Callable[[list[dict]], None]):
        self.bg = bg
        self._on_stop = on_stop
        self._lock = threading.Lock()
        self._stats: list[dict] | None = None
        self._timer: threading.Timer | None = None
        self.stop_at = None

    @property
    def ports(self) -> list[tuple[int, int]]:
        """(source, destination) port of each flow."""
        return list(self.bg.ports)

    def snapshot(self) -> tuple[float, list[int]]:
        """(monotonic time, bytes received so far per flow)."""
        return self.bg.snapshot()

    @staticmethod
    def goodput_mbps(before: tuple[float, list[int]], after: tuple[float, list[int]]) -> list[float]:
        """Each flow's goodput between two snapshots."""
        dt = after[0] - before[0]
        return [(b - a) * 8 / dt / 1e6 if dt > 0 else 0.0 for a, b in zip(before[1], after[1])]

    def stop_after(self, seconds: float) -> None:
        self.stop_at = time.monotonic() + seconds
        self._timer = threading.Timer(seconds, self.stop)
        self._timer.daemon = True
        self._timer.start()

    def wait(self) -> list[dict]:
        """Until the duration given to :meth:`Lab.flows` has passed, then :meth:`stop`."""
        if self.stop_at is not None:
            time.sleep(max(0.0, self.stop_at - time.monotonic()))
        return self.stop()

    def stop(self) -> list[dict]:
        """Stop the senders (idempotent); returns the per-flow stats and writes them to ``flows.csv``."""
        with self._lock:
            if self._stats is None:
                if self._timer is not None:
                    self._timer.cancel()
                stats = self.bg.stop()
                for i, s in enumerate(stats):
                    s["start_s"] = self.bg.t_start
                    s["end_s"] = self.bg.t_last[i] or self.bg.t_start
                self._stats = stats
                if self.bg.errors:
                    print(f"testbed: flows: {'; '.join(self.bg.errors)}", file=sys.stderr)
                self._on_stop(stats)
            return self._stats


class Burst:
    """The rounds of one :meth:`Lab.burst`: ``rows`` (round, sender, start_s, end_s, bytes), ``round_ms`` (each
    round's completion time: its first sender's start to the receiver reading its last byte), ``start_s``/``end_s``
    (the burst's span) and :meth:`percentiles_ms` (analysis.metrics' nearest-rank p50/p95/p99/max)."""

    def __init__(self, rows: list[tuple]):
        import pandas as pd

        from analysis.metrics import round_times

        self.rows = rows
        self.rounds = round_times(pd.DataFrame(rows, columns=["round", "sender", "start_s", "end_s", "bytes"]))
        self.round_ms = [float(x) * 1e3 for x in self.rounds["round_s"]]
        self.start_s = float(self.rounds["start_s"].min())
        self.end_s = float(self.rounds["end_s"].max())

    def percentiles_ms(self):
        from analysis.metrics import percentiles

        return percentiles(self.round_ms)
