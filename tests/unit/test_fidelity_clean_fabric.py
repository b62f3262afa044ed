"""A clean fabric (no drop at any port, no loss or fault configured, no PFC pause) whose transports still retransmit
on a timer is an emulator artefact: testbed.measure.verdict.judge_run on hand-made run folders and synthetic
summaries, and analysis.fidelity.timeouts_without_loss itself. Pure logic."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from analysis import fidelity
from testbed.measure.verdict import judge_run

QCOLS = ["t_s", "node", "port", "class", "backlog_bytes", "backlog_packets", "drops", "marks", "sent_bytes",
         "sent_packets", "overlimits"]


class Folder:
    """What judge_run reads of a RunDir: its path, its manifest, write_csv."""

    def __init__(self, path: Path, params: dict | None = None, topology: dict | None = None):
        path.mkdir()
        self.path = path
        self.manifest = {"scenario": "collective", "params": {"load_balancing": "ecmp", **(params or {})},
                         "topology": topology or {"kind": "leafspine", "host_link": {"loss_percent": 0.0}}}

    def write_csv(self, name, columns, rows):
        with open(self.path / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(columns)
            w.writerows(rows)
        return self.path / name

    def tcp(self, retrans: int, probes: int):
        rows = []
        for host, share in (("h1", 0), ("h2", 1)):  # the counts split over two hosts: judged summed
            r, p = (retrans // 2, probes // 2) if share else (retrans - retrans // 2, probes - probes // 2)
            rows += [[host, "before", "TcpRetransSegs", 10], [host, "after", "TcpRetransSegs", 10 + r],
                     [host, "before", "TcpExtTCPLossProbes", 3], [host, "after", "TcpExtTCPLossProbes", 3 + p]]
        self.write_csv("tcp.csv", ["host", "phase", "counter", "value"], rows)
        return self

    def queues(self, drops_at_end: int):
        rows = [[round(0.01 * i, 3), "leaf1", "h1", "1:1", 0, 0, 0 if i < 50 else drops_at_end, 0, i * 1500, i, 0]
                for i in range(100)]
        self.write_csv("queues.csv", QCOLS, rows)
        self.write_csv("ports.csv", ["node", "port", "peer", "tier", "rate_mbps"], [["leaf1", "h1", "h1", "leaf_down",
                                                                                      10.0]])
        return self


def judged(folder: Folder, **summary) -> dict:
    judge_run(folder, summary)
    return summary


def test_rc_ack_timeouts_on_a_clean_fabric_make_the_run_unfaithful_and_say_why(tmp_path):
    s = judged(Folder(tmp_path / "rdma"), rdma_timeout_retries=11, rdma_retransmit_events=11, switch_drops=0,
               host_nic_drops=0, tcp_retrans_segs=0)
    assert s["fidelity_ok"] is False, s
    why = s["fidelity_reasons"]
    assert "11 RDMA RC ACK-timeout retries" in why and "clean fabric" in why and "not because of the network" in why
    # none: faithful, and the verdict is still written
    s = judged(Folder(tmp_path / "none"), rdma_timeout_retries=0, switch_drops=0)
    assert s["fidelity_ok"] is True and s["fidelity_reasons"] == "", s


@pytest.mark.parametrize("how", ["switch drops", "host NIC drops", "port counters", "loss parameter",
                                 "lossy link", "fault", "PFC pauses"])
def test_retransmissions_with_a_reason_in_the_network_are_not_flagged(tmp_path, how):
    summary = {"rdma_timeout_retries": 7, "switch_drops": 0, "host_nic_drops": 0}
    folder = Folder(tmp_path / "run",
                    params={"loss_percent": 1.0} if how == "loss parameter" else None,
                    topology={"host_link": {"loss_percent": 0.5}} if how == "lossy link" else None)
    if how == "switch drops":
        summary["switch_drops"] = 3
    elif how == "host NIC drops":
        summary["host_nic_drops"] = 1
    elif how == "port counters":
        folder.queues(drops_at_end=4)
    elif how == "fault":
        folder.write_csv("events.csv", ["t_s", "kind", "target", "detail"], [[1.0, "netem_set", "leaf1:spine1", ""]])
    elif how == "PFC pauses":
        summary["pfc_pause_events"] = 12
    s = judged(folder, **summary)
    assert "clean fabric" not in s["fidelity_reasons"], (how, s)


def test_tcp_is_flagged_only_beyond_its_own_tail_loss_probes(tmp_path):
    # measured on clean host-kernel and lab-VM runs: 1-6 retransmitted segments, all of them tail-loss probes that
    # a D-SACK showed unneeded: TCP's own probing, not a sign of the machine
    s = judged(Folder(tmp_path / "probes").tcp(retrans=6, probes=14), tcp_retrans_segs=6, switch_drops=0)
    assert s["fidelity_ok"] is True, s
    s = judged(Folder(tmp_path / "rto").tcp(retrans=9, probes=4), tcp_retrans_segs=9, switch_drops=0)
    assert s["fidelity_ok"] is False and "5 TCP segments sent again beyond its 4 tail-loss probes" in \
        s["fidelity_reasons"], s
    # a balancer that spreads one flow over paths reorders it: fast retransmits are the network's then
    s = judged(Folder(tmp_path / "spray", params={"load_balancing": "spray"}).tcp(retrans=40, probes=2),
               tcp_retrans_segs=40, switch_drops=0)
    assert s["fidelity_ok"] is True, s


def test_the_reason_comes_before_a_scenarios_own_and_keeps_it(tmp_path):
    s = judged(Folder(tmp_path / "both"), rdma_timeout_retries=2, fidelity_ok=False,
               fidelity_reasons="CPU 95% busy while the ops ran: the emulation may not have kept up")
    assert s["fidelity_ok"] is False
    assert s["fidelity_reasons"].startswith("2 RDMA RC") and s["fidelity_reasons"].endswith("kept up"), s


def test_the_rule_alone():
    assert fidelity.timeouts_without_loss(0, 0) is None
    assert fidelity.timeouts_without_loss(None, None) is None
    assert fidelity.timeouts_without_loss(0, -3, 8) is None  # fewer retransmissions than probes
    both = fidelity.timeouts_without_loss(3, 2, 1)
    assert "3 RDMA RC ACK-timeout retries" in both and "2 TCP segments sent again beyond its 1 tail-loss" in both
