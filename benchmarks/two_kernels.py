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
import json
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.commands.servervm import PREFIXLEN, WIRE_GUEST as GUEST_IP, WIRE_HOST as HOST_IP  # noqa: E402

INNER_HOST_IP, INNER_GUEST_IP = "198.18.42.1", "198.18.42.2"
VNI = 42


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
    """The crossing link's host end: a VXLAN end made in the wire namespace (its tap is up with HOST_IP already,
    testbed.commands.servervm) and moved into a node."""
    from testbed.kernel import links, netns, tunnel

    tunnel.add_vxlan_end(wire, node, "eth0", VNI, HOST_IP, GUEST_IP, "02:00:c6:12:2a:01", 1450)
    links.add_address(node, "eth0", INNER_HOST_IP, 24)
    with netns.ipr_in(node) as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="eth0")[0], state="up")


def measure(wire: str, node: str, launched: float, args) -> dict:
    from analysis.clockoffset import ClockModel, Offset
    from testbed.kernel import netns
    from testbed.measure import clockprobe

    out: dict = {}
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
    """The VM booted on a wire (testbed.commands.servervm.vm_on_wire: its tap wait and its teardown) running
    :func:`guest_script`, a node namespace of the run beside the wire, the measurements; then the VM's own end."""
    from testbed.commands.servervm import vm_on_wire
    from testbed.kernel import netns

    with vm_on_wire(["sh", "-c", guest_script(args.port)], timeout_s=400, boot_timeout_s=120, capture=False) as vm:
        node = f"tb-{vm.run_id}-h1"
        vm.state.add("namespaces", node)
        try:
            netns.create(node)
            out = {"namespaces": [vm.wire, node], "tap_after_s": round(vm.tap_after_s, 2),
                   **measure(vm.wire, node, vm.launched_s, args)}
            out["vm_status"] = vm.proc.wait(timeout=120)
            return out
        finally:   # from here a Ctrl-C or SIGTERM cannot cut the clean-up short (this one's, then the VM's end)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            netns.remove(node)


def _interrupted(signum, frame) -> None:
    """The first Ctrl-C or SIGTERM ends the run as KeyboardInterrupt; later ones are ignored, so they cannot cut the
    clean-up short."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


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
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupted)
    result = run(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
