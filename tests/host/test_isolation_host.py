"""Checkpoint-like background flows beside a ring all-reduce, with and without isolation (host kernel: HTB classes
with strict priority, u32 DSCP filters, bfifo): the seed's advice to give storage/checkpoint traffic its own
class, measured as the collective's CCT tail."""

from __future__ import annotations

import os

import pytest

from analysis import stats
from analysis.load import load_run
from analysis.metrics import op_table
from testbed.errors import UsageError
from testbed.commands.runner import run_scenario
from testbed.scenario import get

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")

COLL = get("collective")


def params(**kw):
    p = {x.name: x.default for x in COLL.params}
    # two elephant flows across the fabric (the ring's cross-leaf hops share their uplinks), in DSCP 8 (CS1)
    p.update(collective="allreduce", size="256K", iterations=10, warmup=1, host_rate_mbps=20.0,
             fabric_rate_mbps=20.0, background="h1>h3,h2>h4", bg_dscp=8, sample_interval_ms=0, **kw)
    COLL.validate(p)
    return p


def test_background_in_a_lower_strict_priority_class_keeps_the_collective_tail_down(tmp_path):
    """One FIFO: the ring's hops share it with two bulk TCP flows; strict priority: the background only gets what
    the collective leaves (it still moves, between and during the collective's gaps). Measured on the host kernel
    before, 3 runs: p99 406/476/431 ms shared, 193/183/213 ms strict (0.38-0.49x); background 6-10 Mbit/s with
    strict priority, 19-20 without. The 10 ops of each run are compared (analysis.stats.compare: rank test and the
    ratio of medians' bootstrap interval), not one p99 a side. Measured for it (host kernel, shared 2-CPU machine,
    other developers' runs alongside, 2 runs of each): op CCT median shared 935 and 382 ms (the shared FIFO's
    tail varies 2.5x from run to run), strict 185 and 187 ms; ratio 5.07 [4.65, 5.54] and 2.05 [1.90, 2.17],
    p 0.0002 both times. The asserted low end (1.3) sits 0.6 below the lowest measured (with the earlier p99
    ratios 2.0-2.6 over 3 runs): a false failure is rarer than 1 in 100, though 5 runs is thin for that claim."""
    shared = run_scenario(COLL, params(isolation="none"), 1, tmp_path / "none", quiet=True)
    strict = run_scenario(COLL, params(isolation="strict"), 1, tmp_path / "strict", quiet=True)
    keys = ("cct_ms_p50", "cct_ms_p99", "bg_goodput_mbps", "switch_drops")
    print({k: (shared.get(k), strict.get(k)) for k in keys})
    assert shared["data_verified"] and strict["data_verified"]
    cct = {name: op_table(load_run(tmp_path / name).ops)["cct_s"] * 1e3 for name in ("none", "strict")}
    d = stats.compare(cct["none"], cct["strict"])
    print(f"op CCT shared vs strict: {d.a.text()} vs {d.b.text()}; ratio {d.ratio:.2f} "
          f"[{d.ratio_low:.2f}, {d.ratio_high:.2f}], p {d.p_value:.2g}: {d.verdict}")
    assert d.verdict == "A > B" and d.ratio_low > 1.3, d
    assert strict["bg_goodput_mbps"] > 0, strict


def test_isolation_needs_background_flows_in_another_dscp():
    for kw, says in ((dict(background=""), "no background flows"), (dict(bg_dscp=0), "must differ"),
                     (dict(pfc="on"), "cannot be combined")):
        p = {x.name: x.default for x in COLL.params}
        p.update(background="h1>h3", bg_dscp=8, isolation="strict")
        p.update(kw)
        with pytest.raises(UsageError, match=says):
            COLL.validate(p)
