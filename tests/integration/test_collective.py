"""Collectives on the lab VM's kernel: an incast (gather) drops with drop-tail and is paused instead, without loss, in
a lossless class (PFC, 802.1Qbb frames: PFC's emulation needs the plug qdisc, which the host kernel lacks). The
collectives that need only HTB and drop-tail run on the host kernel: tests/host/test_collective_host.py.
"""

from __future__ import annotations

import csv

from tests.collectivedrive import run


def test_incast_collective_drops_when_lossy_and_pauses_instead_in_a_lossless_class(tmp_path):
    """A gather (3 ranks -> rank 0 on h1, 256 kB each) at 5 Mbit/s with 128 kB port buffers: drop-tail overflows
    h1's port; the same collective in a lossless class (XOFF 16 kB, 112 kB headroom) is paused hop by hop instead.
    Measured (3 runs each): lossy 9-13 drops at leaf1:h1, as many TCP retransmissions; lossless 0 drops, 0
    retransmissions, 240-263 pauses, 44-54 kB of headroom used; CCT p50 2.34-2.55 s lossy vs 2.47-3.26 s lossless
    (kernel TCP repairs a few drops cheaply; pauses cost time too: the lesson is what each mode does, not that
    one is faster)."""
    kw = dict(collective="gather", size="256K", iterations=2, warmup=1, host_rate_mbps=5.0, fabric_rate_mbps=5.0,
              buffer_bytes=128_000, sample_interval_ms=0)
    lossy = run(tmp_path, "lossy", **kw)
    pfc = run(tmp_path, "pfc", pfc="on", pfc_xoff_bytes=16_000, pfc_xon_bytes=8_000, **kw)
    keys = ("cct_ms_p50", "cct_ms_p99", "switch_drops", "switch_drops_by_port", "host_nic_drops", "tcp_retrans_segs",
            "lossless_drops", "pfc_pause_events", "pfc_paused_ms_total", "pfc_reaction_ms_max",
            "pfc_headroom_used_max_bytes", "pfc_frames_sent")
    print("lossy:", {k: lossy.get(k) for k in keys})
    print("lossless:", {k: pfc.get(k) for k in keys})
    assert lossy["data_verified"] is True and pfc["data_verified"] is True
    assert lossy["switch_drops"] > 0 and "leaf1:h1=" in lossy["switch_drops_by_port"], lossy
    assert lossy["tcp_retrans_segs"] > 0 and "pfc_pause_events" not in lossy, lossy
    assert pfc["pfc"] == "on" and pfc["pfc_pause_events"] > 0, pfc
    # the band test_pfc uses for the emulated "cable" (docs/pfc.md): PFC removes most of the loss (measured: all)
    assert pfc["lossless_drops"] + pfc["host_nic_drops"] <= 0.25 * lossy["switch_drops"], (lossy, pfc)
    assert pfc["tcp_retrans_segs"] < lossy["tcp_retrans_segs"], (lossy, pfc)
    # one 802.1Qbb frame per pause and per resume, none failed
    ev = [r["event"] for r in csv.DictReader(open(tmp_path / "pfc" / "pfc.csv"))]
    assert pfc["pfc_frames_sent"] == ev.count("xoff") + ev.count("xon") and pfc["pfc_frame_errors"] == 0, pfc
