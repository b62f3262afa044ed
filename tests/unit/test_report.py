"""analysis.report: report.html (self-contained) and report.md from fixture runs and synthetic run directories
(smoke-like: manifest/summary/tcp only; incast-like: rounds/queues; collective-like: ops/queues/pfc), with
missing, empty and incomplete files."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import metrics as m
from analysis.load import RunDirError, empty_frame, load_run
from analysis.report import _phases, downsample_queues, fmt, key_metrics, write_report
from testbed import cli

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
PNG = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------- builders

def manifest(run: Path, scenario: str, params: dict, complete: bool = True, **extra) -> None:
    run.mkdir(parents=True, exist_ok=True)
    m_ = {"scenario": scenario, "params": params, "seed": 1, "started_wall": "2026-01-01T00:00:00+00:00",
          "ended_wall": "2026-01-01T00:00:02+00:00" if complete else None, "t0_monotonic": 100.0,
          "kernel_release": "7.0.0-test", "in_lab_vm": True, "versions": {"pandas": "9.9", "iproute2": "ip 6"},
          "git_commit": "abc1234", "complete": complete, **extra}
    (run / "manifest.json").write_text(json.dumps(m_))


def tcp_rows(retrans=(4, 0)) -> pd.DataFrame:
    rows = []
    for host, r in zip(("h1", "h2"), retrans):
        rows += [(host, "before", "TcpOutSegs", 10), (host, "after", "TcpOutSegs", 1010),
                 (host, "before", "TcpRetransSegs", 1), (host, "after", "TcpRetransSegs", 1 + r)]
    return pd.DataFrame(rows, columns=["host", "phase", "counter", "value"])


def smoke_like(run: Path, goodput=18.7654) -> Path:
    manifest(run, "smoke", {"rate_mbps": 20.0, "ecn": True, "cc": "cubic"})
    (run / "summary.json").write_text(json.dumps({"rate_mbps": 20.0, "goodput_mbps": goodput,
                                                  "bottleneck_drops": 0, "ecn_marks": 12}))
    tcp_rows().to_csv(run / "tcp.csv", index=False)
    return run


def incast_like(run: Path, senders=4, round_ms=(10.0, 20.0, 30.0, 80.0), drops=40, sent=960) -> Path:
    """rounds: every sender finishes round r at start + round_ms[r] (the last sender), others earlier.
    queues: one bottleneck port leaf1:h1 (two classes, to check summing) and one quiet port."""
    manifest(run, "incast", {"senders": senders, "buffer_bytes": 16000})
    (run / "summary.json").write_text(json.dumps({"senders": senders, "round_ms_p99": max(round_ms),
                                                  "incast_loss_rate": drops / (drops + sent),
                                                  "bottleneck": "leaf1:h1", "goodput_mbps": 15.5}))
    rows = []
    t = 100.0
    for r, ms in enumerate(round_ms):
        for s in range(senders):
            end = t + ms / 1e3 * (1.0 if s == senders - 1 else 0.5)
            rows.append((r, f"h{s + 2}", round(t, 6), round(end, 6), 64000))
        t += ms / 1e3 + 0.01
    pd.DataFrame(rows, columns=["round", "sender", "start_s", "end_s", "bytes"]).to_csv(run / "rounds.csv",
                                                                                       index=False)
    n = 50
    ts = 100.0 + np.arange(n) * (t - 100.0) / (n - 1)
    q = []
    for i, ti in enumerate(ts):
        frac = i / (n - 1)
        for cls, share in (("1:10", 0.75), ("1:20", 0.25)):
            q.append((round(ti, 6), "leaf1", "h1", cls, int(16000 * share * (i % 5) / 4), i % 5,
                      int(drops * share * frac), 0, int(sent * 1500 * share * frac), int(sent * share * frac), 0))
        q.append((round(ti, 6), "spine1", "leaf1", "1:10", 100, 1, 0, 0, i * 1500, i, 0))
    pd.DataFrame(q, columns=["t_s", "node", "port", "class", "backlog_bytes", "backlog_packets", "drops", "marks",
                             "sent_bytes", "sent_packets", "overlimits"]).to_csv(run / "queues.csv", index=False)
    tcp_rows(retrans=(30, 10)).to_csv(run / "tcp.csv", index=False)
    return run


def collective_like(run: Path, slow_ms=45.0) -> Path:
    """2 ranks x 3 iterations x 1 allreduce op; iteration 2 is slow and has drops and a pause on spine1:eth1."""
    manifest(run, "collective", {"ranks": 2, "size": "1M"})
    (run / "summary.json").write_text(json.dumps({"cct_ms_p99": slow_ms, "busbw_gbps": 0.5}))
    ops = []
    starts = [100.0, 100.1, 100.2]
    durs = [10.0, 12.0, slow_ms]
    for it, (s, d) in enumerate(zip(starts, durs)):
        for rank in range(2):
            ops.append((it, "grad", 0, "allreduce", rank, f"h{rank}", s, s + d / 1e3 * (1 if rank else 0.8),
                        1_000_000, 1_000_000, 0.001))
    pd.DataFrame(ops, columns=["iteration", "op", "op_index", "collective", "rank", "host", "start_s", "end_s",
                               "bytes_sent", "bytes_recv", "wait_s"]).to_csv(run / "ops.csv", index=False)
    q = []
    for i in range(31):
        t = 100.0 + i * 0.01
        drops = 0 if t < 100.205 else 7
        q.append((round(t, 6), "spine1", "eth1", "1:10", 5000 if 100.2 <= t <= 100.25 else 0, 0, drops, 0,
                  i * 10000, i * 10, 0))
    pd.DataFrame(q, columns=["t_s", "node", "port", "class", "backlog_bytes", "backlog_packets", "drops", "marks",
                             "sent_bytes", "sent_packets", "overlimits"]).to_csv(run / "queues.csv", index=False)
    pd.DataFrame([(100.21, "spine1", "eth1", 3, "xoff", 9000), (100.23, "spine1", "eth1", 3, "xon", 100)],
                 columns=["t_s", "node", "port", "prio", "event", "backlog_bytes"]).to_csv(run / "pfc.csv", index=False)
    tcp_rows().to_csv(run / "tcp.csv", index=False)
    return run


def images(html: str) -> list[bytes]:
    import base64

    return [base64.b64decode(x) for x in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


def self_contained(html: str) -> None:
    assert "<script" not in html.lower()
    # no reference to anything outside the file
    assert not re.search(r'(src|href)="(?!data:)', html), re.findall(r'(?:src|href)="[^"]*"', html)
    assert "<link" not in html.lower()


# ---------------------------------------------------------------------------------------------- fixtures

def test_fixture_collective_report(tmp_path):
    html_p, md_p = write_report(RUNS / "small_collective", tmp_path)
    assert (html_p, md_p) == (tmp_path / "report.html", tmp_path / "report.md")
    html, md = html_p.read_text(), md_p.read_text()
    self_contained(html)
    imgs = images(html)
    assert len(imgs) == 5 and all(i[:8] == PNG for i in imgs)  # timeline, CCT CDF, round CDF, queues, pauses
    for png in ("timeline.png", "cdf_cct.png", "cdf_round.png", "queues.png", "pauses.png"):
        assert f"](report_files/{png})" in md
        assert (tmp_path / "report_files" / png).read_bytes()[:8] == PNG
    # the explanation sentence, with the fixture's hand-computed numbers
    sentence = ("p99 op (iteration 1, op 0, 40.0 ms) coincided with 3.0 ms of pauses on spine1:eth2, 10 drops on "
                "leaf1:eth3 and 3 ECN marks [median 12.0 ms, n=4 ops: p99 is the max]")
    assert sentence in md and sentence in html
    # summary, configuration, file row counts
    for text in (md, html):
        assert "cct_p99_ms" in text and "hand-made fixture" in text
        assert "fixture-small-collective" in text and "0000000" in text
    assert "| ops.csv | present | 8 |" in md and "| rdma.csv | absent | - | 0 |" in md
    assert "| queues.csv | present | 10 |" in md
    assert "| cct_ms_p99 | 40 |" in md and "| ops_n | 4 |" in md and "| rounds_n | 2 |" in md
    assert "| ranks | 2 |" in md
    assert "INCOMPLETE" not in md and "INCOMPLETE" not in html
    # the fixture folder itself is untouched
    assert not (RUNS / "small_collective" / "report.html").exists()


def test_fixture_incomplete_report_shows_the_flag(tmp_path):
    html_p, md_p = write_report(RUNS / "incomplete", tmp_path)
    html, md = html_p.read_text(), md_p.read_text()
    assert 'class="alert"' in html and "INCOMPLETE RUN" in html
    assert md.count("INCOMPLETE RUN") == 1 and md.startswith("# ")
    assert "| complete | FALSE (manifest says false) |" in md
    assert 'class="false"' in html
    assert "dropped damaged last row" in md  # the loader's notes are listed
    assert "| summary.json | absent |" in md
    assert "| queues.csv | empty | 0 |" in md and "| pfc.csv | empty | 0 |" in md
    assert "No summary.json" in md
    self_contained(html)


# ---------------------------------------------------------------------------------------------- synthetic runs

def test_smoke_like_run_has_tables_and_no_plots(tmp_path):
    run = smoke_like(tmp_path / "smoke")
    html_p, md_p = write_report(run)
    assert html_p.parent == run  # default: next to the data
    html, md = html_p.read_text(), md_p.read_text()
    assert images(html) == [] and "![" not in md and "## Plots" not in md
    assert "| goodput_mbps | 18.7654 |" in md and "18.7654" in html
    assert "| tcp_retrans_segs | 4 |" in md and "| retransmit_rate | 0.002 |" in md
    assert "| TcpRetransSegs | 4 | 0 |" in md  # per-host deltas
    assert "| rounds.csv | absent |" in md and "| tcp.csv | present | 8 |" in md
    assert "| kernel_release | 7.0.0-test |" in md and "| pandas | 9.9 |" in md and "| seed | 1 |" in md
    assert "slowest op" not in md
    self_contained(html)


def test_incast_like_run(tmp_path):
    run = incast_like(tmp_path / "incast")
    html_p, md_p = write_report(run)
    html, md = html_p.read_text(), md_p.read_text()
    assert len(images(html)) == 2  # round CDF and queue occupancy
    assert "cdf_round.png" in md and "queues.png" in md and "cdf_cct.png" not in md and "pauses.png" not in md
    # nearest-rank p50 of (10, 20, 30, 80) ms is 20 ms, p99 the max
    assert "| round_ms_p50 | 20 |" in md and "| round_ms_p99 | 80 |" in md and "| rounds_n | 4 |" in md
    # classes summed: 40 drops / (40 + 960) at leaf1:h1
    assert "| loss_rate | 0.04 |" in md and "| drops | 40 |" in md
    assert "| leaf1 | h1 |" in md
    assert "shaded: incast rounds" in md
    assert "| rounds.csv | present | 16 |" in md and "| queues.csv | present | 150 |" in md


def test_collective_like_run_explains_the_slowest_op(tmp_path):
    run = collective_like(tmp_path / "coll")
    html_p, md_p = write_report(run, tmp_path / "elsewhere")
    html, md = html_p.read_text(), md_p.read_text()
    assert html_p == tmp_path / "elsewhere" / "report.html"
    assert len(images(html)) == 4  # per-rank timeline, CCT CDF, queues with ops shaded, pauses
    assert ("p99 op (iteration 2, op 0, 45.0 ms) coincided with 20.0 ms of pauses on spine1:eth1 and 7 drops on "
            "spine1:eth1") in md
    assert "| cct_ms_p99 | 45 |" in md and "| ops_n | 3 |" in md and "| pauses | 1 |" in md
    assert "## PFC pauses per link" in md


def test_missing_and_odd_files(tmp_path):
    run = incast_like(tmp_path / "r")
    (run / "summary.json").unlink()
    (run / "queues.csv").write_text("")  # zero bytes
    (run / "rounds.csv").write_text("round,sender,start_s,end_s,bytes\n")  # header only
    (run / "tcp_info.csv").write_text("a,b\n1,2\n3,4\n5,6")  # not in docs/rundir.md: counted, not parsed
    (run / "agent.log").write_text("")
    html_p, md_p = write_report(run)
    md = md_p.read_text()
    assert "| tcp_info.csv | other | 3 |" in md and "| agent.log | other | - | 0 |" in md
    assert "summary.json is missing" in md and "No summary.json" in md
    assert "| queues.csv | empty | 0 |" in md and "| rounds.csv | empty | 0 |" in md
    assert "## Plots" not in md


def test_only_a_manifest(tmp_path):
    manifest(tmp_path / "bare", "smoke", {}, complete=False)
    html_p, md_p = write_report(tmp_path / "bare")
    md = md_p.read_text()
    assert "INCOMPLETE RUN" in md and "No params in the manifest." in md
    assert "No rounds, ops, queue, TCP, PFC or CPU rows" in md


def test_html_escapes_what_the_run_says(tmp_path):
    run = smoke_like(tmp_path / "x")
    manifest(run, "<script>alert(1)</script>", {"note": "a|b <b>bold</b>"})
    html_p, md_p = write_report(run)
    html = html_p.read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>bold" not in html
    assert "a\\|b" in md_p.read_text()  # pipes cannot break a Markdown table


def test_not_a_run_directory(tmp_path):
    with pytest.raises(RunDirError):
        write_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError):
        write_report(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(RunDirError):
        write_report(bad)


def test_cli_report(tmp_path, capsys):
    run = shutil.copytree(RUNS / "small_collective", tmp_path / "run")
    assert cli.main(["report", str(run)]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(run / "report.html"), str(run / "report.md")]
    for argv, words in ((["report", str(tmp_path / "nope")], "no such run directory"),
                        (["report", str(tmp_path)], "no manifest.json"),
                        (["report", str(run / "ops.csv")], "not a folder")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and words in err
    (run / "manifest.json").write_text("[")
    assert cli.main(["report", str(run)]) == 2
    assert "corrupt manifest.json" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- helpers

def test_key_metrics_only_what_the_data_supports(tmp_path):
    km = key_metrics(load_run(smoke_like(tmp_path / "s")))
    assert set(km) == {"tcp_retrans_segs", "retransmit_rate"}
    km = key_metrics(load_run(incast_like(tmp_path / "i")))
    assert km["round_ms_max"] == pytest.approx(80.0) and km["backlog_peak_bytes"] == 16000
    # 4 senders x 64000 B x 4 rounds over 140 ms of rounds
    assert km["round_goodput_mbps"] == pytest.approx(4 * 64000 * 4 * 8 / 0.140 / 1e6)


def test_downsample_keeps_peaks_and_bounds_points():
    n = 100_000
    t = 10.0 + np.arange(n) * 1e-4
    rng = np.random.default_rng(0)
    backlog = rng.integers(0, 1000, n)
    backlog[54_321] = 99_999
    q = pd.DataFrame({"t_s": np.repeat(t, 2), "node": "s1", "port": "p1", "class": np.tile(["a", "b"], n),
                      "backlog_bytes": np.repeat(backlog, 2), "backlog_packets": 0, "drops": 0, "marks": 0,
                      "sent_bytes": 0, "sent_packets": 0, "overlimits": 0})
    other = q.assign(port="p2", backlog_bytes=1)
    d = downsample_queues(pd.concat([q, other]), points=500)
    assert set(d["port"]) == {"p1", "p2"}
    p1 = d[d["port"] == "p1"]
    assert len(p1) <= 500
    assert p1["backlog_bytes"].max() == 2 * 99_999  # summed over the two classes, peak kept
    assert p1["t_s"].is_monotonic_increasing and p1["t_s"].min() == pytest.approx(10.0)
    only = downsample_queues(pd.concat([q, other]), points=500, ports=["s1:p2"])
    assert set(only["port"]) == {"p2"} and (only["backlog_bytes"] == 2).all()
    assert downsample_queues(empty_frame("queues")).empty


def test_phases_merge_overlaps_and_cap_the_count():
    iv = pd.DataFrame({"start_s": [0.0, 0.5, 2.0], "end_s": [1.0, 1.5, 3.0]})
    assert _phases(iv).values.tolist() == [[0.0, 1.5], [2.0, 3.0]]
    many = pd.DataFrame({"start_s": np.arange(5000) * 1.0, "end_s": np.arange(5000) * 1.0 + 0.5})
    got = _phases(many, max_phases=100)
    assert len(got) <= 100 and got["start_s"].min() == 0.0 and got["end_s"].max() == 4999.5


def test_fmt():
    assert fmt(40.0) == "40" and fmt(5.333333) == "5.3333" and fmt(0.0291262) == "0.02913"
    assert fmt(float("nan")) == "-" and fmt(None) == "-" and fmt(True) == "true" and fmt(np.int64(7)) == "7"
    assert fmt({"b": 1}) == '{"b": 1}' and fmt("x") == "x"


def test_report_numbers_match_metrics(tmp_path):
    run = load_run(incast_like(tmp_path / "i", round_ms=tuple(float(x) for x in range(1, 201))))
    p = m.percentiles(m.round_times(run.rounds)["round_s"] * 1e3)
    md = write_report(run.path)[1].read_text()
    assert p.resolves(0.99)
    assert f"| round_ms_p99 | {fmt(p.p99)} |" in md and f"| rounds_n | {p.n} |" in md


def test_report_and_compare_import_nothing_from_the_fabric():
    import subprocess
    import sys

    probe = ("import sys, json, analysis.report, analysis.compare; print(json.dumps(sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('testbed', 'topologies', 'traffic') or m == 'matplotlib.pyplot')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_cli_report_unwritable_folder_is_one_line(tmp_path, monkeypatch, capsys):
    import analysis.report as report

    def denied(run_dir, out=None, slides=False):
        raise PermissionError(13, "Permission denied", str(run_dir))

    monkeypatch.setattr(report, "write_report", denied)
    assert cli.main(["report", str(RUNS / "small_collective")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--out DIR" in err


def test_wire_counts_beside_host_counters(tmp_path):
    run = smoke_like(tmp_path / "wire")
    s = json.loads((run / "summary.json").read_text())
    s.update({"wire_capture_port": "h1:eth0", "wire_capture_file": "capture-h1-eth0.pcap",
              "wire_capture_kernel_drops": 0, "wire_packets": 5000, "wire_roce_retransmitted_packets": 321,
              "wire_roce_replays": 7, "wire_roce_nak_seq_err": 5, "wire_tcp_retransmitted_segments": 0,
              "rdma_duplicate_request": 400, "rdma_completer_retry_err": 9, "tcp_retrans_segs": 4})
    (run / "summary.json").write_text(json.dumps(s))
    _, md_p = write_report(run)
    md = md_p.read_text()
    assert "## The wire at h1:eth0 (packet capture)" in md and "5000 packets" in md
    assert "| RoCE packets sent again (go-back-N) | 321 | - | rxe counts no retransmitted packets" in md
    assert "| go-back-N replays | 7 | 9 |" in md
    assert "| NAKs (PSN sequence error) | 5 | - |" in md  # no rdma_out_of_seq_request in this summary
    assert "| TCP segments sent again | 0 | 4 |" in md
    assert "CE-marked" not in md  # no wire_ce_marked_packets key: no row
    plain = smoke_like(tmp_path / "plain")
    _, md_p = write_report(plain)
    assert "The wire at" not in md_p.read_text()


# ---------------------------------------------------------------------------------------------- the story first

def test_report_opens_with_what_happened_then_plots_then_tables(tmp_path):
    _, md_p = write_report(RUNS / "straggler_collective", tmp_path)
    md = md_p.read_text()
    order = ["## What happened", "Rank 2 (h3) was late", "| training step, median (n=4) | 122 ms |",
             "> Fidelity: faithful", "The slowest op: p99 op (iteration 1, op 0, 100.0 ms)",
             "](report_files/timeline.png)", "## Plots", "](report_files/cdf_cct.png)", "## Queues per port",
             "## Host TCP counters", "## Configuration (manifest.json)", "<summary>Files</summary>",
             "<summary>All metrics (", "| step_cv |"]
    at = [md.find(x) for x in order]
    assert all(i >= 0 for i in at), dict(zip(order, at))
    assert at == sorted(at), dict(zip(order, at))
    # the slowest op coincided with the 4 drops at spine1:leaf1 (the bracketing queue samples)
    assert "4 drops on spine1:leaf1" in md
    # the slowest op (100 ms) is within 1.2x of the median (94 ms): no "10 slowest ops" table
    assert "## The 10 slowest ops" not in md
    # every metric once, in the folded table at the end
    assert md.count("| step_cv |") == 1 and md.count("| comm_wait_fraction |") == 1
    assert md.count("| step_ms_p50 |") == 1 and md.count("| busbw_gbps |") == 1
    assert "Summary (summary.json)" not in md and "Key metrics from the data" not in md
    assert (tmp_path / "report_files" / "timeline.png").read_bytes()[:8] == PNG


def test_rank_timeline_shows_the_straggler(tmp_path):
    from analysis import plots
    from analysis.metrics import rank_timeline

    run = load_run(RUNS / "straggler_collective")
    tl = rank_timeline(run.ops)
    tl["s"] = tl["end_s"] - tl["start_s"]
    per = tl.groupby(["rank", "kind"])["s"].sum().unstack(fill_value=0.0)
    assert per.loc[2, "compute"] == pytest.approx(4 * 0.100 + 0.004)  # the straggler computes longest
    assert per.loc[2, "wait"] == 0 and per.loc[0, "wait"] == pytest.approx(0.292)  # the others wait for it
    assert per.loc[0, "compute"] == pytest.approx(4 * 0.030)
    # compute + comm + wait covers each rank from its origin to its last op end
    assert per.loc[0].sum() == pytest.approx(1000.498 - 1000.000)
    p = plots.plot_rank_timeline(run.ops, tmp_path / "t.png")
    assert p.read_bytes()[:8] == PNG
    assert plots.plot_rank_timeline(run.ops.iloc[:0], tmp_path / "e.png").read_bytes()[:8] == PNG
