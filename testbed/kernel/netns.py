"""Named network namespaces: create, enter, run a process in, remove.

A namespace created here is a named one (bind-mounted under /run/netns/), unlike Mininet's unnamed hosts, so every
tool (`ip netns`, `testbed clean`, pyroute2) can reach it by name. All names start with the project's prefix.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct
import subprocess
import threading
from pathlib import Path
from typing import Callable

import pyroute2.config
from pyroute2 import IPRoute
from pyroute2 import NetlinkError  # noqa: F401  (a netlink request's error, for callers outside testbed/kernel)
from pyroute2 import netns as _netns

from testbed.kernel import PREFIX

# pyroute2 opens a socket inside a named namespace from a forked child, then stops the child with SIGTERM. The
# runner turns SIGTERM into KeyboardInterrupt; a child that inherited that handler and is still inside pyroute2's
# wrapper when the signal lands unwinds the *parent's* stack copy, runs the run's teardown (removing the fabric's
# namespaces under the parent) and carries on as a second copy of the run. With this flag the child resets SIGTERM
# to the default action first. Set here, in the
# module every namespace user imports.
pyroute2.config.disable_mp_signal = True

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_SHARED = 1 << 20
MNT_DETACH = 2
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCGIFINDEX = 0x8933
IFF_UP = 0x1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def ours(name: str) -> bool:
    """True for names the project made (prefix `tb-`)."""
    return name.startswith(PREFIX + "-")


def _oserror(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _share_netns_dir() -> None:
    """/run/netns as a shared mount (bind-mounted onto itself first if it is not a mount point), as `ip netns add`
    does: a namespace bind-mounted under it then shows in every mount namespace."""
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    d = bytes(NETNS_DIR)
    if _libc.mount(b"", d, b"none", MS_SHARED | MS_REC, None) == 0:
        return
    if ctypes.get_errno() != errno.EINVAL:
        raise _oserror(f"mount --make-rshared {NETNS_DIR}")
    if _libc.mount(d, d, b"none", MS_BIND | MS_REC, None) != 0:
        raise _oserror(f"mount --rbind {NETNS_DIR} {NETNS_DIR}")
    if _libc.mount(b"", d, b"none", MS_SHARED | MS_REC, None) != 0:
        raise _oserror(f"mount --make-rshared {NETNS_DIR}")


def set_up(sock: socket.socket, ifname: str) -> None:
    """Interface `ifname` administratively up, through an ioctl on `sock` (an AF_INET datagram socket opened in
    the interface's namespace): one syscall, where a netlink request through pyroute2 costs about a millisecond."""
    req = struct.pack("16sH22x", ifname.encode(), 0)
    flags = struct.unpack_from("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, req))[1]
    if not flags & IFF_UP:
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH22x", ifname.encode(), flags | IFF_UP))


def ifindex(sock: socket.socket, ifname: str) -> int:
    """The index of interface `ifname` in the namespace of `sock` (an AF_INET datagram socket), by ioctl."""
    return struct.unpack_from("16si", fcntl.ioctl(sock, SIOCGIFINDEX, struct.pack("16s24x", ifname.encode())))[1]


def create(name: str, inside: Callable[[], object] | None = None):
    """Create the named namespace with loopback up, in-process (no helper process, unlike pyroute2's
    netns.create, which forks one per namespace: costly in the software-emulated lab VM).

    As `ip netns add` does: a short-lived thread unshares its network namespace and the namespace is bind-mounted
    from /proc onto /run/netns/<name>, which keeps it alive once the thread is gone. `inside`, if given, runs in
    that thread while it is inside the new namespace (e.g. to write sysctls or open sockets there); its result is
    returned."""
    if not ours(name):
        raise ValueError(f"namespace name {name!r} must start with {PREFIX}-")
    _share_netns_dir()
    path = NETNS_DIR / name
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    out: dict = {}

    def body() -> None:
        try:
            if _libc.unshare(CLONE_NEWNET) != 0:
                raise _oserror(f"unshare(CLONE_NEWNET) for {name}")
            src = f"/proc/self/task/{threading.get_native_id()}/ns/net".encode()
            if _libc.mount(src, bytes(path), b"none", MS_BIND, None) != 0:
                raise _oserror(f"bind mount of the new namespace on {path}")
            out["mounted"] = True
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                set_up(s, "lo")
            out["result"] = inside() if inside is not None else None
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = e

    t = threading.Thread(target=body, name=f"netns-create-{name}", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        if out.get("mounted"):
            _libc.umount2(bytes(path), MNT_DETACH)
        with contextlib.suppress(OSError):
            path.unlink()
        raise out["error"]
    return out["result"]


def remove(name: str) -> None:
    """Remove a namespace (its veths die with it); no error when it is already gone."""
    with contextlib.suppress(FileNotFoundError, OSError):
        _netns.remove(name)


def list_ours() -> list[str]:
    return sorted(n for n in _netns.listnetns() if ours(n))


def pids_in(name: str) -> list[int]:
    """Processes whose network namespace is the named one (agents, programs, shells started inside it)."""
    try:
        target = os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return []
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(d / "ns" / "net").st_ino == target:
                    pids.append(int(d.name))
    return pids


def ipr(name: str | None) -> IPRoute:
    """An IPRoute socket in the named namespace (None: the caller's own namespace)."""
    return IPRoute(netns=name) if name else IPRoute()


def ipr_in(name: str) -> IPRoute:
    """An IPRoute whose netlink socket lives in namespace `name`, opened from this thread while it is inside it.
    Unlike :func:`ipr` (IPRoute(netns=...)) it forks no child per socket, which costs a lot in the software-emulated
    lab VM when a fabric has dozens of ports."""
    with entered(name):
        return IPRoute()


def netlink_socket(name: str | None) -> socket.socket:
    """A raw NETLINK_ROUTE socket, bound, that lives in namespace `name` (None: the calling thread's): the kernel's
    rtnetlink, spoken without pyroute2 where each message's cost matters (plug changes, qdisc dumps, batches). A
    socket keeps the namespace it was created in, so the thread enters it only for the socket() call."""
    if name:
        with entered(name):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    else:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
    except BaseException:
        sock.close()
        raise
    return sock



def sockets_in(name: str, netlink: Callable[[], socket.socket]) -> tuple[IPRoute, socket.socket, socket.socket]:
    """(IPRoute, the socket ``netlink()`` opens (e.g. testbed.kernel.batch.open_socket, for a Batch), an AF_INET
    datagram socket for ioctls such as :func:`set_up` and :func:`ifindex`), all opened in namespace `name` with one
    namespace switch, as :func:`ipr_in` (no child forked); on failure the ones already opened are closed."""
    with entered(name):
        ipr = IPRoute()
        try:
            nl = netlink()
            try:
                return ipr, nl, socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            except BaseException:
                nl.close()
                raise
        except BaseException:
            ipr.close()
            raise

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
