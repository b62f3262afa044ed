"""CPU bandwidth limits for a straggler host: the processes in one host's namespace may run for at most
``fraction`` of one CPU, as on a server whose CPU is throttled (thermal or power capping), oversubscribed by a
noisy neighbour, or starved by a data loader. The mechanism is the kernel's CFS bandwidth control, which is what
container runtimes use for CPU limits: per period (default 100 ms) a group may run ``fraction x period`` of CPU
time, then its threads wait for the next period. A rank limited that way answers its peers in bursts, which is
what makes it a straggler of every collective it takes part in.

cgroup v2 (``cpu.max``) where the unified hierarchy offers the cpu controller, otherwise the v1 cpu controller
(``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; the machines this project runs on mount it that way). Groups are
made under the hierarchy's root and named with the project's prefix (``tb-...``), so ``testbed clean`` finds the
ones a killed run left (:func:`list_ours`, :func:`remove`).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from testbed.kernel import PREFIX
from testbed.errors import CapabilityMissing

PERIOD_US = 100_000


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, options) of every cgroup mount."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                out.append((parts[1], parts[2], parts[3]))
    return out


def cpu_hierarchy() -> tuple[int, Path] | None:
    """(version, root) of the hierarchy that has the cpu controller; None when there is none."""
    for mnt, kind, _ in _mounts():
        if kind == "cgroup2":
            with contextlib.suppress(OSError):
                if "cpu" in (Path(mnt) / "cgroup.controllers").read_text().split():
                    return 2, Path(mnt)
    for mnt, kind, opts in _mounts():
        if kind == "cgroup" and "cpu" in opts.split(","):
            return 1, Path(mnt)
    return None


def _group_name(name: str) -> str:
    return name if name.startswith(PREFIX + "-") else f"{PREFIX}-{name}"


class CpuLimit:
    """One CPU-limited group, ``tb-<name>`` under the cpu hierarchy's root. :meth:`limit` sets the fraction,
    :meth:`add` moves processes in (remembering where each came from), :meth:`release` moves them back and
    removes the group. Raises OSError (with the file it failed on) when the kernel refuses."""

    def __init__(self, name: str):
        found = cpu_hierarchy()
        if found is None:
            raise CapabilityMissing("cgroup:cpu", "no cgroup hierarchy with the cpu controller is mounted")
        self.version, self.root = found
        self.path = self.root / _group_name(name)
        self.origin: dict[int, Path] = {}
        if self.version == 2:
            self._enable_cpu_below_root()
        self.path.mkdir(exist_ok=True)

    def _enable_cpu_below_root(self) -> None:
        ctl = self.root / "cgroup.subtree_control"
        if "cpu" not in ctl.read_text().split():
            ctl.write_text("+cpu")

    def limit(self, fraction: float | None, period_us: int = PERIOD_US) -> None:
        """At most `fraction` of one CPU per period (None: no limit)."""
        quota = None if fraction is None else max(1000, int(round(fraction * period_us)))
        if self.version == 2:
            (self.path / "cpu.max").write_text(f"{'max' if quota is None else quota} {period_us}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(-1 if quota is None else quota))

    def add(self, pids: list[int]) -> int:
        """Move the processes (all their threads) into the group; returns how many moved (gone ones are skipped)."""
        moved = 0
        for pid in pids:
            try:
                self.origin[pid] = self._current(pid)
                (self.path / "cgroup.procs").write_text(str(pid))
                moved += 1
            except (OSError, ValueError):
                self.origin.pop(pid, None)  # exited meanwhile
        return moved

    def _current(self, pid: int) -> Path:
        """The group `pid` is in now, in this hierarchy."""
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            hid, controllers, rel = line.split(":", 2)
            if (self.version == 2 and hid == "0") or (self.version == 1 and "cpu" in controllers.split(",")):
                return self.root / rel.lstrip("/")
        raise ValueError(f"pid {pid} is in no cpu cgroup")

    def throttled(self) -> dict[str, float]:
        """The kernel's cpu.stat for the group: periods, throttled periods and time throttled (ms)."""
        stat = {}
        with contextlib.suppress(OSError):
            for line in (self.path / "cpu.stat").read_text().splitlines():
                k, _, v = line.partition(" ")
                stat[k] = float(v)
        ms = stat["throttled_usec"] / 1000 if "throttled_usec" in stat else stat.get("throttled_time", 0) / 1e6
        return {"periods": stat.get("nr_periods", 0), "throttled_periods": stat.get("nr_throttled", 0),
                "throttled_ms": ms}

    def release(self) -> None:
        """Every process back where it came from (the hierarchy's root if that group is gone); remove the group."""
        for pid in _procs(self.path):
            dest = self.origin.get(pid, self.root)
            for d in (dest, self.root):
                try:
                    (d / "cgroup.procs").write_text(str(pid))
                    break
                except OSError:
                    continue
        self.origin.clear()
        with contextlib.suppress(OSError):
            self.path.rmdir()


def _procs(path: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    return []


def list_ours() -> list[str]:
    """Groups named with the project's prefix under the cpu hierarchy's root (left by a killed run)."""
    found = cpu_hierarchy()
    if found is None:
        return []
    pattern = re.compile(rf"^{re.escape(PREFIX)}-")
    return sorted(str(p) for p in found[1].iterdir() if p.is_dir() and pattern.match(p.name))


def remove(path: str) -> None:
    """Move a leftover group's processes to the hierarchy's root and remove it."""
    p = Path(path)
    for pid in _procs(p):
        with contextlib.suppress(OSError):
            (p.parent / "cgroup.procs").write_text(str(pid))
    with contextlib.suppress(OSError):
        os.rmdir(p)


__all__ = ["PERIOD_US", "CpuLimit", "cpu_hierarchy", "list_ours", "remove"]
