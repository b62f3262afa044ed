"""Named network namespaces: create, enter, run a process in, remove.

A namespace created here is a named one (bind-mounted under /run/netns/), unlike Mininet's unnamed hosts, so every
tool (`ip netns`, `testbed clean`, pyroute2) can reach it by name. All names start with the project's prefix.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2 import netns as _netns

from testbed.kernel import PREFIX

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def ours(name: str) -> bool:
    """True for names the project made (prefix `tb-`)."""
    return name.startswith(PREFIX + "-")


def create(name: str) -> None:
    """Create the named namespace with loopback up."""
    if not ours(name):
        raise ValueError(f"namespace name {name!r} must start with {PREFIX}-")
    _netns.create(name)
    with IPRoute(netns=name) as ipr:
        idx = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=idx, state="up")


def remove(name: str) -> None:
    """Remove a namespace (its veths die with it); no error when it is already gone."""
    with contextlib.suppress(FileNotFoundError, OSError):
        _netns.remove(name)


def list_ours() -> list[str]:
    return sorted(n for n in _netns.listnetns() if ours(n))


def ipr(name: str | None) -> IPRoute:
    """An IPRoute socket in the named namespace (None: the caller's own namespace)."""
    return IPRoute(netns=name) if name else IPRoute()


def _setns(name: str) -> None:
    fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def entered(name: str):
    """Run the body with the calling thread inside namespace `name` (e.g. to open /proc/sys/net files there)."""
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(name)
        yield
    finally:
        _libc.setns(back, CLONE_NEWNET)
        os.close(back)


def in_namespace(name: str, argv: list[str]) -> list[str]:
    """argv wrapped to exec inside namespace `name` (nsenter: no Python code runs between fork and exec, which
    matters because pyroute2 keeps threads and a preexec_fn in a threaded process can deadlock)."""
    return ["nsenter", f"--net={NETNS_DIR / name}", "--", *argv]


def popen(name: str, argv: list[str], **kw) -> subprocess.Popen:
    """Start argv inside namespace `name` (popen-style: exit status and output are the caller's to check)."""
    return subprocess.Popen(in_namespace(name, argv), **kw)


def run(name: str, argv: list[str], timeout: float = 30, check: bool = False) -> subprocess.CompletedProcess:
    """Run argv inside namespace `name` to completion, capturing output."""
    return subprocess.run(in_namespace(name, argv), capture_output=True, text=True, timeout=timeout, check=check)


def sysctl_read(name: str | None, key: str) -> str:
    path = Path("/proc/sys") / key.replace(".", "/")
    if name is None:
        return path.read_text().strip()
    with entered(name):
        return path.read_text().strip()


def sysctl_write(name: str | None, key: str, value: str) -> None:
    """Write a per-namespace sysctl inside the namespace (never the host's own, unless name is None)."""
    path = Path("/proc/sys") / key.replace(".", "/")
    if name is None:
        path.write_text(str(value))
        return
    with entered(name):
        path.write_text(str(value))
