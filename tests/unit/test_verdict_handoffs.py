"""Late timers make a run unfaithful only where its timings pass through user-space hand-offs (ops, incast rounds):
testbed.measure.verdict.judge_run on hand-made run folders. Pure logic."""

from __future__ import annotations

import csv
from pathlib import Path

from testbed.measure.verdict import judge_run

QCOLS = ["t_s", "node", "port", "class", "backlog_bytes", "backlog_packets", "drops", "marks", "sent_bytes",
         "sent_packets", "overlimits"]


class Folder:
    def __init__(self, path: Path):
        self.path = path

    def write_csv(self, name, columns, rows):
        with open(self.path / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns)
            w.writerows(rows)


def _late_sampler_run(tmp_path: Path, name: str) -> Folder:
    """Rounds every 10 ms, every 20th one 70 ms late: p99 lateness ~60 ms (over the 40 ms limit), no stall."""
    d = tmp_path / name
    d.mkdir()
    t, rows = 0.0, []
    for i in range(400):
        t += 0.080 if i % 20 == 19 else 0.010
        rows.append([round(t, 4), "leaf1", "h1", "a", 0, 0, 0, 0, i * 100, i, 0])
    Folder(d).write_csv("queues.csv", QCOLS, rows)
    Folder(d).write_csv("ports.csv", ["node", "port", "peer", "tier", "rate_mbps"],
                        [["leaf1", "h1", "h1", "leaf_down", 4.0]])
    return Folder(d)


def test_bulk_flows_keep_their_verdict_with_late_timers_but_a_collective_does_not(tmp_path):
    flows = _late_sampler_run(tmp_path, "flows")
    s = {}  # a scenario without checks of its own (pfc-hol): the verdict still says faithful or not
    judge_run(flows, s)
    assert s["sampler_late_ms_p99"] > 40 and s["fidelity_ok"] is True and s["fidelity_reasons"] == "", s
    ops = _late_sampler_run(tmp_path, "ops")
    ops.write_csv("ops.csv", ["iteration", "op", "op_index", "collective", "rank", "host", "start_s", "end_s",
                              "bytes_sent", "bytes_recv", "wait_s"], [[0, "allreduce", 0, "allreduce", 0, "h1", 0.1,
                                                                      0.2, 1, 1, 0.0]])
    s = {}
    judge_run(ops, s)
    assert s["fidelity_ok"] is False and "timers fired late" in str(s["fidelity_reasons"]), s
