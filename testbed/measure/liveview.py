"""A live view of a run for demonstrations (`testbed run ... --live`, `testbed lab run N --live`): while the run
goes, the busiest switch ports' queue depth, drops, ECN marks and what they send, and the collective's iteration,
redrawn several times a second in the terminal (rich), so an instructor can project an incast filling a queue or a
pause spreading hop by hop as it happens.

It reads the samples the run records: the queue sampler's process (testbed.measure.telemetry) writes its latest round
to a
snapshot file a few times a second beside the rows it keeps for queues.csv; there is no second sampler. A port whose
queue holds packets but sent nothing since the last snapshot is shown as *stalled*: paused by PFC (its class is
plugged), or a slow or dead link."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time

#: how often the sampler writes its snapshot, and the view redraws
SNAPSHOT_EVERY_S = 0.2
TOP_PORTS = 10

_enabled = False
_current: "LiveView | None" = None


def enable() -> None:
    """Show a live view for every queue sampler this process starts (the CLI's --live)."""
    global _enabled
    _enabled = True


def enabled() -> bool:
    return _enabled


def progress(text: str) -> None:
    """A progress line for the view (the collective's iteration), when one is showing."""
    if _current is not None:
        _current.status = text


def _port_rows(snapshot: dict) -> dict[tuple[str, str], list[int]]:
    """(node, port) -> [backlog_bytes, drops, marks, sent_bytes], summed over the port's classes."""
    out: dict[tuple[str, str], list[int]] = {}
    for node, port, _cls, backlog, drops, marks, sent in snapshot.get("rows", []):
        acc = out.setdefault((node, port), [0, 0, 0, 0])
        for i, v in enumerate((backlog, drops, marks, sent)):
            acc[i] += int(v)
    return out


def busiest(now: dict, before: dict | None, dt_s: float, top: int = TOP_PORTS) -> list[dict]:
    """The ports to show, busiest first (deepest queue, then most drops since the start, then most sent): per port
    backlog, drops, marks, its rate since the last snapshot and whether it is stalled. Pure: two snapshots in."""
    cur, prev = _port_rows(now), _port_rows(before or {})
    rows = []
    for (node, port), (backlog, drops, marks, sent) in cur.items():
        p = prev.get((node, port))
        rate = (sent - p[3]) * 8 / dt_s / 1e6 if p and dt_s > 0 else 0.0
        rows.append({"port": f"{node}:{port}", "backlog_bytes": backlog, "drops": drops, "marks": marks,
                     "mbps": max(0.0, rate), "stalled": bool(p) and backlog > 0 and sent == p[3]})
    rows.sort(key=lambda r: (-r["backlog_bytes"], -r["drops"], -r["mbps"], r["port"]))
    return [r for r in rows if r["backlog_bytes"] or r["drops"] or r["mbps"] > 0.01][:top]


class LiveView:
    """Redraws the busiest ports from the sampler's snapshot file until stopped."""

    def __init__(self, title: str = "testbed"):
        fd, self.snapshot_path = tempfile.mkstemp(prefix="tb-live-", suffix=".json")
        os.close(fd)
        self.title = title
        self.status = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()

    def start(self) -> "LiveView":
        global _current
        _current = self
        self._thread = threading.Thread(target=self._loop, name="live-view", daemon=True)
        self._thread.start()
        return self

    def _read(self) -> dict | None:
        try:
            with open(self.snapshot_path) as f:
                return json.loads(f.read() or "null")
        except (OSError, ValueError):
            return None

    def _table(self, rows: list[dict]):
        from rich.table import Table

        t = Table(title=f"{self.title}  {time.monotonic() - self._t0:5.1f} s  {self.status}", expand=False)
        for c, j, w in (("port", "left", 16), ("queue (bytes)", "right", 13), ("", "left", 20),
                        ("drops", "right", 6), ("ECN marks", "right", 9), ("Mbit/s", "right", 7),
                        ("state", "left", 7)):
            t.add_column(c, justify=j, no_wrap=True, min_width=w)
        peak = max((r["backlog_bytes"] for r in rows), default=0) or 1
        for r in rows:
            bar = "#" * round(20 * r["backlog_bytes"] / peak)
            t.add_row(r["port"], f"{r['backlog_bytes']:,}", bar, str(r["drops"]), str(r["marks"]),
                      f"{r['mbps']:.1f}", "stalled" if r["stalled"] else "")
        return t

    def _loop(self) -> None:
        from rich.console import Console
        from rich.live import Live

        before, t_before = None, 0.0
        rows: list[dict] = []
        console = Console(file=sys.stderr, width=None if sys.stderr.isatty() else 110)
        with Live(self._table(rows), console=console, refresh_per_second=5, transient=False) as live:
            while not self._stop.wait(SNAPSHOT_EVERY_S):
                snap = self._read()
                if snap and snap.get("t") != (before or {}).get("t"):
                    rows = busiest(snap, before, float(snap["t"]) - t_before if before else 0.0)
                    before, t_before = snap, float(snap["t"])
                live.update(self._table(rows))
        console.print()

    def stop(self) -> None:
        global _current
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if _current is self:
            _current = None
        with contextlib.suppress(OSError):
            os.unlink(self.snapshot_path)


def write_snapshot(path: str, t: float, rows: list[tuple]) -> None:
    """The sampler's side: its latest round, replaced atomically (the view never reads half a file)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"t": t, "rows": rows}, f)
    os.replace(tmp, path)


__all__ = ["LiveView", "SNAPSHOT_EVERY_S", "busiest", "enable", "enabled", "progress", "write_snapshot"]
