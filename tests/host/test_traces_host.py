"""Imported traces run on the fabric (host kernel): a Chakra execution trace (encoded from the schema) and an
ASTRA-sim text workload become collective jobs whose every result is verified, whose ops carry the trace's names
and whose steps hold the trace's compute; the summary sets the emulated step beside the no-congestion prediction
(compute + each op's alpha-beta bound). A malformed trace exits 2 with one line before anything is built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from testbed.kernel import netns
from testbed.commands.runner import run_scenario
from testbed.scenario import get
from tests.chakra_fixture import small_chakra

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")
ROOT = Path(__file__).resolve().parents[2]


def run_trace(tmp_path, name, trace, **kw):
    sc = get("collective")
    p = {x.name: x.default for x in sc.params}
    p.update(trace_file=str(trace), iterations=4, **kw)
    sc.validate(p)
    return run_scenario(sc, p, 1, tmp_path / name, quiet=True)


def test_a_chakra_trace_runs_with_its_compute_gaps(tmp_path):
    f = tmp_path / "w.0.et"
    f.write_bytes(small_chakra())
    # compute x20 (2 + 3 + 0.5 ms -> 110 ms per step), sizes x4 (256 KiB all-reduce, 32 KiB all-gather)
    s = run_trace(tmp_path, "chakra", f, trace_compute_scale=20.0, trace_bytes_scale=4.0)
    print({k: s.get(k) for k in ("step_ms_p50", "trace_compute_ms", "step_bound_ms", "step_vs_bound", "cct_ms_p50")})
    assert s["data_verified"] is True
    ops = pd.read_csv(tmp_path / "chakra" / "ops.csv")
    assert list(dict.fromkeys(ops["op"])) == ["grads", "params", "barrier"]
    assert ops.groupby("op")["collective"].first().to_dict() == {"grads": "allreduce", "params": "allgather",
                                                                  "barrier": "allreduce"}
    assert s["trace_compute_ms"] == pytest.approx(110.0)
    # a step holds its compute and its ops: at least the compute, and near the no-congestion prediction
    assert s["step_ms_p50"] > s["trace_compute_ms"]
    assert 0.8 < s["step_vs_bound"] < 2.0, s
    # the gap before 'params' (3 ms x 20) lies between the end of 'grads' and the start of 'params' on each rank
    r0 = ops[(ops["rank"] == 0) & (ops["iteration"] == 1)].set_index("op")
    assert r0.loc["params", "start_s"] - r0.loc["grads", "end_s"] >= 0.060 - 0.002


def test_an_astrasim_workload_runs_and_a_bad_one_exits_2(tmp_path):
    before = netns.list_ours()
    s = run_trace(tmp_path, "astra", ROOT / "examples" / "traces" / "small-dp.txt")
    assert s["data_verified"] is True and s["ops_per_iteration"] == 3
    assert set(pd.read_csv(tmp_path / "astra" / "ops.csv")["op"]) == {"fc.wg", "conv2.wg", "conv1.wg"}
    assert s["trace_compute_ms"] == pytest.approx(24.3)
    bad = tmp_path / "bad.txt"
    bad.write_text("DATA\n2\nl -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 8 0\n")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "collective", "--set", f"trace_file={bad}",
                        "--out", str(tmp_path / "never")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "says 2 layers but 1" in r.stderr, r.stderr
    assert not (tmp_path / "never").exists() and netns.list_ours() == before


def test_a_tiny_op_after_a_large_one_completes_on_the_fabric(tmp_path):
    """A 16-byte all-reduce beside a 256 KiB one, in both orders (gradient buckets; a trace's barrier): a
    receiver's SO_RCVLOWAT left at the large message's tail kept the small one asleep in the socket until the
    deadline (over loopback it never showed: the shaped fabric's pacing is what leaves the tail behind)."""
    sc = get("collective")
    for name, buckets in (("big-first", "256K,16"), ("tiny-first", "16,256K")):
        p = {x.name: x.default for x in sc.params}
        p.update(buckets=buckets, iterations=3, timeout_s=30.0)
        sc.validate(p)
        s = run_scenario(sc, p, 1, tmp_path / name, quiet=True)
        assert s["data_verified"] is True and s["step_n"] == 3, s
