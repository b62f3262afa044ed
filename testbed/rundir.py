"""The run directory: where a run leaves everything analysis needs (see docs/rundir.md).

This module knows paths and the manifest; it knows nothing of fabrics or analysis. `manifest.json` is written at
the start with `complete: false` and rewritten at the end, so an interrupted run is recognisable as such.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from testbed import __version__
from testbed.errors import UsageError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TOOLS = {
    "iproute2": ["ip", "-V"],
    "iperf3": ["iperf3", "--version"],
    "qemu": ["qemu-system-x86_64", "--version"],
    "ethtool": ["ethtool", "--version"],
}
PACKAGES = ("pyroute2", "numpy", "pandas", "scapy", "matplotlib", "virtme-ng")


def _first_line(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else None


def versions() -> dict[str, Any]:
    """The versions a manifest records: testbed, Python, the packages and the kernel tools."""
    from importlib import metadata  # ~10 ms: only a run pays it, not every command's start (the CLI imports this)

    v: dict[str, Any] = {"testbed": __version__, "python": platform.python_version()}
    for p in PACKAGES:
        try:
            v[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            v[p] = None
    for name, argv in TOOLS.items():
        v[name] = _first_line(argv)
    return v


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


#: kernel filesystems: nothing a run writes belongs there (root's access() says yes to /sys, mkdir then fails)
_KERNEL_FS = (Path("/proc"), Path("/sys"))


def _short(p: object, n: int = 100) -> str:
    t = str(p)
    return t if len(t) <= n else t[: n - 3] + "..."


def check_out_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """The absolute folder an output will be written to, or UsageError (one line, exit status 2) when it cannot
    be: inside /proc or /sys, a component that is not a directory, the nearest existing ancestor read-only or
    not writable (os.access, which reports a read-only mount even for root), a name too long. Creates nothing;
    call it before anything is built. ``flag`` names the option in the message."""
    text = os.fspath(path)
    if not str(text).strip():
        raise UsageError(f"{flag}: empty path")
    try:
        p = Path(text).expanduser().resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop, an unreadable component
        raise UsageError(f"{flag} {_short(text)}: cannot resolve the path "
                         f"({getattr(e, 'strerror', None) or e})") from None
    where = f"{flag} {_short(text)}" + ("" if str(p) == str(text) else f" ({_short(p)})")
    for k in _KERNEL_FS:
        if p == k or k in p.parents:
            raise UsageError(f"{where}: inside {k}, a kernel filesystem; choose a folder on a disk")
    anc = p
    while anc != anc.parent:  # the nearest existing ancestor (a path through a regular file does not exist)
        try:
            anc.stat()
            break
        except (FileNotFoundError, NotADirectoryError):
            anc = anc.parent
        except OSError as e:  # ENAMETOOLONG; EACCES: a folder on the way we may not search
            raise UsageError(f"{where}: {e.strerror}") from None
    if not anc.is_dir():
        raise UsageError(f"{where}: {_short(anc)} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        try:
            ro = bool(os.statvfs(anc).f_flag & os.ST_RDONLY)
        except OSError:
            ro = False
        why = "is on a read-only filesystem" if ro else "is not writable (permission denied)"
        nearest = "" if p == anc else ", the nearest existing folder,"
        raise UsageError(f"{where}: {_short(anc)}{nearest} {why}")
    return p


def default_out(name: str) -> Path:
    """The default output folder of a command's run: ``results/<name>-<YYYYmmdd-HHMMSS>`` under the working
    directory (a scenario's name, ``sweep-<scenario>``, ``audit``, ``lab-<NN-name>``, ``cli``)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path.cwd() / "results" / f"{name}-{stamp}"


class RunDir:
    """One run's folder. Times in the CSVs are time.monotonic() seconds; t0_monotonic pins them to wall time."""

    def __init__(self, path: Path, scenario: str, params: dict[str, Any], seed: int):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.manifest: dict[str, Any] = {
            "scenario": scenario,
            "params": params,
            "seed": seed,
            "started_wall": datetime.now(timezone.utc).isoformat(),
            "t0_monotonic": time.monotonic(),
            "t0_wall_epoch": time.time(),
            "ended_wall": None,
            "kernel_release": os.uname().release,
            "in_lab_vm": os.environ.get("TESTBED_IN_VM") == "1",
            "versions": versions(),
            "git_commit": git_commit(),
            "complete": False,
        }
        self.write_manifest()

    def write_manifest(self) -> None:
        tmp = self.path / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.manifest, indent=2, default=str) + "\n")
        tmp.replace(self.path / "manifest.json")

    def finish(self, summary: dict[str, Any]) -> None:
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        self.manifest["ended_wall"] = datetime.now(timezone.utc).isoformat()
        self.manifest["complete"] = True
        self.write_manifest()

    def write_csv(self, name: str, columns: list[str], rows: Iterable[Iterable[Any]]) -> Path:
        p = self.path / name
        with open(p, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns)
            for r in rows:
                w.writerow(r)
        return p
