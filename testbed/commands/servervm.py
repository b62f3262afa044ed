"""The lab VM as a second server on one box (docs/servers.md, issue 29): booted from a namespace of the run's (the
"wire": server-1's NIC, the tap QEMU makes for the guest's NIC lives there, never in the host's own network
configuration), the guest at the far end of the wire running an sshd of the run's own (testbed.vm.sshd), and a
servers file naming this machine (``localhost``, its wire address) and the guest (``root@198.19.0.2``, the run's
key). What it stands for: a second machine on the datacentre network, reachable over ssh as Mininet's cluster
edition reaches its servers.

    with sshd_vm(folder) as vm:            # folder: made here, shared with the guest, removed at the end
        with netns.entered(vm.wire):       # ssh and the local agent start where the wire is
            links = [AgentLink.start(s) for s in load(vm.servers)]

Everything goes on the way out, whatever happens: the stop file (sshd ends, the guest powers off), QEMU signalled
if it did not, whatever still runs in the wire namespace killed, the namespace and the folder removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.kernel import links, netns
from testbed.kernel.state import RunState
from testbed.vm import sshd

ROOT = Path(__file__).resolve().parents[2]
WIRE_HOST, WIRE_GUEST, PREFIXLEN = "198.19.0.1", "198.19.0.2", 24
TAP = "tbvm0"
CLI = [sys.executable, "-m", "testbed.cli"]


@dataclass
class SshdVm:
    """The booted VM: its wire namespace, the run's keys, the servers file (server-1 localhost, server-2 the VM), the
    ``testbed vm`` process, and this machine's CLOCK_MONOTONIC at the VM's launch and seconds to its sshd."""

    wire: str
    keys: sshd.Keys
    servers: Path
    proc: subprocess.Popen
    launched_s: float
    sshd_after_s: float = 0.0
    output: str = ""             # the VM's console, once it ended

    def cli(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """`testbed ARGV` run inside the wire namespace (ssh reaches the VM from there only)."""
        return subprocess.run(netns.in_namespace(self.wire, [*CLI, *argv]), capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))

    def guest(self):
        """A fresh agent link to the VM (ssh started inside the wire namespace)."""
        from testbed.network.serverlink import AgentLink
        from testbed.network.serversfile import load

        with netns.entered(self.wire):
            return AgentLink.start(load(self.servers)[1])


def _links_in(ns: str) -> list[str]:
    with netns.ipr_in(ns) as ipr:
        return [lk.get_attr("IFLA_IFNAME") for lk in ipr.get_links()]


def _ssh_port_open(wire: str, within_s: float, vm: subprocess.Popen) -> float:
    """Seconds until the guest's sshd accepts a TCP connection on the wire (from inside the wire namespace)."""
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        if vm.poll() is not None:
            raise RuntimeError(f"the VM ended (status {vm.returncode}) before its sshd listened")
        with netns.entered(wire):
            s = socket.socket()
        s.settimeout(1)
        try:
            s.connect((WIRE_GUEST, 22))
            return time.monotonic() - start
        except OSError:
            time.sleep(0.3)
        finally:
            s.close()
    raise TimeoutError(f"no sshd on {WIRE_GUEST}:22 within {within_s:.0f} s")


def _boot(wire: str, folder: Path, lifetime_s: float) -> subprocess.Popen:
    return subprocess.Popen(netns.in_namespace(wire, [*CLI, "vm", "--rwdir", str(folder), "--timeout",
                                                      str(int(lifetime_s + 20)), "--", sys.executable, "-m",
                                                      "testbed.vm.sshd", "serve", "--folder", str(folder),
                                                      "--address", f"{WIRE_GUEST}/{PREFIXLEN}", "--lifetime-s",
                                                      str(int(lifetime_s))]),
                            env=dict(os.environ, TESTBED_VM_TAP=TAP, PYTHONPATH=str(ROOT)), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _end(vm: SshdVm | None, proc: subprocess.Popen | None, keys: sshd.Keys | None, wire: str) -> None:
    """The stop file, then the VM's own end (sshd ends, the guest powers off), SIGTERM to ``testbed vm`` (it ends its
    QEMU) if it does not, SIGKILL if that does not either; whatever still runs in the wire namespace is killed in
    every case."""
    try:
        if keys is not None:
            keys.stop_file.touch()
        if proc is not None:
            out = ""
            for step in (None, proc.terminate, proc.kill):
                if step is not None:
                    step()
                try:
                    out = proc.communicate(timeout=120 if step is None else 60)[0] or ""
                    break
                except subprocess.TimeoutExpired:
                    continue
            if vm is not None:
                vm.output = out
    finally:
        for pid in netns.pids_in(wire):      # what still runs in the wire namespace (a QEMU still exiting)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def sshd_vm(folder: Path, lifetime_s: float = 280.0, boot_timeout_s: float = 240.0, servers_line: str = ""):
    """Boot the VM on a wire with its sshd; yield an :class:`SshdVm` once the sshd accepts connections.
    ``servers_line``: options added to the guest's line of the servers file (e.g. ``mtu=1500``). ``folder`` (made
    here: the keys, the servers file; shared with the guest) is removed on the way out with everything else."""
    state = RunState()
    wire = f"tb-{state.run_id}-wire"
    keys = proc = vm = None
    try:
        keys = sshd.make_keys(folder, WIRE_GUEST)
        servers = folder / "servers.txt"
        servers.write_text(f"server-1 localhost address={WIRE_HOST}\n"
                           f"server-2 root@{WIRE_GUEST} key={keys.client} {servers_line}\n")
        state.add("namespaces", wire)
        netns.create(wire)
        launched = time.monotonic()
        proc = _boot(wire, folder, lifetime_s)
        deadline = time.monotonic() + boot_timeout_s
        while TAP not in _links_in(wire):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the VM made no tap within {boot_timeout_s:.0f} s (status {proc.poll()})")
            time.sleep(0.2)
        links.add_address(wire, TAP, WIRE_HOST, PREFIXLEN)
        with netns.ipr_in(wire) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=TAP)[0], state="up")
        vm = SshdVm(wire, keys, servers, proc, launched)
        _ssh_port_open(wire, boot_timeout_s, proc)
        vm.sshd_after_s = time.monotonic() - launched
        yield vm
    finally:
        try:
            _end(vm, proc, keys, wire)
        finally:
            try:
                netns.remove(wire)
                state.drop()
            finally:
                shutil.rmtree(folder, ignore_errors=True)     # the run's private key with it
