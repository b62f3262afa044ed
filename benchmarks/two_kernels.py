#!/usr/bin/env python3
"""Two kernels on one box, reachable over a wire: the lab VM as a second server (docs/servers.md, issue 29).

    sudo .venv/bin/python benchmarks/two_kernels.py [--exchanges 200] [--gap-s 10] [--out FILE]

The VM is booted (testbed vm, virtme-ng) from inside a project namespace ``tb-<run>-wire``, so the tap QEMU makes
for the guest's NIC lives there, never in the host's own network configuration. The namespace stands for server-1's
NIC; the guest is server-2 at the far end of the wire (198.19.0.1 <-> 198.19.0.2, the datacentre network's range).
Then, over that wire:

* ping: the round trip between the two kernels (20 echoes);
* the clock: the guest runs the clock echo (testbed.measure.clockprobe), the host probes it twice, ``--gap-s``
  apart; each pass gives an offset (guest CLOCK_MONOTONIC - host CLOCK_MONOTONIC) with its bound
  (analysis.clockoffset), the two the drift. A sanity check: the guest's clock started while the VM booted, so
  minus the offset must lie between the host's clock when the VM was launched and when its echo first answered;
* a crossing link: a VXLAN end made in the wire namespace and moved into a host namespace ``tb-<run>-h1``
  (testbed.kernel.tunnel, as a split fabric makes them), its peer a VXLAN device in the guest; 10 pings cross it.

Prints one JSON object (also to --out). Nothing is left: the namespaces are removed and the VM ends on success,
failure, Ctrl-C and SIGTERM. A benchmark, not a test: the numbers depend on the (software-emulated) VM and the load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HOST_IP, GUEST_IP, PREFIXLEN = "198.19.0.1", "198.19.0.2", 24
INNER_HOST_IP, INNER_GUEST_IP = "198.18.42.1", "198.18.42.2"
VNI = 42
TAP = "tbvm0"


def guest_script(port: int) -> str:
    """What the guest runs: its NIC up with the far address, a VXLAN peer, then the clock echo until told to stop."""
    return "; ".join([
        "set -e", "modprobe virtio_net 2>/dev/null || true", "ip link set lo up",
        "dev=$(for d in /sys/class/net/*; do n=${d##*/}; [ $n = lo ] || echo $n; done | head -1)",
        f"ip addr add {GUEST_IP}/{PREFIXLEN} dev $dev", "ip link set $dev up",
        f"ip link add vx{VNI} type vxlan id {VNI} local {GUEST_IP} remote {HOST_IP} dstport 4789 dev $dev nolearning",
        f"ip addr add {INNER_GUEST_IP}/24 dev vx{VNI}", f"ip link set vx{VNI} up",
        'echo "guest kernel $(uname -r) nic $dev"',
        f"exec {shlex.quote(sys.executable)} -m testbed.measure.clockprobe serve --bind {GUEST_IP} --port {port} "
        "--idle-s 180",
    ])


def ping_stats(ns: str, addr: str, count: int) -> dict:
    from testbed.kernel import netns

    r = netns.run(ns, ["ping", "-n", "-q", "-c", str(count), "-i", "0.2", "-W", "2", addr], timeout=count + 30)
    m = re.search(r"(\d+) received.*?rtt min/avg/max/mdev = ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)", r.stdout, re.S)
    if not m:
        return {"received": 0, "sent": count, "output": r.stdout.strip()[-200:]}
    return {"sent": count, "received": int(m[1]), "rtt_min_ms": float(m[2]), "rtt_avg_ms": float(m[3]),
            "rtt_max_ms": float(m[4]), "rtt_mdev_ms": float(m[5])}


def wait_for_tap(ns: str, within_s: float, vm: subprocess.Popen) -> float:
    from testbed.kernel import links

    start = time.monotonic()
    while time.monotonic() - start < within_s:
        if vm.poll() is not None:
            raise RuntimeError(f"the VM ended (status {vm.returncode}) before its tap appeared")
        try:
            links.index(ns, TAP)
            return time.monotonic() - start
        except Exception:  # noqa: BLE001 - not there yet
            time.sleep(0.2)
    raise TimeoutError(f"no tap {TAP} in {ns} within {within_s:.0f} s")


def clock_pass(ns: str, port: int, exchanges: int) -> dict:
    from analysis.clockoffset import estimate
    from testbed.kernel import netns
    from testbed.measure import clockprobe

    with netns.entered(ns):
        ex = clockprobe.probe(GUEST_IP, port, count=exchanges, interval_s=0.01)
    est = estimate(ex)
    delays = sorted(e.delay_s for e in ex)
    return {**est.as_dict(), "delay_median_s": delays[len(delays) // 2], "sent": exchanges}


def wire_up(wire: str, node: str) -> None:
    """The host end of the wire (the tap QEMU made) and the crossing link's host end (a VXLAN end in a node)."""
    from testbed.kernel import links, netns, tunnel

    links.add_address(wire, TAP, HOST_IP, PREFIXLEN)
    with netns.ipr_in(wire) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname=TAP)[0], state="up")
    tunnel.add_vxlan_end(wire, node, "eth0", VNI, HOST_IP, GUEST_IP, "02:00:c6:12:2a:01", 1450)
    links.add_address(node, "eth0", INNER_HOST_IP, 24)
    with netns.ipr_in(node) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="eth0")[0], state="up")


def measure(wire: str, node: str, vm: subprocess.Popen, launched: float, args) -> dict:
    from analysis.clockoffset import ClockModel, Offset
    from testbed.kernel import netns
    from testbed.measure import clockprobe

    out: dict = {"tap_after_s": round(wait_for_tap(wire, 120, vm), 2)}
    wire_up(wire, node)
    with netns.entered(wire):
        out["echo_ready_after_s"] = round(clockprobe.wait_ready(GUEST_IP, args.port, within_s=300), 2)
    answered = time.monotonic()
    out["ping_wire"] = ping_stats(wire, GUEST_IP, 20)
    out["clock_start"] = clock_pass(wire, args.port, args.exchanges)
    out["ping_vxlan"] = ping_stats(node, INNER_GUEST_IP, 10)
    time.sleep(max(0.0, args.gap_s - 4))
    out["clock_end"] = clock_pass(wire, args.port, args.exchanges)
    with netns.entered(wire):
        clockprobe.stop(GUEST_IP, args.port)
    a, b = out["clock_start"], out["clock_end"]
    model = ClockModel(Offset(**{k: v for k, v in a.items() if k in Offset.__dataclass_fields__}),
                       Offset(**{k: v for k, v in b.items() if k in Offset.__dataclass_fields__}))
    out["drift_ppm"], out["drift_bound_ppm"] = model.drift_ppm, model.drift_bound_ppm
    # the guest's CLOCK_MONOTONIC began during the boot: -offset is the host's clock at that moment
    out["guest_clock_began_s"] = {"host_launch": launched, "minus_offset": -a["offset_s"], "echo_answered": answered,
                                  "between": launched - a["uncertainty_s"] <= -a["offset_s"]
                                  <= answered + a["uncertainty_s"]}
    return out


def run(args) -> dict:
    from testbed.kernel import netns
    from testbed.kernel.state import RunState

    state = RunState()
    wire, node = f"tb-{state.run_id}-wire", f"tb-{state.run_id}-h1"
    vm = None
    try:
        for ns in (wire, node):
            state.add("namespaces", ns)
            netns.create(ns)
        env = dict(os.environ, TESTBED_VM_TAP=TAP, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        launched = time.monotonic()
        argv = [sys.executable, "-m", "testbed.cli", "vm", "--timeout", "400", "--", "sh", "-c",
                guest_script(args.port)]
        vm = subprocess.Popen(netns.in_namespace(wire, argv), env=env, start_new_session=True)
        out = {"namespaces": [wire, node], **measure(wire, node, vm, launched, args)}
        out["vm_status"] = vm.wait(timeout=120)
        return out
    finally:
        # a second Ctrl-C or SIGTERM must not cut the clean-up short
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        if vm is not None and vm.poll() is None:
            vm.send_signal(signal.SIGTERM)   # testbed vm ends its QEMU on SIGTERM
            try:
                vm.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(vm.pid, signal.SIGKILL)
                vm.wait()
        # QEMU runs in a session of its own (testbed vm starts it so): whatever still runs in the wire namespace goes
        for pid in netns.pids_in(wire):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for ns in (node, wire):
            netns.remove(ns)
        state.drop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exchanges", type=int, default=200, help="ping-pongs per clock pass (10 ms apart)")
    ap.add_argument("--gap-s", type=float, default=10.0, help="seconds between the two clock passes (the drift)")
    ap.add_argument("--port", type=int, default=9319, help="the clock echo's UDP port in the guest")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    if args.exchanges < 3 or args.gap_s < 0 or not 0 < args.port < 65536:
        ap.error("--exchanges must be >= 3, --gap-s >= 0, --port 1..65535")
    if os.geteuid() != 0:
        print("two_kernels: needs root (namespaces and a VM)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    result = run(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
