"""How a program starts under a real Open MPI ``mpirun`` on the emulated fabric, and how far a launch got.

mpirun runs in the first host's namespace with a hostfile of the hosts' fabric addresses. It starts its daemons
(``orted``) on the other hosts through an rsh agent (:func:`rsh_agent`: what ssh is on a cluster, here ``nsenter``
into the host that owns the address); each daemon calls back to mpirun over the fabric, then starts its ranks.

Each host is its own node to Open MPI: mpirun and every daemon run in a UTS namespace of their own named after the
host (testbed.kernel.uts), as every server of a cluster has its own hostname. With the machine's one hostname on
every emulated host, Open MPI's node-keyed state on the one shared filesystem collides (see docs/programs.md,
"Why each host has its own name").

A launch that starts no rank within a bound is ended with one line naming where it stopped
(:class:`StartWatch`): which hosts' daemons are running, which are not.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from testbed.kernel import uts
from topologies.addressing import HOST_NET as _HOST_NET

#: the fabric's host addresses: what mpirun's transports are held to
HOST_NET = str(_HOST_NET)


@dataclass(frozen=True)
class Node:
    """One host as mpirun sees it: its fabric address, its named network namespace and its hostname."""
    address: str
    namespace: str
    name: str


def hostfile(nodes: list[Node], slots: dict[str, int]) -> str:
    """Open MPI hostfile: one fabric address per host with its slots (ranks on it)."""
    return "".join(f"{n.address} slots={slots[n.name]}\n" for n in nodes)


def rsh_agent(nodes: list[Node]) -> str:
    """The rsh agent's script: ``rsh [options] HOST CMD...`` runs CMD in the namespace of the host that owns the
    address HOST, under that host's own hostname; any other HOST is refused (exit 255, as ssh's)."""
    cases = "".join(f"  {n.address}) ns={shlex.quote(n.namespace)} name={shlex.quote(uts.hostname_for(n.name))} ;;\n"
                    for n in nodes)
    return ("#!/bin/sh\n# mpirun's remote shell on the emulated fabric: ssh HOST CMD becomes CMD in HOST's namespace\n"
            "while [ $# -gt 0 ] && [ \"${1#-}\" != \"$1\" ]; do shift; done\n"
            "host=$1; shift\ncase \"$host\" in\n" + cases +
            "  *) echo \"testbed rsh: $host is not a host of this fabric\" >&2; exit 255 ;;\nesac\n"
            f"exec nsenter --net=/run/netns/$ns {uts.SHELL_NAMED} \"$name\" \"$*\"\n")


def argv(hostfile_path: Path, agent: Path, ranks: int, output_dir: Path, exports: list[str], cwd: str,
         cmd: str) -> list[str]:
    """mpirun with the hostfile, the rsh agent, its transports held to the fabric, and ``cmd`` run by ``sh -c``."""
    return ["mpirun", "--allow-run-as-root", "--hostfile", str(hostfile_path), "-np", str(ranks),
            "--map-by", "slot", "--mca", "plm_rsh_agent", str(agent), "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", HOST_NET,
            "--mca", "oob_tcp_if_include", HOST_NET,
            # every emulated host shares this machine's CPUs: a rank waiting for the network yields its CPU
            # instead of spinning (Open MPI's oversubscribed mode), or it starves the other ranks and the shapers
            "--mca", "mpi_yield_when_idle", "1", "--output-filename", str(output_dir),
            *[a for e in dict.fromkeys(exports) for a in ("-x", e)], "--wdir", cwd, "sh", "-c", cmd]


def session_dir(hostname: str, pid: int) -> Path:
    """mpirun's own session directory (Open MPI 4: ``<tmp>/ompi.<hostname>.<uid>/pid.<mpirun's pid>``)."""
    import tempfile

    return Path(tempfile.gettempdir()) / f"ompi.{hostname}.{os.geteuid()}" / f"pid.{pid}"


def remove_session_dir(hostname: str, pid: int) -> None:
    """Remove what a killed mpirun left of its session directory (it removes it itself when it ends normally), and
    the host's top directory when that is then empty."""
    import shutil

    d = session_dir(hostname, pid)
    shutil.rmtree(d, ignore_errors=True)
    try:
        d.parent.rmdir()
    except OSError:
        pass  # not empty (another launch's) or already gone


@dataclass
class Proc:
    """A process of the program: its pid, command name, environment variable names and network namespace inode."""
    pid: int
    comm: str
    env_names: frozenset
    net_inode: int


def program_processes(token: str) -> list[Proc]:
    """Processes whose environment carries TESTBED_PROGRAM=token (every process of one launch)."""
    mark, out = f"TESTBED_PROGRAM={token}".encode(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            if mark not in env:
                continue
            comm = (d / "comm").read_text().strip()
            inode = os.stat(d / "ns" / "net").st_ino
        except OSError:
            continue
        out.append(Proc(int(d.name), comm, frozenset(e.split(b"=", 1)[0].decode(errors="replace") for e in env),
                        inode))
    return out


def rank_started(procs: list[Proc]) -> bool:
    """Whether mpirun has started a rank: a process with the rank environment Open MPI gives its ranks."""
    return any("OMPI_COMM_WORLD_RANK" in p.env_names for p in procs)


def daemon_hosts(procs: list[Proc], inode_host: dict[int, str]) -> list[str]:
    """The hosts on which one of mpirun's daemons (orted) runs, by the network namespace it runs in."""
    return sorted({inode_host[p.net_inode] for p in procs if p.comm == "orted" and p.net_inode in inode_host})


def no_rank_line(bound_s: float, remote: list[str], up: list[str], stderr_last: str) -> str:
    """The one line that ends a launch which started no rank within ``bound_s``: where the daemons got to."""
    down = [h for h in remote if h not in up]
    if not remote:
        where = "mpirun's own host had no rank running"
    elif not down:
        where = f"its daemons (orted) came up on all of {', '.join(remote)}"
    elif not up:
        where = f"no daemon (orted) came up on {', '.join(down)}"
    else:
        where = f"its daemons (orted) came up on {', '.join(up)}, not on {', '.join(down)}"
    said = f"; mpirun.stderr: {stderr_last}" if stderr_last else "; nothing on mpirun.stderr"
    return f"program: mpirun started no rank within {bound_s:g} s: {where}{said}"


class StartWatch:
    """The launch's start bound: until a rank has started, :meth:`check` (at most every ``every_s``) reads the
    program's processes; past ``bound_s`` without a rank it returns the line that ends the run."""

    def __init__(self, token: str, host_namespaces: dict[str, str], bound_s: float, every_s: float = 0.5):
        self.token, self.bound_s, self.every_s = token, bound_s, every_s
        self.hosts = list(host_namespaces)
        self.inode_host = {}
        for host, ns in host_namespaces.items():
            try:
                self.inode_host[os.stat(f"/run/netns/{ns}").st_ino] = host
            except OSError:
                pass
        self.started = False
        self._next = 0.0

    def check(self, elapsed_s: float, stderr_last: Callable[[], str] = lambda: "") -> str | None:
        if self.started or elapsed_s < self._next:
            return None
        self._next = elapsed_s + self.every_s
        procs = program_processes(self.token)
        if rank_started(procs):
            self.started = True
            return None
        if elapsed_s < self.bound_s:
            return None
        return no_rank_line(self.bound_s, self.hosts[1:], daemon_hosts(procs, self.inode_host), stderr_last())
