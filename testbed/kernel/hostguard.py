"""Keep the host's own configuration as it was: snapshot host sysctls before a peer tool may change them, restore
them afterwards, and record the old values in the run's state so that `testbed clean` restores them after a kill.

The one known offender is Mininet itself: ``Mininet.init()`` (called by ``Mininet.__init__``) runs
``mininet.util.fixLimits()``, which raises global sysctls (socket buffer maxima, TCP buffer ranges, the backlog,
neighbour-table thresholds, the route cache, pty and file maxima) in the initial namespace and never puts them back.
The testbed's own Mininet nodes skip ``fixLimits`` (see :func:`skip_mininet_fixlimits`); stock Mininet, run as a
benchmark peer, is wrapped in :func:`preserved_sysctls`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from testbed.kernel import netns

#: every sysctl mininet.util.fixLimits() may write (Debian's mininet 2.3.0), in the initial namespace
MININET_FIXLIMITS_SYSCTLS = (
    "fs.file-max",
    "net.core.wmem_max", "net.core.rmem_max",
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.core.netdev_max_backlog",
    "net.ipv4.neigh.default.gc_thresh1", "net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3",
    "net.ipv4.route.max_size",
    "kernel.pty.max",
)


def _path(key: str) -> Path:
    return Path("/proc/sys") / key.replace(".", "/")


def snapshot(keys: Sequence[str]) -> dict[str, str]:
    """The current value of each host sysctl in ``keys`` that this kernel has (whitespace normalised)."""
    out = {}
    for k in keys:
        with contextlib.suppress(OSError):
            out[k] = " ".join(_path(k).read_text().split())
    return out


def restore(saved: Mapping[str, str]) -> list[str]:
    """Write back every value in ``saved`` that differs now; returns the keys that were restored."""
    changed = []
    now = snapshot(list(saved))
    for k, v in saved.items():
        if now.get(k) != v:
            netns.sysctl_write(None, k, v)
            changed.append(k)
    return changed


@contextlib.contextmanager
def preserved_sysctls(keys: Sequence[str] = MININET_FIXLIMITS_SYSCTLS, state=None) -> Iterator[dict[str, str]]:
    """Snapshot ``keys`` on entry and restore them on exit (success, failure, Ctrl-C). With a
    :class:`testbed.kernel.state.RunState`, the old values are recorded first, so `testbed clean` restores them if the
    process is killed before it can."""
    saved = snapshot(keys)
    if state is not None:
        for k, v in saved.items():
            state.add("sysctls", {"key": k, "old": v})
    try:
        yield saved
    finally:
        restore(saved)


def skip_mininet_fixlimits() -> None:
    """Keep ``Mininet()`` from calling ``fixLimits()`` in this process (it marks Mininet as initialised; root is
    checked by the testbed itself). The per-process limits fixLimits would raise (open files) are raised here,
    which touches only this process."""
    import resource

    from mininet.net import Mininet

    Mininet.inited = True
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(16384, hard) if hard != resource.RLIM_INFINITY else 16384
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
