"""analysis.trace: the run as a Chrome / Perfetto trace (trace.json), checked against the Trace Event Format's rules
(JSON object form with "traceEvents"; ph X complete events with ts/dur in microseconds, pid and tid; C counters with
numeric args; i instants with a scope; M metadata naming processes and threads) on a hand-made run
(tests/timeline_fixture.py: 4 ranks on 2 hosts, rank 3 a straggler, two queues, a PFC pause, two fault events)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis import trace
from analysis.load import load_run
from tests.timeline_fixture import LATE_S, T0, TRANSFER_S, write_run

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
PHASES = {"X", "C", "i", "M"}
META = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def _no_nan(token: str):
    raise AssertionError(f"{token} is not JSON a trace viewer accepts")


def _load(path: Path) -> dict:
    doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_nan)
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    return doc


def _check_format(doc: dict) -> list[dict]:
    """Every event obeys the format's rules; returns the non-metadata events."""
    evs = doc["traceEvents"]
    for e in evs:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str) and e["name"] and isinstance(e["pid"], int), e
        assert isinstance(e["tid"], int) and isinstance(e["ts"], int), e  # whole microseconds on every event
        if e["ph"] == "M":
            assert e["name"] in META and isinstance(e["args"], dict), e
            if e["name"].startswith("thread"):
                assert isinstance(e["tid"], int), e
            continue
        assert e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
        elif e["ph"] == "C":  # each args key is one numeric series of the counter track (name, pid)
            assert e["args"] and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                     for v in e["args"].values()), e
        else:
            assert e["s"] in ("g", "p", "t"), e
    body = [e for e in evs if e["ph"] != "M"]
    assert [e["ph"] for e in evs[:len(evs) - len(body)]] == ["M"] * (len(evs) - len(body))  # metadata first
    ts = [e["ts"] for e in body]
    assert ts == sorted(ts), "events out of time order"
    return body


@pytest.fixture
def doc(tmp_path) -> dict:
    run = load_run(write_run(tmp_path / "run"))
    path = trace.write_trace(run, tmp_path / "out" / trace.TRACE_FILE)
    assert path == tmp_path / "out" / trace.TRACE_FILE
    return _load(path)


def test_trace_obeys_the_event_format(doc):
    body = _check_format(doc)
    assert {e["ph"] for e in body} == {"X", "C", "i"}
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    named = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_name"}
    procs = {e["pid"] for e in meta if e["name"] == "process_name"}
    assert {e["pid"] for e in body} <= procs  # every event's process is named
    assert {(e["pid"], e["tid"]) for e in body if e["ph"] == "X"} <= named  # and every slice's track
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["t0_monotonic"] == T0


def test_one_process_per_host_one_track_per_rank(doc):
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert sorted(procs.values()) == ["fabric", "h1", "h2"]
    pid = {v: k for k, v in procs.items()}
    assert threads[(pid["h1"], 1)] == "rank 0" and threads[(pid["h1"], 2)] == "rank 1"
    assert threads[(pid["h2"], 3)] == "rank 2" and threads[(pid["h2"], 4)] == "rank 3"
    # every slice sits on a named track: a rank's on its host, a pause's in the fabric
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            assert (e["pid"], e["tid"]) in threads, e
            assert procs[e["pid"]] in (("fabric",) if e["cat"] == "pfc" else ("h1", "h2")), e


def test_slices_split_each_op_and_nest_in_it(doc):
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    ops = [e for e in xs if e["cat"] == "op"]
    assert len(ops) == 12
    for op in ops:
        kids = [e for e in xs if e["cat"] in ("wait", "transfer") and (e["pid"], e["tid"]) == (op["pid"], op["tid"])
                and op["ts"] <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"]]
        assert sum(k["dur"] for k in kids) == op["dur"]  # whole microseconds: the children tile the op exactly
        assert kids[-1]["ts"] + kids[-1]["dur"] == op["ts"] + op["dur"]
        assert op["args"]["last_to_join"] == "rank 3"
    waits = [e for e in xs if e["cat"] == "wait"]
    assert {e["tid"] for e in waits} == {1, 2, 3}  # rank 3 (tid 4), the straggler, never waits
    assert max(e["dur"] for e in waits) == pytest.approx((LATE_S + 0.002) * 1e6, abs=1.0)
    assert min(e["dur"] for e in xs if e["cat"] == "transfer") == pytest.approx(TRANSFER_S * 1e6, abs=1.0)
    assert any(e["cat"] == "compute" for e in xs)


def test_one_clock_from_the_runs_start(doc):
    first_op = min(e["ts"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "op")
    assert first_op == pytest.approx((1.0 + 0.050) * 1e6, abs=1.0)  # rank 0 arrives 1.05 s after t0_monotonic
    faults = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["cat"] == "fault"]
    assert [(e["name"], e["ts"], e["s"]) for e in faults] == [("cpu_throttled h2", 1.5e6, "g"),
                                                              ("cpu_restored h2", 2.5e6, "g")]
    pauses = [e for e in doc["traceEvents"] if e.get("cat") == "pfc"]
    assert [(e["ph"], e["ts"], e["dur"], e["args"]["port"]) for e in pauses] == [("X", 1200000, 50000, "leaf1:spine1")]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert tracks[(pauses[0]["pid"], pauses[0]["tid"])] == "PFC pause leaf1:spine1 prio 3"
    # the queue samples sit on the same clock: the first sample is 1.0 s after t0_monotonic, the first drop 1.5 s
    first_q = min(e["ts"] for e in doc["traceEvents"] if e["ph"] == "C" and e["cat"] == "queue")
    assert first_q == 1000000


def test_queue_counters_and_drop_instants(doc):
    cs = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["cat"] == "queue"]
    assert {e["name"] for e in cs} == {"backlog leaf1:spine1", "backlog leaf2:h3"}
    assert max(e["args"]["bytes"] for e in cs if e["name"] == "backlog leaf1:spine1") == 12000
    drops = [e for e in doc["traceEvents"] if e["ph"] == "i" and e["cat"] == "drop"]
    # the fixture's drop counter steps 0 -> 1 -> 2 at samples 10 and 20
    assert [(e["name"], e["args"]["drops"]) for e in drops] == [("drops leaf1:spine1", 1)] * 2
    assert [e["ts"] for e in drops] == pytest.approx([1.5e6, 2.0e6])
    counts = [(e["ts"], e["args"]["drops"]) for e in doc["traceEvents"] if e["ph"] == "C" and e["cat"] == "drops"]
    assert counts == [(1000000, 0), (1500000, 1), (2000000, 2)]  # cumulative, a step where the counter rose
    assert not any(e.get("cat") == "marks" for e in doc["traceEvents"])  # no port marked: no track


def test_marks_and_the_machines_cpu_as_counter_tracks(tmp_path):
    """ECN marks since the run's start per port that marked; cpu.csv's busy share as one percent track of a
    'machine' process (every host is a namespace of one kernel, so they share its CPUs)."""
    run_dir = write_run(tmp_path / "run")
    q = (run_dir / "queues.csv").read_text().splitlines()
    rows = [q[0]] + [",".join(f[:7] + [str(i // 2 // 4)] + f[8:]) for i, f in enumerate(x.split(",") for x in q[1:])]
    (run_dir / "queues.csv").write_text("\n".join(rows) + "\n")
    (run_dir / "cpu.csv").write_text("t_s,busy_fraction\n" + "".join(f"{T0 + 1 + k * 0.1},{k / 10}\n"
                                                                       for k in range(10)))
    doc = _load(trace.write_trace(load_run(run_dir), tmp_path / "t.json"))
    _check_format(doc)
    marks = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["cat"] == "marks"]
    assert {e["name"] for e in marks} == {"ECN marks leaf1:spine1", "ECN marks leaf2:h3"}
    assert max(e["args"]["marks"] for e in marks) == 7
    cpu = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["cat"] == "cpu"]
    assert [e["args"]["percent"] for e in cpu] == pytest.approx([k * 10 for k in range(10)])
    assert cpu[0]["ts"] == 1000000
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs[cpu[0]["pid"]] == "machine"


def test_report_writes_the_trace_and_runs_without_ops_still_get_one(tmp_path):
    from analysis.report import write_report

    run_dir = tmp_path / "straggler"
    shutil.copytree(RUNS / "straggler_collective", run_dir)
    write_report(run_dir)
    body = _check_format(_load(run_dir / "trace.json"))
    assert any(e["ph"] == "X" for e in body)
    empty = write_run(tmp_path / "empty")
    (empty / "ops.csv").unlink()
    body = _check_format(_load(trace.write_trace(load_run(empty))))
    assert {e["cat"] for e in body if e["ph"] == "X"} == {"pfc"} and any(e["ph"] == "C" for e in body)


def test_trace_command_writes_the_file_and_refuses_bad_input_in_one_line(tmp_path):
    """`testbed trace RUN_DIR [--out FILE]`: the trace where asked; a missing run or a non-JSON --out is one line,
    exit 2, nothing written."""
    import subprocess
    import sys

    run_dir = write_run(tmp_path / "run")
    cmd = [sys.executable, "-m", "testbed.cli", "trace"]
    r = subprocess.run([*cmd, str(run_dir)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (run_dir / "trace.json").is_file(), r.stderr
    assert json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    out = tmp_path / "elsewhere" / "mine.json"
    out.parent.mkdir()
    r = subprocess.run([*cmd, str(run_dir), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and out.is_file() and sorted(p.name for p in out.parent.iterdir()) == ["mine.json"]
    # a trace.json already in the target folder (another run's) is left as it was: the file is written, not renamed
    (out.parent / "trace.json").write_text("another run's trace")
    r = subprocess.run([*cmd, str(run_dir), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (out.parent / "trace.json").read_text() == "another run's trace", r.stderr
    assert json.loads(out.read_text())["traceEvents"]
    for bad in ([str(tmp_path / "nope")], [str(run_dir), "--out", str(tmp_path / "t.txt")], [str(tmp_path)]):
        r = subprocess.run([*cmd, *bad], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
    assert not (tmp_path / "t.txt").exists()
