"""The collective workload with the queue mechanisms the lab compares (lab VM: RED/step marking and DCTCP): an
incast-heavy collective (gather: every rank sends its block to one) over CUBIC and drop-tail, and over DCTCP with
step marking at K, same buffer."""

from __future__ import annotations

from testbed.runner import run_scenario
from testbed.scenario import get

COLL = get("collective")


def run(tmp_path, name, **kw):
    p = {x.name: x.default for x in COLL.params}
    p.update(collective="gather", size="256K", iterations=10, warmup=1, buffer_bytes=40_000, host_rate_mbps=20.0,
             fabric_rate_mbps=20.0, sample_interval_ms=0, **kw)
    COLL.validate(p)
    return run_scenario(COLL, p, 1, tmp_path / name, quiet=True)


def test_dctcp_with_step_marking_drops_far_less_than_cubic_over_droptail_in_a_gather(tmp_path):
    cubic = run(tmp_path, "cubic", cc="cubic")
    dctcp = run(tmp_path, "dctcp", cc="dctcp", ecn=True, discipline="step", k_bytes=12_000)
    keys = ("cct_ms_p50", "cct_ms_p99", "switch_drops", "ecn_marks", "tcp_retrans_segs")
    print({k: (cubic.get(k), dctcp.get(k)) for k in keys})
    assert cubic["data_verified"] and dctcp["data_verified"]
    # measured in the lab VM (2 runs each): CUBIC 163-197 drops, DCTCP 15-18 (its first window still overflows a
    # 40 kB buffer: 3 senders x 10 segments) with 2594-2696 marks
    assert cubic["ecn_marks"] == 0 and dctcp["ecn_marks"] > 100, (cubic, dctcp)
    assert dctcp["switch_drops"] < 0.3 * cubic["switch_drops"], (cubic, dctcp)
