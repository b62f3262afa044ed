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
class WiredVm:
    """A lab VM booted on a wire (:func:`vm_on_wire`): the wire namespace (server-1's NIC, the tap's end addressed
    WIRE_HOST), the run's id and state (another namespace of the run is ``tb-<run_id>-<name>``, added to ``state``),
    the ``testbed vm`` process, this machine's CLOCK_MONOTONIC at its launch and seconds to its tap."""

    wire: str
    run_id: str
    state: RunState
    proc: subprocess.Popen
    launched_s: float
    tap_after_s: float = 0.0
    output: str = ""             # the VM's console (when captured), once it ended


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
    booted: WiredVm | None = None

    @property
    def output(self) -> str:
        """The VM's console, once it ended."""
        return self.booted.output if self.booted else ""

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


def sshd_command(folder: Path, lifetime_s: float) -> list[str]:
    """The guest's command of :func:`sshd_vm`: the run's sshd on the far end of the wire (testbed.vm.sshd)."""
    return [sys.executable, "-m", "testbed.vm.sshd", "serve", "--folder", str(folder), "--address",
            f"{WIRE_GUEST}/{PREFIXLEN}", "--lifetime-s", str(int(lifetime_s))]


def _boot(wire: str, guest_argv: list[str], timeout_s: float, rwdir: Path | None, capture: bool) -> subprocess.Popen:
    rw = ["--rwdir", str(rwdir)] if rwdir is not None else []
    out = subprocess.PIPE if capture else None
    return subprocess.Popen(netns.in_namespace(wire, [*CLI, "vm", *rw, "--timeout", str(int(timeout_s)), "--",
                                                      *guest_argv]),
                            env=dict(os.environ, TESTBED_VM_TAP=TAP, PYTHONPATH=str(ROOT)), start_new_session=True,
                            stdout=out, stderr=subprocess.STDOUT if capture else None, text=True)


def _tap_up(wire: str, proc: subprocess.Popen, within_s: float) -> float:
    """Wait for the tap QEMU makes in the wire namespace, give it WIRE_HOST and bring it up: seconds it took."""
    start = time.monotonic()
    while TAP not in _links_in(wire):
        if proc.poll() is not None or time.monotonic() - start > within_s:
            raise RuntimeError(f"the VM made no tap within {within_s:.0f} s (status {proc.poll()})")
        time.sleep(0.2)
    took = time.monotonic() - start
    links.add_address(wire, TAP, WIRE_HOST, PREFIXLEN)
    with netns.ipr_in(wire) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=TAP)[0], state="up")
    return took


def _end(vm: WiredVm | None, proc: subprocess.Popen | None, stop, wire: str) -> None:
    """``stop()`` (asking the guest to end) and the VM's own end, SIGTERM to ``testbed vm`` (it ends its QEMU) if it
    does not (at once without ``stop``), SIGKILL if that does not either; whatever still runs in the wire namespace
    is killed in every case."""
    try:
        if stop is not None:
            stop()
        if proc is not None:
            out = ""
            for step in ((None,) if stop is not None else ()) + (proc.terminate, proc.kill):
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
def vm_on_wire(guest_argv: list[str], timeout_s: float, boot_timeout_s: float = 240.0, rwdir: Path | None = None,
               stop=None, capture: bool = True):
    """Boot the lab VM running ``guest_argv`` (``testbed vm --timeout timeout_s``, ``rwdir`` shared with the guest)
    from a new wire namespace ``tb-<run>-wire``; yield a :class:`WiredVm` once its tap there is up with WIRE_HOST
    (the guest gives its NIC WIRE_GUEST itself). ``capture``: the VM's console kept in ``output`` (else it goes to
    this process's). On the way out, whatever happens: ``stop()`` and the VM's own end (none without ``stop``),
    then SIGTERM, SIGKILL, what still runs in the wire killed, the namespace removed."""
    state = RunState()
    wire = f"tb-{state.run_id}-wire"
    proc = vm = None
    try:
        state.add("namespaces", wire)
        netns.create(wire)
        launched = time.monotonic()
        proc = _boot(wire, guest_argv, timeout_s, rwdir, capture)
        vm = WiredVm(wire, state.run_id, state, proc, launched)
        vm.tap_after_s = _tap_up(wire, proc, boot_timeout_s)
        yield vm
    finally:
        try:
            _end(vm, proc, stop, wire)
        finally:
            netns.remove(wire)
            state.drop()


@contextlib.contextmanager
def sshd_vm(folder: Path, lifetime_s: float = 280.0, boot_timeout_s: float = 240.0, servers_line: str = ""):
    """Boot the VM on a wire with its sshd (:func:`vm_on_wire`, :func:`sshd_command`); yield an :class:`SshdVm` once
    the sshd accepts connections. ``servers_line``: options added to the guest's line of the servers file (e.g.
    ``mtu=1500``). ``folder`` (made here: the keys, the servers file; shared with the guest) is removed on the way
    out with everything else; its stop file asks the guest to end."""
    try:
        keys = sshd.make_keys(folder, WIRE_GUEST)
        servers = folder / "servers.txt"
        servers.write_text(f"server-1 localhost address={WIRE_HOST}\n"
                           f"server-2 root@{WIRE_GUEST} key={keys.client} {servers_line}\n")
        with vm_on_wire(sshd_command(folder, lifetime_s), lifetime_s + 20, boot_timeout_s, rwdir=folder,
                        stop=keys.stop_file.touch) as booted:
            vm = SshdVm(booted.wire, keys, servers, booted.proc, booted.launched_s, booted=booted)
            _ssh_port_open(booted.wire, boot_timeout_s, booted.proc)
            vm.sshd_after_s = time.monotonic() - booted.launched_s
            yield vm
    finally:
        shutil.rmtree(folder, ignore_errors=True)     # the run's private key with it
