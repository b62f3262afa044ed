"""`testbed sweep` on the real kernel: a 3-point sweep of incast senders (drop-tail and HTB only: the host kernel
runs it, in 3-4 s; it ran in the lab VM, 45 s, until 2026-12-05, and the figures below are mostly the VM's; on the
host, 2 sweeps: round p99 26.7 / 107-138 / 307-319 ms, drops 0 / 120-136 / 275-280).

The sweep runs in-process (`testbed.cli.main([... "--vm", "never"])`, as the lab VM's re-executed sweep does),
writes one run directory per point (a dumbbell: fewer namespaces to build than a leaf-spine in the emulated VM, the
same bottleneck), sweep.csv / sweep.md and the metric plots. Then the points' own data
(rounds.csv, queues.csv) must show the incast lesson: more senders into one 20 Mbit/s port with a 16 kB buffer
-> longer rounds and more drops at the bottleneck, and a loss rate above the single sender's (the rate itself
saturates once every round overflows the buffer, so it need not keep rising from 4 to 8 senders).

The checks read the CSVs with the csv module, not pandas: under the lab VM's emulated `-cpu max` (no KVM) pandas
once died with SIGSEGV inside a groupby here; `analysis` itself is tested on the host (tests/unit, tests/host).
"""

from __future__ import annotations

import csv
import json
import math

from tests.leftovers import no_leftovers  # noqa: F401 (autouse: no namespace left after each test)
from testbed import cli

SENDERS = (1, 4, 8)
FIXED = {"block_bytes": "64000", "rounds": "3", "buffer_bytes": "16000", "host_rate_mbps": "20",
         "fabric_rate_mbps": "40", "discipline": "droptail", "topology": "dumbbell"}


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _nondecreasing(xs, what):
    xs = list(xs)
    assert all(b >= a for a, b in zip(xs, xs[1:])), f"{what} not monotone in senders {SENDERS}: {xs}"


def _p99(values):
    x = sorted(values)
    return x[max(1, math.ceil(round(0.99 * len(x), 9))) - 1]


def _own_data(run):
    """From the point's rounds.csv and queues.csv alone: (round p99 s, drops, loss rate) at the bottleneck."""
    rounds = {}
    for r in _rows(run / "rounds.csv"):
        lo, hi, n = rounds.get(r["round"], (math.inf, -math.inf, 0))
        rounds[r["round"]] = (min(lo, float(r["start_s"])), max(hi, float(r["end_s"])), n + 1)
    node, port = json.loads((run / "summary.json").read_text())["bottleneck"].split(":")
    per_class = {}
    for r in _rows(run / "queues.csv"):
        if r["node"] == node and r["port"] == port:
            per_class.setdefault(r["class"], []).append((float(r["t_s"]), int(r["drops"]), int(r["sent_packets"])))
    drops = sent = 0
    for samples in per_class.values():  # cumulative counters: last - first per class
        samples.sort()
        drops += samples[-1][1] - samples[0][1]
        sent += samples[-1][2] - samples[0][2]
    drop_fraction = drops / (drops + sent) if drops + sent else 0.0
    return rounds, _p99([hi - lo for lo, hi, _ in rounds.values()]), drops, drop_fraction


def test_incast_sender_sweep(tmp_path, capsys):
    try:  # diagnostics for the CI log: which SIMD paths numpy takes on this (possibly emulated) CPU
        import numpy as np

        feats = np._core._multiarray_umath.__cpu_features__
        print("numpy", np.__version__, "cpu features:", " ".join(k for k, v in feats.items() if v))
    except Exception as e:  # noqa: BLE001
        print("numpy cpu features unknown:", e)
    out = tmp_path / "sweep"
    argv = ["sweep", "incast", "--set", "senders=" + ",".join(map(str, SENDERS)),
            *sum((["--set", f"{k}={v}"] for k, v in FIXED.items()), []), "--out", str(out), "--vm", "never",
            "--quiet"]
    rc = cli.main(argv)
    printed = capsys.readouterr()
    with capsys.disabled():
        print(printed.out)
        print(printed.err[-3000:])
    assert rc == 0, printed.err

    # the combined table: one row per point, the swept value and every numeric summary metric
    table = _rows(out / "sweep.csv")
    assert [int(r["senders"]) for r in table] == list(SENDERS)
    assert [r["run_dir"] for r in table] == [f"senders={n}" for n in SENDERS]
    assert all(r["complete"] == "True" for r in table)
    for col in ("goodput_mbps", "round_ms_p99", "incast_loss_rate", "bottleneck_drops", "tcp_retrans_segs"):
        assert col in table[0]
        assert (out / f"sweep_{col}.png").stat().st_size > 1000
    md = (out / "sweep.md").read_text()
    assert "| senders |" in md and "sweep_round_ms_p99.png" in md

    # the table repeats each point's summary.json
    for row in table:
        summary = json.loads((out / row["run_dir"] / "summary.json").read_text())
        for k in ("goodput_mbps", "round_ms_p99", "incast_loss_rate", "bottleneck_drops"):
            assert abs(float(row[k]) - summary[k]) <= 1e-9 * max(1.0, abs(summary[k])), (k, row[k], summary[k])

    # what the runs' own data show (rounds.csv / queues.csv, not the summaries)
    p99, drops, loss = [], [], []
    for n in SENDERS:
        run = out / f"senders={n}"
        assert json.loads((run / "manifest.json").read_text())["complete"] is True
        rounds, r99, d, lr = _own_data(run)
        assert len(rounds) == 3 and all(k == n for _, _, k in rounds.values())
        p99.append(r99)
        drops.append(d)
        loss.append(lr)
    with capsys.disabled():
        print("senders", SENDERS, "round p99 s", p99, "drops", drops, "loss", loss)
    # Rounds, each point against constants of the mechanism, not against another point's single run: the
    # bottleneck serialises every sender's block, so a round takes at least n x block / rate (25.6, 102.4, 204.8 ms),
    # and one sender (no incast) stays far below the 8-sender floor. Measured in 6 lab-VM sweeps: p99 26.6-50.3 /
    # 277-395 / 333-362 ms. The 4 -> 8 step is not asserted: +40 to +67 ms in five sweeps and -44 ms in the sixth
    # (395 against 352 ms, which failed the old "p99 non-decreasing"); round p99's CV is 37% in the lab VM's noise
    # floor, and one run per point cannot separate such a step.
    ideal_s = [n * int(FIXED["block_bytes"]) * 8 / (float(FIXED["host_rate_mbps"]) * 1e6) for n in SENDERS]
    assert all(r >= i for r, i in zip(p99, ideal_s)), ("round p99 below n x block / rate", p99, ideal_s)
    assert p99[0] < ideal_s[-1], ("one sender's round p99 reached the 8-sender floor", p99, ideal_s)
    # Drops are the bottleneck's own counter: twice the bytes per round into the same 16 kB buffer drop about twice
    # as much (4 -> 8 senders: 65-129 -> 238-283 in 6 sweeps). A sender as fast as the port overflows it only when
    # shaper timers run late (16 kB is 6.4 ms of the port's rate; the emulated CPU): 0 drops in 5 sweeps, 13 (loss
    # 0.09) in one, while the incast points lost 0.10-0.20. So no "one sender drops nothing" claim.
    _nondecreasing(drops, "bottleneck drops")
    # The loss RATE saturates once the buffer overflows every round (measured 0.10-0.19 at 4 senders, 0.18-0.20 at
    # 8: more senders also back off longer after their RTOs); it must only rise from no incast to any incast.
    assert drops[-1] > 0 and min(loss[1:]) > loss[0]
