"""Hold the guest kernel's packet-path static keys on for the lab VM's whole life, so no test patches kernel code.

Linux compiles rarely-used hooks of the packet path as static branches (jump labels): a no-op until something needs
the hook, then the kernel rewrites the instruction in place (text_poke with int3 breakpoints) while other CPUs may
be executing it, and rewrites it back when the last user goes. The suite flips such keys all the time: every ping
asks for receive timestamps (netstamp_needed_key, checked at the top of netif_rx_internal), every clsact or ingress
qdisc and tc filter turns the ingress/egress hooks on (ingress_needed_key, egress_needed_key, tcf_sw_enabled_key)
and its removal turns them off. Traced in the lab VM: 21 code patches in 8 integration tests (kprobes on
jump_label_update), every ping exit and every fabric teardown among them.

Under QEMU's software CPU such a patch was caught killing the guest: "Oops: int3" at netif_rx_internal+0x1c under
veth_xmit (Comm: ping), then "Kernel panic - not syncing: Fatal exception in interrupt": a vCPU met the temporary
breakpoint after the patch had finished. On hardware (and under KVM) this cannot happen; under emulation it did,
and a dead VM costs the suite a second boot. Holding one user of each key from boot to power-off makes every later
enable and disable a reference count only, so no code is patched mid-run:

- netstamp_needed_key: one UDP socket with SO_TIMESTAMP set;
- ingress_needed_key, egress_needed_key, tcf_sw_enabled_key: a clsact qdisc on the guest's own loopback with one
  match-all filter (no action: the packet goes on unchanged) on each of its hooks.

Run only inside the lab VM (`python -m testbed.kernel.keyhold`, started by the guest script, which waits for its
READY_FILE before running the command); it refuses anywhere else, since on a real machine it would change the
host's own network configuration.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from testbed.kernel import netns

SO_TIMESTAMP = 29  # asm-generic and x86 (Python's socket module does not name it)
CLSACT_HOOKS = (0xFFFFFFF2, 0xFFFFFFF3)  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)
ETH_P_ALL = 0x0003
READY_FILE = "/tmp/testbed-keyhold.ready"  # the guest's own tmpfs /tmp
# u32 matching every frame, with no action: a match returns TC_ACT_OK and the frame goes on unchanged (the classid
# only sets skb->tc_index, which nothing on loopback reads). u32 because the host kernel has it and not cls_basic.
PASS_EVERYTHING = {"keys": ["0x0/0x0+0"], "target": 0x10001}


def hold_timestamps() -> socket.socket:
    """A socket that keeps netstamp_needed_key on while it is open."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    return s


def hold_tc_hooks(ipr, ifname: str = "lo") -> None:
    """A clsact qdisc on `ifname` with a pass-everything u32 filter on both hooks (once per boot)."""
    idx = ipr.link_lookup(ifname=ifname)[0]
    ipr.tc("add", "clsact", index=idx)
    for parent in CLSACT_HOOKS:
        ipr.tc("add-filter", "u32", index=idx, parent=parent, prio=1, protocol=ETH_P_ALL, **PASS_EVERYTHING)


def main() -> int:
    if os.environ.get("TESTBED_IN_VM") != "1":
        print("testbed.kernel.keyhold: runs only inside the lab VM (it adds a qdisc to the machine's loopback)",
              file=sys.stderr)
        return 2
    held = hold_timestamps()
    try:
        with netns.ipr(None) as ipr:
            hold_tc_hooks(ipr)
    except netns.NetlinkError as e:  # the timestamp key is still held; the VM test names what is missing
        print(f"testbed.kernel.keyhold: no clsact hold on lo: {e}", file=sys.stderr)
    finally:
        Path(READY_FILE).touch()  # the guest script waits for this before it runs the command
    signal.pause()  # until the VM powers off
    held.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
