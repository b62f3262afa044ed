"""analysis.compare: key metrics side by side, ratios to the first run, compare.csv / compare.md, the CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analysis.compare import compare, numeric_summary
from analysis.load import RunDirError
from testbed import cli

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def run_dir(path: Path, summary: dict | None, rounds_ms=None, complete=True) -> Path:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"scenario": "incast", "params": {}, "seed": 1,
                                                    "complete": complete}))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    if rounds_ms:
        rows = [(r, "h2", 10.0 + r, 10.0 + r + ms / 1e3, 1000) for r, ms in enumerate(rounds_ms)]
        pd.DataFrame(rows, columns=["round", "sender", "start_s", "end_s", "bytes"]).to_csv(path / "rounds.csv",
                                                                                           index=False)
    return path


def row(df, metric, source):
    sel = df[(df["metric"] == metric) & (df["source"] == source)]
    assert len(sel) == 1, (metric, source)
    return sel.iloc[0]


def test_ratios_to_the_first_run(tmp_path):
    a = run_dir(tmp_path / "a", {"goodput_mbps": 20.0, "drops": 0, "round_ms_p99": 10.0, "ok": True,
                                 "bottleneck": "leaf1:h1"}, rounds_ms=[10, 20, 40])
    b = run_dir(tmp_path / "b", {"goodput_mbps": 10.0, "drops": 5, "round_ms_p99": 35.0, "ok": False},
                rounds_ms=[20, 40, 80])
    c = run_dir(tmp_path / "c", {"goodput_mbps": 30.0, "extra": 1.5}, complete=False)
    df = compare([a, b, c], out=tmp_path / "cmp")
    assert list(df.columns) == ["metric", "source", "a", "b", "c", "b/a", "c/a"]
    g = row(df, "goodput_mbps", "summary")
    assert (g["a"], g["b"], g["c"]) == (20.0, 10.0, 30.0)
    assert g["b/a"] == pytest.approx(0.5) and g["c/a"] == pytest.approx(1.5)
    # one row per metric: summary.json's round_ms_p99 (10, 35: not what rounds.csv says) is replaced by the value
    # recomputed from rounds.csv, the one the report shows too
    assert (df["metric"] == "round_ms_p99").sum() == 1
    d = row(df, "drops", "summary")
    assert d["b"] == 5 and math.isnan(d["b/a"])  # a ratio to zero is not a number
    assert math.isnan(d["c"]) and math.isnan(d["c/a"])  # absent in c
    e = row(df, "extra", "summary")
    assert math.isnan(e["a"]) and e["c"] == 1.5 and math.isnan(e["c/a"])
    ok = row(df, "ok", "summary")
    assert (ok["a"], ok["b"]) == (1.0, 0.0)
    assert "bottleneck" not in set(df["metric"])  # strings are not compared
    # recomputed from rounds.csv: every round doubled
    p99 = row(df, "round_ms_p99", "data")
    assert p99["a"] == pytest.approx(40.0) and p99["b/a"] == pytest.approx(2.0) and math.isnan(p99["c"])
    assert row(df, "rounds_n", "data")["b/a"] == pytest.approx(1.0)
    # the largest change first: drops 0 -> 5 and ok 1 -> 0 (from or to 0) lead, the doubled rounds and goodput
    # x0.5 (|log 2| both) next, unchanged rows after them, extra (absent in the first run: nothing to measure) last
    order = list(df["metric"])
    assert set(order[:2]) == {"drops", "ok"} and order[-1] == "extra"
    assert max(order.index("goodput_mbps"), order.index("round_ms_p99")) < order.index("rounds_n")

    csv = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(csv.columns) == list(df.columns) and len(csv) == len(df)
    assert csv.loc[csv["metric"] == "goodput_mbps", "c/a"].iloc[0] == pytest.approx(1.5)
    assert list(csv["metric"]) == order  # the CSV in the same order
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| goodput_mbps | summary | 20 | 10 | 30 | 0.5 | 1.5 |" in md
    assert "| drops | summary | 0 | 5 | - | 0 -> 5 (new) | 0 -> absent |" in md  # not a ratio "-"
    assert f"- c = {c} (incast; complete: false)" in md
    html = (tmp_path / "cmp" / "compare.html").read_text()
    assert "0 -&gt; 5 (new)" in html and "One run a side cannot tell whether a difference is real" in html


def test_fixture_runs_and_repeated_names(tmp_path):
    df = compare([RUNS / "small_collective", RUNS / "incomplete", RUNS / "small_collective"])
    assert list(df.columns[2:5]) == ["small_collective", "incomplete", "small_collective#2"]
    cct = row(df, "cct_ms_p99", "data")
    assert cct["small_collective"] == pytest.approx(40.0)
    assert cct["small_collective#2/small_collective"] == pytest.approx(1.0)
    assert row(df, "cct_p99_ms", "summary")["small_collective"] == 40.0
    assert not (tmp_path / "compare.csv").exists()  # nothing written without out


def test_single_run_and_errors(tmp_path):
    df = compare([RUNS / "small_collective"])
    assert list(df.columns[:3]) == ["metric", "source", "small_collective"] and len(df.columns) == 3
    with pytest.raises(ValueError):
        compare([])
    with pytest.raises(RunDirError):
        compare([RUNS / "small_collective", tmp_path / "missing"])


def test_numeric_summary():
    assert numeric_summary({"a": 1, "b": 2.5, "c": "x", "d": None, "e": True, "f": [1]}) == \
        {"a": 1.0, "b": 2.5, "e": 1.0}


def test_cli_compare(tmp_path, capsys):
    a = run_dir(tmp_path / "a", {"goodput_mbps": 20.0})
    b = run_dir(tmp_path / "b", {"goodput_mbps": 5.0})
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "goodput_mbps" in out and "0.25" in out
    assert (tmp_path / "o" / "compare.csv").exists() and (tmp_path / "o" / "compare.md").exists()
    assert str(tmp_path / "o" / "compare.csv") in out
    for argv, words in ((["compare", str(a), str(tmp_path / "nope")], "no such run directory"),
                        (["compare", str(a), str(tmp_path)], "no manifest.json")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and words in err
    bad = shutil.copytree(a, tmp_path / "bad")
    (bad / "summary.json").write_text("{")
    assert cli.main(["compare", str(a), str(bad)]) == 2
    assert "corrupt summary.json" in capsys.readouterr().err
