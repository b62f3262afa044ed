"""Two kernels on one box over a wire (docs/servers.md): the lab VM booted from a project namespace with its NIC's
tap there, and nothing left when the run is sent SIGTERM mid-boot (benchmarks/two_kernels.py, which also pings
across the wire and a VXLAN link and measures the guest clock's offset: a documented command, its figures in
docs/servers.md); then the VM as a server reached over ssh: its own sshd on the wire, `testbed servers check` /
`clean` through the agents, the guest clock's offset (its bound under 2 ms, and minus the offset, the host's clock
at the guest's boot, between the VM's launch and its sshd listening), a fabric across both kernels, and `testbed run
collective --set servers=FILE` over them: a ring all-reduce with its control channel TCP over the wire and its ops
on one clock (tests.serverdrive.servers_file_run).

One VM boot per test (about 10 s and 120 s under software emulation). The benchmark's full run (ping, tunnel and two
clock passes: 43-57 s with its own boot) left CI's host layer: the servers test crosses the same wire and tunnel
with pings and a verified transfer, and makes the same clock checks. Measured over 3 runs of the benchmark
(docs/servers.md): every ping arrived, the offset's bound was 267-324 us with the fastest exchange 552-712 us."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from testbed.commands.servervm import CLI, WIRE_GUEST, WIRE_HOST, SshdVm
from testbed.commands.servervm import sshd_vm as boot_sshd_vm
from testbed.kernel import netns

ROOT = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, str(ROOT / "benchmarks" / "two_kernels.py")]


def qemu_with_our_tap() -> list[str]:
    """QEMU processes whose command line names the benchmark's tap (no other user of the machine makes one)."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "qemu-system" in cmd and "ifname=tbvm0" in cmd:
            found.append(p.name)
    return found


def qemu_gone(within_s: float = 10.0) -> bool:
    """No QEMU of the benchmark's within a few seconds: the VM's QEMU is signalled through its process group and may
    still be exiting (closing its tap and drives) when the process that signalled it returns; one alive after
    ``within_s`` is a leak."""
    deadline = time.monotonic() + within_s
    while qemu_with_our_tap():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def vm_folders_with_our_tap() -> list[Path]:
    """testbed vm's results folders (/tmp/testbed-vm-*) of a VM given the benchmark's tap."""
    return [p.parent for p in Path("/tmp").glob("testbed-vm-*/guest.sh") if "TESTBED_VM_TAP" in p.read_text()]


def test_sigterm_mid_boot_leaves_nothing():
    before = set(netns.list_ours())
    folders_before = set(vm_folders_with_our_tap())
    p = subprocess.Popen(BENCH, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not qemu_with_our_tap():           # the VM is booting, its tap in the wire namespace
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()[-2000:] if p.stderr else ""
            time.sleep(0.2)
        ours = set(netns.list_ours()) - before
        assert any(n.endswith("-wire") for n in ours), ours
        p.terminate()
        p.wait(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0
    assert not ours & set(netns.list_ours()), netns.list_ours()
    assert qemu_gone(), qemu_with_our_tap()
    assert set(vm_folders_with_our_tap()) <= folders_before


# ---- the lab VM as a server reached over ssh: `testbed servers check` (docs/servers.md) ------------------------

#: the TCP transfer across the kernels: 2 MB, 0.8 s at the fabric's 20 Mbit/s
FABRIC_BYTES = 2_000_000


def _agents_running(since: set[str] | None = None, wire: str | None = None) -> list[str]:
    """This machine's server agents, ssh clients to the guest and sshd processes that were not running before the
    test (the check must leave none; an sshd the machine had before, and its login sessions, are the
    administrator's: scripts/install.sh leaves them alone); with ``wire``, only those in the wire namespace, where
    every agent and ssh client of this test starts (another run's agents on a shared machine are not this test's)."""
    found = []
    inside = {str(pid) for pid in netns.pids_in(wire)} if wire else None
    for p in Path("/proc").iterdir():
        if (since is not None and p.name in since) or (inside is not None and p.name not in inside):
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "testbed.commands.serveragent" in cmd or (cmd.startswith("ssh ") and WIRE_GUEST in cmd) \
                or cmd.startswith("/usr/sbin/sshd") or cmd.startswith("sshd:"):
            found.append(f"{p.name}: {cmd[:120]}")
    return found


#: what ran before this module's tests (an administrator's sshd and its sessions): never counted as left behind
_BEFORE = {line.split(":", 1)[0] for line in _agents_running()}


@contextlib.contextmanager
def sshd_vm(tmp_path: Path):
    """Boot the VM on a wire with sshd as its command (testbed.commands.servervm, which on the way out touches the
    stop file, ends QEMU if it did not, removes the namespace and the keys' folder), then assert nothing is left."""
    folder = tmp_path / "servers"   # shared with the guest (--rwdir); removed by servervm
    with boot_sshd_vm(folder, lifetime_s=340) as vm:
        yield vm
    print(vm.output[-2000:])
    assert vm.proc.returncode == 0
    assert vm.wire not in netns.list_ours()
    assert qemu_gone(), qemu_with_our_tap()
    assert not folder.exists() and not _agents_running(_BEFORE)


def _all_checks_pass(vm: SshdVm, numbers: Path) -> None:
    r = vm.cli("servers", "check", str(vm.servers), "--max-offset-uncertainty-ms", "2", "--json", str(numbers))
    print(f"sshd listening {vm.sshd_after_s:.1f} s after launch\n{r.stdout}{r.stderr}")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for name, checks in (("server-1", ("reach", "version", "kernel", "nic")),
                         ("server-2", ("reach", "version", "kernel", "nic", "mtu", "vxlan", "clock"))):
        for c in checks:
            assert any(x.split()[:3] == [name, c, "ok"] for x in lines), (name, c, r.stdout)
    clock = next(x for x in lines if x.split()[:2] == ["server-2", "clock"])
    assert " +- " in clock and f"ssh root@{WIRE_GUEST}" in r.stdout
    kernels = [x.split()[3] for x in lines if x.split()[1:2] == ["kernel"]]
    assert len(kernels) == 2 and kernels[0] != kernels[1], kernels   # two kernels
    n = json.loads(numbers.read_text())["numbers"]["server-2"]
    assert 0 < n["clock"]["uncertainty_s"] < 2e-3 and n["clock"]["n"] >= 95 and len(n["agent_rtt_s"]) == 20, n
    assert n["clock"]["n_invalid"] == 0, n["clock"]   # no exchange the probe had to throw away
    # the offset is the guest's clock minus this one's, and the guest's CLOCK_MONOTONIC began near 0 at its boot: so
    # minus the offset (this machine's clock at the guest's boot) lies between the VM's launch and its sshd listening
    booted_s, unc_s = -n["clock"]["offset_s"], n["clock"]["uncertainty_s"]
    assert vm.launched_s - unc_s <= booted_s <= vm.launched_s + vm.sshd_after_s + unc_s, (vm, n["clock"])
    print(json.dumps({"sshd_after_s": vm.sshd_after_s, "reach_s": n["reach_s"], "agent_rtt_s": n["agent_rtt_s"],
                      "clock": n["clock"]}))
    assert not _agents_running(_BEFORE, vm.wire), _agents_running(_BEFORE, vm.wire)


def _sigterm_leaves_nothing(vm: SshdVm) -> None:
    """SIGTERM while the check works on the VM's tunnel (right after its MTU line): nothing stays on either side."""
    before = set(netns.list_ours())
    p = subprocess.Popen(netns.in_namespace(vm.wire, [*CLI, "servers", "check", str(vm.servers)]), cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.split()[:2] == ["server-2", "mtu"]:
            p.terminate()
            break
    rest = p.communicate(timeout=60)[0]
    assert p.returncode != 0 and any("server-2     mtu" in x for x in seen), "".join(seen) + rest
    assert "clock" not in rest, rest                 # it stopped before the clock check
    time.sleep(1)
    assert not _agents_running(_BEFORE, vm.wire), _agents_running(_BEFORE, vm.wire)
    assert set(netns.list_ours()) <= before, set(netns.list_ours()) - before
    with vm.guest() as guest:
        left = guest.call("run", argv=["ip", "netns", "list"])
        assert left["rc"] == 0 and "tb-" not in left["stdout"], left
        agents = guest.call("run", argv=["pgrep", "-f", "testbed.commands.serveragent"])
        assert agents["stdout"].split() == [str(guest.call("ping")["pid"])], agents  # only this agent


def _clean_reaches_the_guest(vm: SshdVm) -> None:
    """`testbed clean --servers` (as `testbed servers clean`) with a file naming only the VM (the host's other tb-
    namespaces are not its business) removes what a killed run would leave in the guest: a namespace with a process
    in it."""
    with vm.guest() as guest:
        guest.call("run", argv=["sh", "-c", "ip netns add tb-zz99-left && (ip netns exec tb-zz99-left "
                                "sleep 291 >/dev/null 2>&1 </dev/null &)"])
    only_vm = vm.servers.with_name("vm.txt")
    only_vm.write_text(f"server-2 root@{WIRE_GUEST} key={vm.keys.client}\n")
    r = vm.cli("clean", "--servers", str(only_vm), timeout=120)
    assert r.returncode == 0 and "server-2     clean    ok    removed 1 processes, 1 namespaces" in r.stdout, \
        r.stdout + r.stderr
    with vm.guest() as guest:
        left = guest.call("run", argv=["sh", "-c", "ip netns list; pgrep -x sleep || true"])
        assert left["stdout"].strip() == "", left


def _fabric_across_kernels(vm: SshdVm) -> None:
    """A 2x2 leaf-spine (one host per leaf, 20 Mbit/s, MTU 1450 so VXLAN fits the 1500-byte wire) over the two
    kernels: each server's agent builds its share (testbed.network.serverfabric), leaf2, spine2 and h2 in the
    VM's kernel, the rest in the host's, the two crossing links VXLAN over the wire. Pings and a TCP transfer with its
    data checked cross between the kernels; the VM's NIC counted the VXLAN datagrams; the record (servers.json) has
    each server's kernel, nodes and two clock passes whose bounds agree; each side's teardown leaves no
    namespace of the run; a share whose lab vanishes (its agent's input closes, as when the lab is SIGKILLed) is
    removed by the guest's agent itself."""
    from tests.serverdrive import assert_delivered, transfer
    from testbed.network.serverfabric import ServerFabric
    from testbed.network.serverlink import AgentLink
    from testbed.network.serversfile import load
    from topologies.leafspine import uniform_leaf_spine

    topo = uniform_leaf_spine(2, 2, 1, 20, 20, mtu=1450)
    run = secrets.token_hex(3)
    t0 = time.monotonic()
    with netns.entered(vm.wire):
        local = AgentLink.start(load(vm.servers)[0])
    guest = vm.guest()
    try:
        with ServerFabric(topo, run, [local, guest]) as fab:
            d = fab.describe()
            assert d["placement"]["server-2"] == ["h2", "leaf2", "spine2"], d
            kernels = {s: x["kernel"] for s, x in d["servers"].items()}
            assert kernels["server-1"] == os.uname().release != kernels["server-2"], kernels   # two kernels
            fab.clock()
            ping = netns.run(fab.ns("h1"), ["ping", "-n", "-q", "-c", "5", "-i", "0.2", topo.host_ip("h2")])
            assert " 5 received" in ping.stdout, ping.stdout
            before = fab.counters()
            out = transfer(fab, "h1", "h2", FABRIC_BYTES)
            seconds = assert_delivered(out, FABRIC_BYTES)
            after = fab.counters()["server-2"]
            # the VM's NIC received VXLAN datagrams (fewer than frames: its virtio NIC aggregates them, GRO) and its
            # crossing ports passed every byte of the transfer
            got = after["udp"]["InDatagrams"] - before["server-2"]["udp"]["InDatagrams"]
            assert got > 0 and sum(p["rx_bytes"] for p in after["ports"].values()) >= FABRIC_BYTES, after
            fab.clock()
            rec = fab.record(vm.servers.with_name("servers.json"))["servers"]
            assert rec["server-2"]["kernel"] == kernels["server-2"] and rec["server-2"]["nodes"] == ["h2", "leaf2",
                                                                                                     "spine2"]
            a, b = rec["server-2"]["clock"]   # the guest's clock against the host's, at the start and the end
            for c in (a, b):
                assert c["n"] >= 95 and c["n_invalid"] == 0 and 0 < c["uncertainty_s"] < 2e-3, c
            slack_s = a["uncertainty_s"] + b["uncertainty_s"] + 1e-4 * (b["at_s"] - a["at_s"])
            assert abs(a["offset_s"] - b["offset_s"]) <= slack_s, (a, b)
            print(json.dumps({"since_start_s": time.monotonic() - t0, "fabric": d,
                              "ping": ping.stdout.strip().splitlines()[-1], "transfer_s": seconds,
                              "vxlan_datagrams_into_vm": got, "clock": [a, b]}))
        assert not [n for n in netns.list_ours() if n.startswith(f"tb-{run}-")]
        print(f"fabric torn down {time.monotonic() - t0:.1f} s after the agents' start")
        left = guest.call("run", argv=["sh", "-c", "ip netns list; ip -o link show"])
        assert f"tb-{run}-" not in left["stdout"] and "tbvx" not in left["stdout"], left   # the server's own stack
        with netns.ipr_in(vm.wire) as ipr:   # the host server's own stack here: the wire namespace
            names = [link.get_attr("IFLA_IFNAME") for link in ipr.get_links()]
        assert not [n for n in names if n.startswith("tbvx")], names
        _share_goes_with_its_lab(vm, topo, local, guest)
        print(f"fabric part {time.monotonic() - t0:.1f} s")
    finally:
        local.close()
        guest.close()


def _share_goes_with_its_lab(vm: SshdVm, topo, local, guest) -> None:
    """The lab vanishes (as when it is SIGKILLed): the agents' input ends and each removes its share itself. The
    guest's last look also finds nothing the earlier servers-file run (tests.serverdrive.servers_file_run) left: no
    namespace, rank or job folder."""
    from testbed.network.serverfabric import ServerFabric

    run2 = secrets.token_hex(3)
    ServerFabric(topo, run2, [local, guest]).build()
    for lk in (guest, local):
        lk.proc.stdin.close()
        assert lk.proc.wait(timeout=60) == 0
    assert not [n for n in netns.list_ours() if n.startswith(f"tb-{run2}-")]
    with vm.guest() as again:
        left = again.call("run", argv=["sh", "-c", "ip netns list; ip -o link show; pgrep -f 'traffic[.]agent'; "
                                       "ls -d /tmp/tb-*-job-* 2>/dev/null; true"])
        assert left["rc"] == 0 and "tb-" not in left["stdout"] and "tbvx" not in left["stdout"], left
        assert not [x for x in left["stdout"].splitlines() if x.strip().isdigit()], left   # no rank's pid


def test_servers_check_over_ssh_into_the_vm(tmp_path):
    """One VM boot (sshd on the wire, started by testbed.vm.sshd), then `testbed servers check` over {localhost, the
    VM} run inside the wire namespace: every check passes and the offset's bound is reported; a server that does not
    answer is one failed line and status 1; a check sent SIGTERM while it works on the VM leaves no agent, ssh
    client or namespace on either side; `testbed clean --servers` reaches the guest; the VM powers off when told (the
    run's stop file) and nothing is left: namespaces, QEMU, agents, sshd, the keys' folder.

    Then a fabric over both kernels (_fabric_across_kernels: 20.9-21.8 s of it, n=3), and a servers-file run
    across them (tests.serverdrive.servers_file_run: `testbed run collective --set servers=FILE`, a ring all-reduce
    over the kernels with both causal checks, and a bad file; it replaced the all-reduce the fabric part ran
    through serverjobs.run_collective directly, 5.4-7.3 s, which the one-kernel test still runs). The whole test took
    117-119 s (n=3) and 125 s on a machine shared with other runs (the VM's boot to sshd listening: 20-24 s; 80 s was
    seen under other helpers' loads; 134-227 s, n=5, with the all-reduce, on a machine shared with other VM runs).
    Measured over 6 runs
    (docs/servers.md): the offset's bound was 274-445 us with the fastest exchange 587-957 us; the 2 ms limit leaves
    room for a machine 3x busier, as the benchmark's own run did (docs/servers.md)."""
    with sshd_vm(tmp_path) as vm:
        _all_checks_pass(vm, tmp_path / "numbers.json")
        # nothing at .9 on the wire: one failed line for that server, status 1
        bad = vm.servers.with_name("bad.txt")
        bad.write_text(f"server-1 localhost address={WIRE_HOST}\nserver-3 root@198.19.0.9 key={vm.keys.client}\n")
        r = vm.cli("servers", "check", str(bad), "--connect-timeout-s", "2", timeout=120)
        assert r.returncode == 1 and "server-3     reach    FAIL" in r.stdout, r.stdout + r.stderr
        assert "server-1     nic      ok" in r.stdout, r.stdout
        _sigterm_leaves_nothing(vm)
        _clean_reaches_the_guest(vm)
        from tests.serverdrive import servers_file_run

        servers_file_run(vm, tmp_path, WIRE_HOST, WIRE_GUEST, lambda: _agents_running(_BEFORE, vm.wire))
        _fabric_across_kernels(vm)   # its last look into the guest also covers what the run could have left there
