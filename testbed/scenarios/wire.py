"""A run's packet capture, decoded into the ``wire_*`` numbers of its summary.json (analysis.capture does the
decoding; this is the scenario side: call it after the capture stopped, with tcpdump's own counts)."""

from __future__ import annotations

import sys
import time


def wire_summary(cap, stats: dict, progress, scenario: str) -> dict:
    """``wire_capture_port/file/kernel_drops`` plus analysis.capture's numbers (an undecodable file is one line on
    stderr and leaves only the capture's own keys)."""
    from analysis.capture import CaptureError, decode

    t = time.monotonic()
    out = {"wire_capture_port": f"{cap.node}:{cap.ifname}", "wire_capture_file": cap.path.name,
           "wire_capture_kernel_drops": stats.get("dropped")}
    try:
        decoded = decode(cap.path)
    except CaptureError as e:
        print(f"testbed: {scenario}: capture not decoded: {e}", file=sys.stderr)
        return out
    out.update(decoded.summary())
    if decoded.notes:
        out["wire_capture_notes"] = "; ".join(decoded.notes)
    progress(f"decoded {decoded.packets} captured packets in {time.monotonic() - t:.1f} s: "
             f"{out['wire_roce_retransmitted_packets']} RoCE packets retransmitted, {out['wire_roce_naks']} NAKs, "
             f"{out['wire_tcp_retransmitted_segments']} TCP segments retransmitted, {out['wire_pfc_frames']} PFC "
             f"frames")
    return out
