"""benchmarks/transports_under_loss.py's pure parts: the rotation that interleaves the cells, the summary keys it
reads per transport, the table over rows of several sessions, and the command line's refusals."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("transports_under_loss",
                                               ROOT / "benchmarks" / "transports_under_loss.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_every_round_runs_each_cell_once_and_each_cell_takes_every_place():
    ts, losses = ["tcp", "rdma", "uet"], [0.0, 1.0]
    rounds = [bench.cells(ts, losses, r) for r in range(6)]
    for cells in rounds:
        assert sorted(cells) == sorted((t, x) for t in ts for x in losses)
    for place in range(6):
        assert len({cells[place] for cells in rounds}) == 6


def test_metrics_reads_each_transports_own_counters():
    s = {"cct_ms_p50": 800.0, "cct_ms_p99": 900.0, "data_verified": True, "tcp_retrans_segs": 22, "tcp_timeouts": 1,
         "wire_roce_retransmitted_packets": 300, "rdma_retransmit_events": 26, "rdma_timeout_retries": 2,
         "uet_retransmitted_packets": 21, "uet_retransmitted_bytes": 30800, "uet_rto_events": 4}
    assert bench.metrics("tcp", s)["retrans_pkts"] == 22 and bench.metrics("tcp", s)["timer_expiries"] == 1
    rdma = bench.metrics("rdma", s)
    assert (rdma["retrans_pkts"], rdma["recovery_rounds"], rdma["timer_expiries"]) == (300, 26, 2)
    uet = bench.metrics("uet", s)
    assert (uet["retrans_pkts"], uet["retrans_bytes"], uet["timer_expiries"]) == (21, 30800, 4)
    assert uet["cct_p50_ms"] == 800.0 and uet["cct_p99_ms"] == 900.0


def test_the_table_gives_medians_slowdowns_and_leaves_out_failed_runs():
    rows = [{"transport": "tcp", "loss": loss, "seed": i, "cct_p50_ms": base * (1 + loss) + i,
             "cct_p99_ms": base * (1 + loss) + 2 * i, "retrans_pkts": 10 * loss, "timer_expiries": 0}
            for i in range(4) for loss in (0.0, 1.0) for base in (100.0,)]
    rows.append({"transport": "uet", "loss": 1.0, "seed": 9, "error": "RunFailed: agent died"})
    text = bench.table(rows, [0.0, 1.0])
    assert "| runs (loss 0% / 1%) | 4 / 4 |" in text
    assert "| CCT p50 ms, loss 0% | 102 [100, 103] |" in text
    assert "| slowdown p50 1%/0% | 1.99 [" in text and "A > B" in text
    assert "left out: 1 runs: uet loss 1% seed 9: RunFailed: agent died" in text


def test_rdma_resends_are_the_captures_and_the_drops_stay_beside_them():
    s = {"wire_roce_retransmitted_packets": 300, "switch_drops": 120, "host_nic_drops": 5}
    assert bench.metrics("rdma", s, "loss")["retrans_pkts"] == 300  # the capture sits before netem's drops
    # queue drops happen before the capture, but the capture already counts the resend of a packet dropped at first
    # (later packets had crossed it): adding the drops would count those twice
    m = bench.metrics("rdma", s, "incast")
    assert m["retrans_pkts"] == 300 and m["switch_drops"] == 120


def test_both_shares_the_healthy_incast_between_the_incast_and_slow_spine_tables():
    args = bench.parse(["--condition", "both"])
    assert bench.levels_of(args) == [("incast", 0.0), ("incast", 1.0), ("slow-spine", 1.0)]
    rows = [{"transport": "tcp", "condition": c, "level": lv, "seed": i, "cct_p50_ms": 100.0 * (1 + lv) + i,
             "cct_p99_ms": 120.0 * (1 + lv) + i, **({"slow_fraction": 0.1} if c == "slow-spine" else {})}
            for i in range(3) for c, lv in (("incast", 0.0), ("incast", 1.0), ("slow-spine", 1.0))]
    rows.append({"transport": "tcp", "loss": 0.0, "seed": 7, "cct_p50_ms": 5.0, "cct_p99_ms": 5.0})
    rows.append({"transport": "tcp", "condition": "slow-spine", "level": 1.0, "seed": 8, "cct_p50_ms": 5.0,
                 "cct_p99_ms": 5.0})  # a slow spine of another fraction (none recorded: 0.25): not pooled
    for condition, label in (("incast", "port 16 kB"), ("slow-spine", "slow spine")):
        text = bench.table(rows, [0.0, 1.0], condition, args)
        assert f"| runs (healthy / {label}) | 3 / 3 |" in text
        assert "| CCT p50 ms, healthy | 101 [100, 102] |" in text


@pytest.mark.parametrize("argv,why", [(["--condition", "bogus"], "invalid choice: 'bogus'"),
                                      (["--condition", "incast", "--incast-buffer", "100"], "--incast-buffer"),
                                      (["--condition", "slow-spine", "--slow-fraction", "1.5"], "--slow-fraction"),
                                      (["--iterations", "0"], "iterations"), (["--size", "huge"], "size")])
def test_a_bad_condition_or_its_option_is_one_line_and_exit_2_before_anything_is_made(argv, why, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        bench.main([*argv, "--out", str(out)])
    assert e.value.code == 2 and not out.exists()
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in last and why in last
