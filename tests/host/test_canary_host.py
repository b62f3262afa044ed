"""`testbed canary` on the host kernel (HTB + bfifo): 2 leaves x 4 hosts at 20 Mbit/s, the leaves' host ports at
4500 bytes (three packets), an incast on each leaf (3 senders x 20 kB to the leaf's first host, 20 rounds), 5 runs
a side, canary leaf1 and control leaf2 at the same time.

* Harmful: the fabric runs rto_min 1 ms and the change puts the canary's hosts back at the kernel's 200 ms. The
  three-packet buffer drops in every round, some losses end in a retransmission timeout, and each costs 200 ms
  instead of a few (both sides counted 31-57 timeouts per 5 runs; the canary's slowest round 230-240 ms, the
  control's 35-43 ms). Measured over 4 invocations (shared 2-CPU machine, other developers' runs beside): ratio
  canary / control 2.70 [2.21, 4.45], 4.22 [3.89, 5.16], 3.71 [2.02, 4.87], 2.74 [2.54, 3.35]. Asserted: rolled
  back (exit 1), told apart (``A > B``), median ratio above 2.0 (lowest seen 2.70) and the interval's low end above
  1.2 (lowest seen 2.02; the tolerance is 1.1); the canary's hosts really had rto_min 200 ms while the control's
  kept 1 ms (the route metric read back from the kernel), and had 1 ms again after the roll back.
* Helpful: the fabric runs rto_min 200 ms and the change gives the canary's leaf a 64000-byte buffer: no drops
  there, no timeouts. Measured over 4 invocations: 0.21 [0.18, 0.23], 0.16 [0.14, 0.18], 0.22 [0.17, 0.34],
  0.18 [0.13, 0.24] (canary 499 ms every run, control 2.2-3.2 s). Asserted: rolled out (exit 0), the ratio's
  interval high end below 0.6 (highest seen 0.34), the fabric-wide run verified, the canary's port limits 64000
  and the control's 4500 while the canary ran (the bfifo limit the kernel reports), then 64000 everywhere.

Each invocation takes ~15 s of runs (about 20 s with the fabric's build and teardown)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parent.parent.parent
CANARY_HOSTS, CONTROL_HOSTS = ("h1", "h2", "h3", "h4"), ("h5", "h6", "h7", "h8")
CANARY_PORTS, CONTROL_PORTS = ("leaf1:h1", "leaf1:h4"), ("leaf2:h5", "leaf2:h8")


def _canary(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict, pd.DataFrame]:
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "canary", "--set", "buffer_bytes=4500", *args,
                        "--repeats", "5", "--vm", "never", "--quiet", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert (out / "canary.json").exists(), r.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    return r, json.loads((out / "canary.json").read_text()), pd.read_csv(out / "canary.csv")


def test_a_harmful_rto_min_is_rolled_back_and_touched_only_the_canary(tmp_path):
    r, doc, runs = _canary(tmp_path / "harm", "--set", "rto_min_ms=1", "--change", "rto_min_ms=200")
    assert r.returncode == 1, r.stderr[-3000:]
    assert doc["action"] == "roll back" and doc["verification"] is None
    c = doc["decision"]["comparison"]
    assert c["verdict"] == "A > B" and c["ratio"] > 2.0 and c["ratio_low"] > 1.2, c
    applied = doc["applied"]
    assert all(applied["canary"][h]["rto_min_ms"] == [200] for h in CANARY_HOSTS), applied["canary"]
    assert all(applied["control"][h]["rto_min_ms"] == [1] for h in CONTROL_HOSTS), applied["control"]
    assert all(applied["rolled_back"][h]["rto_min_ms"] == [1] for h in CANARY_HOSTS), applied["rolled_back"]
    canary = runs[(runs["phase"] == "canary") & (runs["side"] == "canary")]
    assert len(canary) == 5 and canary["ok"].all()
    assert canary["tcp_timeouts"].sum() > 0 and canary["round_ms_max"].min() > 200  # a round waited out an RTO
    md = (tmp_path / "harm" / "canary.md").read_text()
    assert md.startswith("# Canary: ROLL BACK") and "Rule:" in md


def test_a_bigger_buffer_is_rolled_out_and_verified(tmp_path):
    r, doc, runs = _canary(tmp_path / "help", "--change", "buffer_bytes=64000")
    assert r.returncode == 0, r.stderr[-3000:]
    assert doc["action"] == "roll out"
    c = doc["decision"]["comparison"]
    assert c["verdict"] == "A < B" and c["ratio_high"] < 0.6, c
    assert doc["verification"]["ok"] and len(doc["verification"]["values_ms"]) == 2, doc["verification"]
    applied = doc["applied"]
    assert all(applied["canary"][p] == {"qdisc": "bfifo", "limit": 64000} for p in CANARY_PORTS), applied
    assert all(applied["control"][p] == {"qdisc": "bfifo", "limit": 4500} for p in CONTROL_PORTS), applied
    assert all(applied["rolled_out"][p]["limit"] == 64000 for p in CANARY_PORTS + CONTROL_PORTS), applied
    by_side = runs[runs["phase"] == "canary"].groupby("side")["port_drops"].sum()
    assert by_side["canary"] == 0 < by_side["control"], by_side
