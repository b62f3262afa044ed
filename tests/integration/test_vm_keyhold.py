"""The lab VM holds its kernel's packet-path static keys on from boot (testbed/kernel/keyhold.py): read back from the
kernel, and counted: no jump-label code patch while a ping runs and a clsact comes and goes."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from testbed.kernel import keyhold, netns

TRACING = Path("/sys/kernel/tracing")


def _append(path: Path, line: str) -> None:
    """Add to a tracefs list (opening it for writing without O_APPEND would clear it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)  # not open("a"): its seek to the end is refused by tracefs
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _held(ipr) -> bool:
    idx = ipr.link_lookup(ifname="lo")[0]
    return all(len(ipr.get_filters(index=idx, parent=p)) > 0 for p in keyhold.CLSACT_HOOKS)


def test_the_guest_holds_its_static_keys_so_pings_and_qdiscs_patch_no_code():
    # the guest script ran this command only after the holder said its keys were held
    assert Path(keyhold.READY_FILE).exists(), "testbed.kernel.keyhold never got ready in this VM"
    with netns.ipr(None) as ipr:
        assert _held(ipr), "no clsact with pass-all filters on the guest's lo: testbed.kernel.keyhold is not running"
    if not (TRACING / "kprobe_events").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACING)], check=True)
    _append(TRACING / "kprobe_events", "p:tb_jlu jump_label_update key=%di:symbol\n")
    try:
        (TRACING / "events/kprobes/tb_jlu/enable").write_text("1")
        (TRACING / "trace").write_text("")
        subprocess.run(["ping", "-c", "2", "-i", "0.2", "-W", "1", "127.0.0.1"], check=True, capture_output=True)
        netns.create("tb-keyhold")
        try:
            with netns.ipr_in("tb-keyhold") as ipr:  # a fabric port's clsact coming and going
                ipr.tc("add", "clsact", index=1)
                ipr.tc("del", "clsact", index=1)
        finally:
            netns.remove("tb-keyhold")
        time.sleep(1)  # netstamp's and the hooks' disables run from a work queue
        patches = [ln for ln in (TRACING / "trace").read_text().splitlines() if "tb_jlu" in ln]
    finally:
        (TRACING / "events/kprobes/tb_jlu/enable").write_text("0")
        _append(TRACING / "kprobe_events", "-:tb_jlu\n")
    hot = [ln for ln in patches if any(k in ln for k in ("netstamp_needed_key", "ingress_needed_key",
                                                         "egress_needed_key", "tcf_sw_enabled_key"))]
    assert hot == [], hot
