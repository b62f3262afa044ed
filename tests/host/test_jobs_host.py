"""`testbed jobs` on the host kernel: two collective jobs at once on 1 spine x 2 leaves x 3 hosts at 20 Mbit/s, each
with --solo (the job alone on the same fabric, same hosts, same seed).

Shared bottleneck (examples/jobs/noisy-neighbour.toml): a 4-rank ring all-reduce of 256 kB (h1, h2 | h4, h5, 12
iterations) beside a 2-rank all-to-all of 512 kB (h3 | h6, 30 iterations, so it outlasts the all-reduce); both
cross the leaf uplinks. Measured (3 runs, one run a side each, shared 2-CPU host): the all-reduce's step p50 ratio
together / alone 2.58 [2.23, 3.05], 1.83 [1.62, 1.97], 1.83 [1.70, 2.03], every one "A > B"; the leaf1 -> spine1
port sent 13.83-13.84 MB together against 5.35 + 8.48 MB by the two jobs alone. Asserted: "A > B" with the
interval's low end above 1.2 (the lowest low end seen, 1.62, less a quarter), the neighbour beside it for at least
90% of its run, and the shared port's bytes the sum of both jobs' (within 5%).

Control: two 3-rank all-reduces, one per leaf (no shared link). Measured (5 runs): per-run step p50 ratios 0.89 to
1.17, and once 0.70 (that run's solo job had 9 of its 12 steps at 190-240 ms against 146 ms, with one TCP
retransmission: this machine's noise, not the neighbour's); after the agents stopped spinning on paused sockets,
1.38 once in 5 (two jobs' agents share the 2 CPUs the emulation runs on: a neighbour on another leaf still costs
CPU time here, as it would not on separate servers). So no timing claim is asserted for the control, one run a
side being a coin flip; asserted is the kernel's word that no byte of either job crossed a spine (the leaf uplinks'
sent bytes under 50 kB, against MBs when they share) and that both jobs verified their data."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parent.parent.parent
CONTROL = """
[fabric]
spines = 1
leaves = 2
hosts_per_leaf = 3
host_rate_mbps = 20
fabric_rate_mbps = 20

[[job]]
name = "left"
collective = "allreduce"
size = "256K"
hosts = ["h1", "h2", "h3"]
iterations = 12

[[job]]
name = "right"
collective = "allreduce"
size = "256K"
hosts = ["h4", "h5", "h6"]
iterations = 12
"""


def run_jobs(path: Path, out: Path) -> pd.DataFrame:
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "jobs", str(path), "--solo", "--vm", "never", "--quiet",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "jobs.md").read_text().startswith("# Several jobs on one fabric")
    return pd.read_csv(out / "jobs.csv").set_index("job")


def sent_bytes(run: Path, node: str, port: str) -> int:
    with open(run / "port_deltas.csv", newline="") as fh:
        return next(int(r["sent_bytes"]) for r in csv.DictReader(fh) if (r["node"], r["port"]) == (node, port))


def test_a_neighbour_on_the_shared_uplinks_slows_the_job(tmp_path):
    out = tmp_path / "nn"
    df = run_jobs(ROOT / "examples" / "jobs" / "noisy-neighbour.toml", out)
    ar = df.loc["allreduce"]
    assert ar["step_p50_verdict"] == "A > B" and ar["step_p50_low"] > 1.2, ar.to_dict()
    assert ar["overlap_min"] >= 0.9 and bool(ar["verified"]), ar.to_dict()
    assert (out / "together" / "seed-1" / "allreduce" / "ops.csv").is_file()
    assert (out / "together" / "seed-1" / "alltoall" / "summary.json").is_file()
    md = (out / "jobs.md").read_text()
    assert "allreduce: " in md and "x slower beside alltoall [" in md, md
    together = sent_bytes(out / "together" / "seed-1", "leaf1", "spine1")
    alone = [sent_bytes(out / f"solo-{j}" / "seed-1", "leaf1", "spine1") for j in ("allreduce", "alltoall")]
    assert min(alone) > 1_000_000, alone  # each job alone crosses the uplink
    assert abs(together - sum(alone)) < 0.05 * sum(alone), (together, alone)


def test_jobs_on_disjoint_leaves_do_not_slow_each_other(tmp_path):
    jobs_file = tmp_path / "control.toml"
    jobs_file.write_text(CONTROL)
    out = tmp_path / "ctl"
    df = run_jobs(jobs_file, out)
    for job in ("left", "right"):
        row = df.loc[job]
        assert row["step_p50_ratio"] > 0 and bool(row["verified"]), row.to_dict()
    for leaf in ("leaf1", "leaf2"):
        assert sent_bytes(out / "together" / "seed-1", leaf, "spine1") < 50_000


def test_checkpoint_writes_and_a_dataset_stream_run_beside_a_job(tmp_path):
    """examples/jobs/checkpoint.toml without --solo: h3 writes 1 MB to the storage host h6 every second (4 times, from
    0.5 s) while h6 streams 2 Mbit/s to h1 and h2, beside the all-reduce on h1, h2 | h4, h5 (12 iterations, ~3.5 s
    together). Asserted on what the kernel and the files say, not on a time: every write's 1 MB arrived, the paced
    streams ran at their rate (2.02 Mbit/s measured; within a quarter), the leaf1 -> spine1 port carried the
    all-reduce's bytes plus the checkpoints' (5.35 MB alone, measured above, + 1 MB a write), the storage host's
    port took the writes in and its NIC sent the streams out. The writes stop with the job: 12 iterations take at
    least 1.93 s (12 x the 161 ms bound), so the writes at 0.5 and 1.5 s always start (3 or 4 seen). The ports'
    counters are read once the storage traffic has stopped: on a CI machine, read when the job ended, h6's NIC had
    sent 2.52 MB of the 2.75 MB its streams counted by their own stop, which came while a write finished."""
    out = tmp_path / "ckpt"
    jobs_file = ROOT / "examples" / "jobs" / "checkpoint.toml"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "jobs", str(jobs_file), "--vm", "never", "--quiet",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    run = out / "together" / "seed-1"
    st = pd.read_csv(run / "storage.csv")
    ck, ds = st[st["kind"] == "checkpoint"], st[st["kind"] == "dataset"]
    assert len(ck) >= 2 and (ck["bytes"] == 1_000_000).all() and (ck["src"] == "h3").all(), st
    assert sorted(ds["dst"]) == ["h1", "h2"] and ds["goodput_mbps"].between(1.5, 2.5).all(), st
    assert sent_bytes(run, "leaf1", "spine1") > 5_000_000 + 0.95 * 1_000_000 * len(ck)
    assert sent_bytes(run, "leaf2", "h6") > 0.95 * 1_000_000 * len(ck)  # the writes into the storage host
    assert sent_bytes(run, "h6", "eth0") > 0.95 * ds["bytes"].sum()  # and its streams out
    assert "ckpt (checkpoint): " in (out / "jobs.md").read_text()


def test_inference_windows_beside_a_job(tmp_path):
    """examples/jobs/inference.toml without --solo: h3 sends 4 kB to the server h6 every 0.4 s and gets 256 kB back,
    until the all-reduce beside it ends. Asserted on physics and counters, not on a measured time: every window's
    latency is at least the response's serialization at 20 Mbit/s (256 kB x 8 / 20 Mbit/s = 102 ms; measured p50
    355 ms beside the job), and leaf2's uplink carried the responses besides the all-reduce's share."""
    out = tmp_path / "serve"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "jobs", str(ROOT / "examples" / "jobs" / "inference.toml"),
                        "--vm", "never", "--quiet", "--out", str(out)], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    run = out / "together" / "seed-1"
    st = pd.read_csv(run / "storage.csv")
    assert len(st) >= 3 and (st["kind"] == "inference").all() and (st["bytes"] == 260_000).all(), st
    assert (st["seconds"] >= 0.102).all(), st
    assert sent_bytes(run, "leaf2", "spine1") > 5_000_000 + 0.95 * 256_000 * len(st)
    assert "serve (inference): " in (out / "jobs.md").read_text()
