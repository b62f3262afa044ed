"""`testbed compare` leads with what differs: the parameter diff (text ones included), rows ordered by the size of
the change, a change from or to 0 written as such, and compare.html with both sides' pictures. Pure logic on run
directories written by hand (manifest, summary.json, rounds.csv), as tests/unit/test_compare.py does."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.compare import (change_order, change_size, change_text, compare, compare_sides, param_diff,
                              param_texts)
from testbed import cli

INCAST = {"senders": 8, "buffer_bytes": 64000, "discipline": "droptail", "ecn": False, "cc": "cubic",
          "rto_min_ms": 200, "seed": 0, "topology": "leafspine"}


def run_dir(path: Path, *, seed: int = 1, params: dict | None = None, summary: dict | None = None,
            rounds_ms=None, where: dict | None = None) -> Path:
    path.mkdir(parents=True)
    manifest = {"scenario": "incast", "params": {**INCAST, **(params or {})}, "seed": seed, "complete": True,
                **(where or {})}
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "summary.json").write_text(json.dumps(summary or {}))
    if rounds_ms:
        rows = [(r, "h2", 10.0 + r, 10.0 + r + ms / 1e3, 1000) for r, ms in enumerate(rounds_ms)]
        pd.DataFrame(rows, columns=["round", "sender", "start_s", "end_s", "bytes"]).to_csv(path / "rounds.csv",
                                                                                           index=False)
    return path


def folder(path: Path, n: int, *, params: dict | None = None, summary: dict | None = None, rounds_ms=None) -> Path:
    """A repeat folder of n runs (seed-1 ... seed-n); callables in ``summary`` and ``rounds_ms`` get the run's
    index."""
    for i in range(n):
        values = {k: (v(i) if callable(v) else v) for k, v in (summary or {}).items()}
        run_dir(path / f"seed-{i + 1}", seed=i + 1, params=params, summary=values,
                rounds_ms=rounds_ms(i) if rounds_ms else None)
    return path


# --------------------------------------------------------------------------- pure logic

def test_param_texts_keep_text_values_and_drop_the_seed():
    t = param_texts({"scenario": "incast", "params": {**INCAST, "hosts": ["h1", "h2"]}, "seed": 3,
                     "in_lab_vm": True, "kernel_release": "6.12", "git_commit": "abc"})
    assert t["cc"] == "cubic" and t["discipline"] == "droptail" and t["ecn"] == "false" and t["rto_min_ms"] == "200"
    assert t["hosts"] == '["h1", "h2"]' and t["scenario"] == "incast" and t["in_lab_vm"] == "true"
    assert "seed" not in t  # every repeat has its own: never a difference between the sides
    assert param_texts({"params": None}) == {"scenario": "?"}


def test_param_diff_names_every_value_that_differs_text_first_where_last():
    a = [param_texts({"scenario": "incast", "params": {**INCAST, "cc": "dctcp", "ecn": True}, "git_commit": "1"})]
    b = [param_texts({"scenario": "incast", "params": INCAST, "git_commit": "2"})]
    assert param_diff([a, b]) == [("ecn", ["true", "false"]), ("cc", ["dctcp", "cubic"]),
                                  ("git_commit", ["1", "2"])]
    # rto 200 vs 1, numbers as text (200.0 is 200), and a parameter one side lacks
    c = [param_texts({"scenario": "incast", "params": {**INCAST, "rto_min_ms": 200.0, "delay_ms": 5}})]
    d = [param_texts({"scenario": "incast", "params": {**INCAST, "rto_min_ms": 1}})]
    assert param_diff([c, d]) == [("rto_min_ms", ["200", "1"]), ("delay_ms", ["5", "(not set)"])]
    # a repeat folder whose runs disagree reads "varies"; the same spread on both sides is no difference
    e = [param_texts({"params": {"k_bytes": k}}) for k in (1, 2, 2)]
    f = [param_texts({"params": {"k_bytes": 1}})]
    assert param_diff([e, f]) == [("k_bytes", ["varies: 1, 2", "1"])]
    assert param_diff([e, e]) == [] and param_diff([c, c]) == []
    assert param_diff([[param_texts({"scenario": "incast"})], [param_texts({"scenario": "collective"})]]) == \
        [("scenario", ["incast", "collective"])]


def test_a_change_from_or_to_zero_is_written_as_such():
    assert change_text(0, 664, "x") == "0 -> 664 (new)"
    assert change_text(664.0, 0.0, "x") == "664 -> 0 (gone)"
    assert change_text(0, 0, "x") == "0 both"
    assert change_text(math.nan, 5, "x") == "absent -> 5" and change_text(0.5, None, "x") == "0.5 -> absent"
    assert change_text(math.nan, math.nan, "x") == "-"
    assert change_text(10, 20, "2") == "2"  # a ratio says it
    assert change_size(0, 664) == math.inf and change_size(664, 0) == math.inf and change_size(-1, 1) == math.inf
    assert change_size(0, 0) == 0 and math.isnan(change_size(math.nan, 3))
    assert change_size(10, 20) == pytest.approx(math.log(2)) == change_size(20, 10)  # a halving is a doubling


def test_rows_are_ordered_verdicts_first_then_by_size_parameters_last():
    sizes = [0.1, math.inf, math.nan, 2.0, 0.1, 3.0, 5.0]
    assert change_order(sizes) == [1, 6, 5, 3, 0, 4, 2]  # ties keep their order, nan last
    told = [False, False, False, True, False, True, False]
    assert change_order(sizes, told=told) == [5, 3, 1, 6, 0, 4, 2]
    echoes = [False, False, False, False, False, True, False]
    assert change_order(sizes, told=told, echoes=echoes) == [3, 1, 6, 0, 4, 2, 5]


def test_machine_metrics_follow_the_experiments_own_in_each_group():
    """A real difference in the emulating machine's CPU is shown after the round p99's, not ahead of it."""
    from analysis.compare import is_machine_metric

    names = ["cpu_busy_mean", "round_ms_p99", "sampler_lag_ms_p99", "drops"]
    assert [is_machine_metric(n) for n in names] == [True, False, True, False]
    sizes, told = [3.0, 1.0, 0.5, 0.2], [True, True, False, False]
    assert change_order(sizes, told=told, machine=[is_machine_metric(n) for n in names]) == [1, 0, 3, 2]


# --------------------------------------------------------------------------- two repeat folders

def _lossless_vs_lossy(tmp_path: Path) -> tuple[Path, Path]:
    """A: DCTCP with ECN, no drops, rounds ~30 ms; B: cubic drop-tail, ~664 drops, rounds ~230 ms. Both carry a
    buffer_bytes summary value that only echoes a parameter (64000 vs 32000)."""
    a = folder(tmp_path / "dctcp", 5, params={"cc": "dctcp", "ecn": True, "discipline": "red"},
               summary={"drops": 0, "marks": lambda i: 400.0 + i, "goodput_mbps": lambda i: 18.0 + i / 10,
                        "cpu_busy_mean": lambda i: 0.2 + i / 100, "buffer_bytes": 64000},
               rounds_ms=lambda i: [30 + i, 31, 29, 33])
    b = folder(tmp_path / "tcp", 5, params={"buffer_bytes": 32000},
               summary={"drops": lambda i: 660.0 + 2 * i, "marks": 0, "goodput_mbps": lambda i: 9.0 + i / 10,
                        "cpu_busy_mean": lambda i: 0.2 + (4 - i) / 100, "buffer_bytes": 32000},
               rounds_ms=lambda i: [230 + i, 31, 229, 233])
    return a, b


def test_two_repeat_folders_lead_with_what_differs_and_the_largest_real_changes(tmp_path):
    a, b = _lossless_vs_lossy(tmp_path)
    df, sa, sb = compare_sides(a, b, out=tmp_path / "cmp")
    order = list(df["metric"])
    verdicts = dict(zip(df["metric"], df["verdict"]))
    # drops and marks went from or to 0: the largest changes, with a verdict; then goodput x2, the round tail x7
    assert verdicts["drops"] == "A < B" and verdicts["marks"] == "A > B"
    assert set(order[:2]) == {"drops", "marks"}
    told = [m for m in order if verdicts[m] in ("A > B", "A < B") and m != "buffer_bytes"]
    assert order[:len(told)] == told  # every verdict before every "not distinguishable"
    assert verdicts["cpu_busy_mean"].startswith("not distinguishable")
    # a parameter's echo (a verdict, but of the configuration) comes last: "what differs" shows it
    assert order[-1] == "buffer_bytes" and verdicts["buffer_bytes"] == "A > B"
    drops = df[df["metric"] == "drops"].iloc[0]
    assert drops["change"] == "0 -> 664 (new)" and drops["ratio"] == 0
    assert df[df["metric"] == "goodput_mbps"].iloc[0]["change"] == ""  # a ratio says it
    # the CSV holds the same rows in the same order
    csv = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(csv["metric"]) == order and csv.loc[csv["metric"] == "drops", "change"].iloc[0] == "0 -> 664 (new)"
    # the page: what differs (text parameters too) before the verdicts, the verdicts before the pictures
    html = (tmp_path / "cmp" / "compare.html").read_text()
    heads = re.findall(r"<h2>([^<]+)</h2>", html)
    assert heads == ["What differs", "Verdicts", "Distributions over the runs", "Samples inside the runs",
                     "Every metric"]
    diff = html[html.index("<h2>What differs"):html.index("<h2>Verdicts")]
    for name, va, vb in (("cc", "dctcp", "cubic"), ("discipline", "red", "droptail"), ("ecn", "true", "false"),
                         ("buffer_bytes", "64000", "32000")):
        assert f"<td>{name}</td><td>{va}</td><td>{vb}</td>" in diff.replace('<td class="num">', "<td>")
    lead = html[html.index("<h2>Verdicts"):html.index("<h2>Distributions")]
    assert "0 -&gt; 664 (new)" in lead and "cpu_busy_mean" not in lead and "buffer_bytes" not in lead
    assert lead.index("<td>drops</td>") < lead.index("<td>goodput_mbps</td>")
    assert html.count("data:image/png;base64,") == 2  # the distributions and the round-time CDF
    assert (tmp_path / "cmp" / "compare_cdf_round_ms.png").stat().st_size > 0
    assert not (tmp_path / "cmp" / "compare_cdf_cct_ms.png").exists()  # no ops: no CCT picture
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert md.index("## What differs") < md.index("## Verdicts") < md.index("](compare_cdf_round_ms.png)")
    assert "| cc | dctcp | cubic |" in md and "![distributions](compare_distributions.png)" in md
    assert sa.samples["round_ms"] and len(sa.samples["round_ms"]) == 20  # 4 rounds x 5 runs, pooled
    assert sa.params[0]["cc"] == "dctcp" and sb.params[0]["cc"] == "cubic"


def test_the_terminal_shows_the_same_order_and_names_the_parameters_first(tmp_path, capsys):
    a, b = _lossless_vs_lossy(tmp_path)
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    cc = next(i for i, x in enumerate(lines) if x.strip().startswith("cc "))
    assert "dctcp | cubic" in lines[cc]
    rows = [x.split()[1] for x in lines if x.startswith("│")]
    df = pd.read_csv(tmp_path / "o" / "compare.csv")
    shown = [m for m in df["metric"] if m in rows]
    assert rows == shown and cc < next(i for i, x in enumerate(lines) if x.startswith("│"))
    assert "0 -> 664 (new)" in next(x for x in lines if x.startswith("│ drops"))
    assert str(tmp_path / "o" / "compare.html") in out


def test_one_configuration_against_itself_differs_in_nothing(tmp_path):
    a = folder(tmp_path / "a", 5, summary={"drops": lambda i: 600.0 + i}, rounds_ms=lambda i: [200 + i, 30])
    b = folder(tmp_path / "b", 5, summary={"drops": lambda i: 601.0 + i}, rounds_ms=lambda i: [201 + i, 30])
    df, _, _ = compare_sides(a, b, out=tmp_path / "cmp")
    assert not df["verdict"].isin(["A > B", "A < B"]).any()
    html = (tmp_path / "cmp" / "compare.html").read_text()
    assert "Nothing in the configuration" in html and "No metric differs beyond the noise" in html


# --------------------------------------------------------------------------- two run directories

def test_two_run_directories_say_one_run_cannot_tell_and_show_rto_min(tmp_path, capsys):
    a = run_dir(tmp_path / "rto200", params={"rto_min_ms": 200}, summary={"drops": 0, "tcp_timeouts": 40},
                rounds_ms=[30, 230, 31], where={"in_lab_vm": False})
    b = run_dir(tmp_path / "rto1", params={"rto_min_ms": 1}, summary={"drops": 664, "tcp_timeouts": 38},
                rounds_ms=[30, 32, 31], where={"in_lab_vm": True})
    df = compare([a, b], out=tmp_path / "cmp")
    assert list(df["metric"])[0] == "drops"  # 0 -> 664 is the largest change; then the round tail x7
    assert list(df["metric"]).index("round_ms_p99") < list(df["metric"]).index("tcp_timeouts")
    html = (tmp_path / "cmp" / "compare.html").read_text()
    assert "One run a side cannot tell whether a difference is real" in html
    assert "<td>rto_min_ms</td>" in html and "<td>in_lab_vm</td>" in html and "0 -&gt; 664 (new)" in html
    assert html.index("What differs") < html.index("Largest changes") < html.index("Samples inside the runs")
    assert cli.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"rto_min_ms\s+200 \| 1", out) and "in_lab_vm" in out
    assert "0 -> 664 (new)" in next(x for x in out.splitlines() if x.startswith("│ drops"))
    assert "carry no verdict" in out
    # a run directory against a repeat folder: the page says no verdict is possible
    c = folder(tmp_path / "rep", 5, params={"rto_min_ms": 1}, summary={"drops": lambda i: 660.0 + i})
    compare_sides(a, c, out=tmp_path / "mixed")
    mixed = (tmp_path / "mixed" / "compare.html").read_text()
    assert "One run a side cannot tell" in mixed and "<td>rto_min_ms</td><td>200</td><td>1</td>" in \
        mixed.replace('<td class="num">', "<td>")


RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def test_samples_inside_the_runs_are_overlaid(tmp_path):
    """The fixture collectives: per-op and per-step samples and the busiest port's backlog, drawn for both runs."""
    from analysis.comparepage import run_samples
    from analysis.summary import load_quietly

    r = run_samples(load_quietly(RUNS / "small_collective"))
    assert r.samples["cct_ms"] == pytest.approx([12, 10, 40, 20]) and r.samples["step_ms"] == pytest.approx([30, 140])
    assert r.samples["round_ms"] == pytest.approx([20, 40])
    # leaf1:eth3 drops 12 packets and peaks at 9000 B (spine1:eth2: none, 2000 B): its samples, from its first one
    assert r.port == "leaf1:eth3" and r.trace_bytes == [0, 3000, 9000, 1500, 0] == r.samples["backlog_bytes"]
    assert r.trace_s == pytest.approx([0, 0.05, 0.1, 0.15, 0.2])
    compare([RUNS / "small_collective", RUNS / "straggler_collective"], out=tmp_path / "cmp")
    for name in ("cct_ms", "step_ms", "round_ms", "backlog_bytes"):
        assert (tmp_path / "cmp" / f"compare_cdf_{name}.png").stat().st_size > 0, name
    assert (tmp_path / "cmp" / "compare_queue_trace.png").stat().st_size > 0
    html = (tmp_path / "cmp" / "compare.html").read_text()
    assert html.count("data:image/png;base64,") == 5
    diff = html[html.index("<h2>What differs"):html.index("<h2>Largest changes")].replace('<td class="num">', "<td>")
    assert "<td>scenario</td><td>fixture-small-collective</td><td>collective</td>" in diff
    assert "<td>ranks</td><td>2</td><td>3</td>" in diff and "<td>collective</td><td>(not set)</td>" in diff
