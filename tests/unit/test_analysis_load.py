"""analysis.load: run directories -> DataFrames, with one-line errors."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.load import SCHEMAS, IncompleteRunWarning, RunDirError, empty_frame, load_csv, load_run

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
SMALL = RUNS / "small_collective"
INCOMPLETE = RUNS / "incomplete"


def test_complete_run_loads_with_documented_dtypes():
    run = load_run(SMALL)
    assert run.complete is True and run.warnings == []
    assert run.manifest["scenario"] == "fixture-small-collective"
    assert run.summary["cct_p99_ms"] == 40.0
    for name, schema in SCHEMAS.items():
        df = getattr(run, name)
        assert list(df.columns)[: len(schema)] == list(schema)
        for col, dt in schema.items():
            expected = object if dt == "str" else dt
            assert df[col].dtype == expected, (name, col, df[col].dtype)
    assert len(run.ops) == 8 and len(run.queues) == 10
    assert run.queues["class"].iloc[0] == "1:1"


def test_absent_file_is_empty_frame_with_columns():
    run = load_run(SMALL)  # TCP-only run: no rdma.csv
    assert not run.has("rdma") and run.has("tcp")
    assert run.rdma.empty and list(run.rdma.columns) == list(SCHEMAS["rdma"])
    assert run.rdma["value"].dtype == "int64"


def test_time_window_from_manifest():
    assert load_run(SMALL).time_window() == pytest.approx((1000.0, 1000.25))


def test_to_wall():
    assert load_run(SMALL).to_wall(1000.5) == pytest.approx(1700000000.5)


def test_incomplete_run_loads_with_flag_and_drops_truncated_tail():
    with pytest.warns(IncompleteRunWarning):
        run = load_run(INCOMPLETE)
    assert run.complete is False
    assert any("incomplete" in w for w in run.warnings)
    assert any("dropped damaged last row" in w for w in run.warnings)
    assert len(run.ops) == 2
    assert run.summary == {}
    # zero-byte and header-only files: empty with columns
    assert run.queues.empty and list(run.queues.columns) == list(SCHEMAS["queues"])
    assert run.pfc.empty and run.has("pfc") and run.has("queues")
    # no ended_wall: window ends at the last timestamp seen
    assert run.time_window() == pytest.approx((5.0, 5.6))


def _copy(tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(SMALL, dst)
    return dst


def test_missing_manifest(tmp_path):
    d = _copy(tmp_path)
    (d / "manifest.json").unlink()
    with pytest.raises(RunDirError, match="missing manifest.json") as e:
        load_run(d)
    assert "\n" not in str(e.value)


def test_not_a_directory(tmp_path):
    with pytest.raises(RunDirError, match="not a run directory"):
        load_run(tmp_path / "nope")


def test_corrupt_manifest(tmp_path):
    d = _copy(tmp_path)
    (d / "manifest.json").write_text("{ not json")
    with pytest.raises(RunDirError, match="corrupt manifest.json") as e:
        load_run(d)
    assert "\n" not in str(e.value)


def test_corrupt_summary(tmp_path):
    d = _copy(tmp_path)
    (d / "summary.json").write_text("[1, 2")
    with pytest.raises(RunDirError, match="corrupt summary.json"):
        load_run(d)


def test_corrupt_value_in_complete_run(tmp_path):
    d = _copy(tmp_path)
    lines = (d / "ops.csv").read_text().splitlines()
    lines[3] = lines[3].replace("1000.020", "abc", 1)
    (d / "ops.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDirError, match=r"corrupt ops.csv .* line 4") as e:
        load_run(d)
    assert "\n" not in str(e.value)


def test_truncated_tail_in_complete_run_is_an_error(tmp_path):
    d = _copy(tmp_path)
    with open(d / "queues.csv", "a") as fh:
        fh.write("1000.250,leaf1,eth3,1:1,0")
    with pytest.raises(RunDirError, match="corrupt queues.csv"):
        load_run(d)


def test_missing_column(tmp_path):
    d = _copy(tmp_path)
    (d / "pfc.csv").write_text("t_s,node,port,event\n1.0,a,b,xoff\n")
    with pytest.raises(RunDirError, match=r"missing columns \['prio', 'backlog_bytes'\]"):
        load_run(d)


def test_too_many_fields_is_corrupt(tmp_path):
    d = _copy(tmp_path)
    (d / "cpu.csv").write_text("t_s,busy_fraction\n1.0,0.5\n2.0,0.5,9,9\n")
    with pytest.raises(RunDirError, match="corrupt cpu.csv"):
        load_run(d)


def test_non_integer_in_int_column(tmp_path):
    p = tmp_path / "tcp.csv"
    p.write_text("host,phase,counter,value\nh0,before,TcpOutSegs,1.5\n")
    with pytest.raises(RunDirError, match="line 2"):
        load_csv(p, "tcp")


def test_extra_columns_kept(tmp_path):
    p = tmp_path / "cpu.csv"
    p.write_text("t_s,busy_fraction,cpu\n1.0,0.5,3\n")
    df = load_csv(p, "cpu")
    assert df["cpu"].tolist() == [3]


def test_empty_frame_all_tables():
    for name in SCHEMAS:
        df = empty_frame(name)
        assert df.empty and list(df.columns) == list(SCHEMAS[name])
        assert isinstance(df, pd.DataFrame)
