"""Collectives on the host kernel (HTB and drop-tail bfifo are all they need): one agent per host on a 2x2
leaf-spine (4 hosts), real data over kernel TCP. Each collective completes with every rank's result verified; ring
all-reduce of a large message runs within 1.3x of the alpha-beta bound; a straggler rank raises the p99 step time by
about its slowdown; background bulk flows sharing the ranks' links raise the CCT tail. These ran in the lab VM until
2026-12-05 (their docstrings keep the VM's figures beside the host's): the host's real CPU runs them in about half
the time. The incast in a lossless class needs PFC's plug qdisc: tests/integration/test_collective.py."""

from __future__ import annotations

import csv
import json

import pytest

from tests.collectivedrive import run, show
from tests.leftovers import no_leftovers  # noqa: F401 (autouse: no namespace left after each test)


# all-reduce is verified by the ring, straggler and background tests below (and over tcp and rdma in test_rdma)
@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "alltoall"])
def test_collective_completes_with_verified_data(tmp_path, collective):
    s = run(tmp_path, collective, collective=collective, size="64K", iterations=2, warmup=0)
    show(collective, s)
    assert s["data_verified"] is True
    assert s["collective"] == collective and s["ranks"] == 4 and s["cct_samples"] == 2
    out = tmp_path / collective
    rows = list(csv.DictReader(open(out / "ops.csv")))
    # docs/rundir.md: the required columns, then the two optional ones the collective scenario writes
    assert list(rows[0]) == ["iteration", "op", "op_index", "collective", "rank", "host", "start_s", "end_s",
                             "bytes_sent", "bytes_recv", "wait_s", "iter_start_s", "size_bytes"]
    assert len(rows) == 4 * 2
    assert {r["host"] for r in rows} == {"h1", "h2", "h3", "h4"}
    assert all(float(r["end_s"]) > float(r["start_s"]) for r in rows)
    info = list(csv.DictReader(open(out / "tcp_info.csv")))
    assert info and {"rtt_us", "rto_us", "total_retrans"} <= set(info[0])
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] and m["placement"] == {"0": "h1", "1": "h2", "2": "h3", "3": "h4"} or m["placement"]
    # the link rate is a hard ceiling: nothing beats the alpha-beta bound
    assert s["cct_ms_p50"] >= 0.95 * s["bound_ms"], s


def test_ring_allreduce_large_message_near_alpha_beta_bound(tmp_path):
    """2 MB at 10 Mbit/s: 2.4 s per all-reduce, long against any start-up effect, and half the packet rate of
    4 MB at 20 Mbit/s, so the emulated VM's CPU (which also forwards every packet) is not what sets the time.

    The claim rests on one run's 12 measured ops: the 95% interval of their median CCT / bound
    (analysis.stats.estimate: distribution-free, [3rd, 10th] of 12) must lie inside [0.95, limit]. Ops hit by a VM
    stall move the interval's ends by one rank at most, where the old test ran once more and judged the better of
    two runs of 5. 13 ops of 2.4 s: the VM time of the old test's two runs.
    Measured in the lab VM (3 runs in one boot, 2026-12-04, other developers' VMs alongside): median [95% CI] of
    the 12 ops' CCT / bound 1.187 [1.132, 1.300] (ops 1.11-1.44, the machine busy), 1.047 [1.043, 1.060] and
    1.053 [1.047, 1.056]. The nearest interval end (1.30) sits 0.3 below the VM's limit, ~2 run-to-run sd of the
    interval's high end (sd 0.14, n 3): a false failure of roughly 1 in 50 on a busy machine from 3 runs, fewer on
    a quiet one (1.06). Not yet shown below 1 in 100; a run with every op slow (fresh-clone CI once: 1.87 and
    2.92 with the whole VM stalled) still fails, and says so with its fidelity reasons. On the host kernel (2 runs,
    2026-12-05): 1.024 [1.023, 1.027] and 1.024 [1.023, 1.025], ops 1.022-1.188, 35-36 s a run."""
    from analysis import stats
    from analysis.load import load_run
    from analysis.metrics import op_table

    iterations = 12
    kw = dict(collective="allreduce", algorithm="ring", size="2M", iterations=iterations, warmup=1,
              host_rate_mbps=10.0, fabric_rate_mbps=10.0, sample_interval_ms=0)
    limit = 1.3  # the claim for a real CPU (the lab VM's software CPU needed 1.6: it forwards every packet too)
    s = run(tmp_path, "ring", **kw)
    show("ring 2M", s)
    assert s["data_verified"] is True
    ratios = op_table(load_run(tmp_path / "ring").ops)["cct_s"].to_numpy() * 1e3 / s["bound_ms"]
    e = stats.estimate(ratios)
    print(f"ring all-reduce 2 MB, 4 ranks, 10 Mbit/s: op CCT / alpha-beta bound {e.text('{:.3f}')}, "
          f"ops {sorted(round(float(r), 3) for r in ratios)}, fidelity_ok {s['fidelity_ok']} {s['fidelity_reasons']}")
    assert e.n == iterations, e
    assert 0.95 <= e.low and e.high <= limit, (limit, e, s["fidelity_reasons"])


def test_straggler_raises_p99_step_by_its_slowdown(tmp_path):
    """One rank computes 3x as long (300 -> 900 ms a step): every synchronous step waits for it, so each step is
    longer by about the extra compute. Graded on the steps of one run a side: the 95% interval of the median of
    (straggler run's step - the base run's median step) (analysis.stats.estimate over 10 steps: [2nd, 9th]) must lie
    within [0.7, 1.3] x the extra compute, so one step hit by a VM stall (CI: +370 ms once, which decided the old
    p99-of-6 claim) moves the interval's end by one rank, not the verdict. The p99 of 10 steps is their max: only
    its lower side is claimed. Measured in the lab VM (3 runs a side in one boot, 2026-12-04, machine shared):
    extra step 603 [592, 612], 592 [587, 597], 593 [590, 599] ms against 600 (steps within a run: sd ~8 ms); comm
    wait fraction 0.038-0.043 -> 0.496-0.499. Every interval end sits >= 168 ms (> 15 run-to-run sd) inside the
    band and the wait fraction 0.25 past its margin of 0.2: a false failure far rarer than 1 in 100. On the host
    kernel (2 runs a side): 596 [595, 596] ms both times, wait fraction 0.024 -> 0.501; 14.5 s."""
    from analysis import stats
    from analysis.load import load_run
    from analysis.metrics import step_times

    compute, factor = 300.0, 3.0  # compute dominates the step, so a slow (emulated) CPU's noise stays small
    kw = dict(collective="allreduce", size="16K", iterations=10, warmup=1, compute_ms=compute, sample_interval_ms=0)
    base = run(tmp_path, "base", **kw)
    slow = run(tmp_path, "slow", stragglers="2", straggler_factor=factor, **kw)
    show("no straggler", base)
    show("straggler", slow)
    extra = (factor - 1) * compute
    assert base["data_verified"] and slow["data_verified"]
    steps = {n: step_times(load_run(tmp_path / n).ops)["step_s"].to_numpy() * 1e3 for n in ("base", "slow")}
    e = stats.estimate(steps["slow"] - stats.estimate(steps["base"]).median)
    print(f"straggler's extra step time {e.text('{:.0f}')} ms against {extra:.0f} ms of extra compute; steps "
          f"base {sorted(steps['base'].round().tolist())} slow {sorted(steps['slow'].round().tolist())}; "
          f"comm wait fraction "
          f"{base['comm_wait_fraction']:.3f} -> {slow['comm_wait_fraction']:.3f}")
    assert e.n == 10, e
    assert 0.7 * extra <= e.low and e.high <= 1.3 * extra, (extra, e)
    assert slow["step_ms_p99"] - base["step_ms_p50"] >= 0.7 * extra, (base, slow)
    # the fast ranks spend the straggler's extra time waiting inside the collective
    assert slow["comm_wait_fraction"] > base["comm_wait_fraction"] + 0.2, (base, slow)


def test_background_flows_raise_cct_tail(tmp_path):
    """Two bulk TCP flows share the ranks' links (h1>h3, h4>h2): the all-reduce's ops take longer. Compared over
    the 8 measured ops of each run (analysis.stats.compare: Mann-Whitney U and the ratio of medians' bootstrap
    interval), not one run's p99 against another's (it was the p99 of 3 ops, i.e. their max). Measured in the lab
    VM (shared 2-CPU machine, other developers' runs alongside, 2 runs of each): op CCT median 820 and 1279 ms with
    the background against 193 and 189 ms without; ratio 4.25 [2.76, 4.75] and 6.76 [3.73, 7.96], p 0.00016 (all 8
    ops of one run above all 8 of the other). The verdict needs p < 0.05 and the ratio's interval above 1: the
    nearest measured interval's low end is 2.76, so a false failure is far rarer than 1 in 100. Five ops more a
    run than before: ~+10 s of VM time. On the host kernel (2 runs of each): ratio 4.50 [3.65, 4.96] and 3.69 [3.07,
    4.07], p 0.00016 both; 8-9 s."""
    from analysis import stats
    from analysis.load import load_run
    from analysis.metrics import op_table

    kw = dict(collective="allreduce", size="256K", iterations=8, warmup=1, sample_interval_ms=0)
    base = run(tmp_path, "quiet", **kw)
    busy = run(tmp_path, "busy", background="h1>h3,h4>h2", **kw)
    show("no background", base)
    show("background", busy)
    assert base["data_verified"] and busy["data_verified"]
    assert busy["background_flows"] == 2 and busy["bg_goodput_mbps"] > 1.0, busy
    cct = {n: op_table(load_run(tmp_path / n).ops)["cct_s"] * 1e3 for n in ("busy", "quiet")}
    d = stats.compare(cct["busy"], cct["quiet"])
    print(f"op CCT with vs without background: {d.a.text()} vs {d.b.text()}; ratio {d.ratio:.2f} "
          f"[{d.ratio_low:.2f}, {d.ratio_high:.2f}], p {d.p_value:.2g}: {d.verdict}")
    assert d.verdict == "A > B", d
