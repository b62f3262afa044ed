"""What a live run has created, on disk, so that `testbed clean` can undo a run that was killed.

Each run writes /run/testbed/<run_id>.json (tmpfs: it does not survive a reboot, and neither do namespaces) with its
namespaces, host-side links, rxe devices, OVS bridges, agent pids, the private job folders a server's agent made for
the processes it started (``folders``: tb-<run>-job-* in the temporary directory, testbed.commands.serverprocs) and
every sysctl it changed with the value it had.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from testbed.kernel import netns

STATE_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))


class RunState:
    def __init__(self, run_id: str | None = None):
        self.run_id = run_id or secrets.token_hex(2)
        self.path = STATE_DIR / f"{self.run_id}.json"
        self.data: dict = {"run_id": self.run_id, "pid": os.getpid(), "namespaces": [], "links": [],
                           "rxe": [], "ovs_bridges": [], "pids": [], "folders": [], "sysctls": []}

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)

    def add(self, kind: str, item) -> None:
        self.data[kind].append(item)
        self.save()

    def discard(self, kind: str, *items) -> None:
        """Forget ``items`` of ``kind`` (undone by their maker); saved only when something was recorded."""
        kept = [x for x in self.data.get(kind, []) if x not in items]
        if len(kept) != len(self.data.get(kind, [])):
            self.data[kind] = kept
            self.save()

    def set_sysctl(self, ns: str | None, key: str, value: str) -> None:
        """Change a sysctl and record the old value (a namespace's sysctls die with it; the host's are restored)."""
        old = netns.sysctl_read(ns, key)
        if ns is None:
            self.add("sysctls", {"key": key, "old": old})
        netns.sysctl_write(ns, key, value)

    def drop(self) -> None:
        self.path.unlink(missing_ok=True)


def saved_states() -> list[dict]:
    out = []
    if STATE_DIR.is_dir():
        for p in sorted(STATE_DIR.glob("*.json")):
            try:
                d = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            d["_path"] = str(p)
            out.append(d)
    return out
