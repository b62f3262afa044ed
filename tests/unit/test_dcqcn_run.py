"""DCQCN as a run option, its pure parts: the dcqcn_* parameters into the programs' parameters (scaled from the
paper unless given), the refusals before anything is built (one line, exit status 2 from the CLI), PFC restricted
to switch ports, and analysis.dcqcn's numbers from the raw files a run writes (dcqcn.csv, dcqcn_rates.csv)."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from analysis.dcqcn import dcqcn_metrics, flows, jain_last, jain_sending, sending
from analysis.load import load_run
from testbed.errors import UsageError
from testbed.params import resolve
from testbed.pfc.run import without_hosts
from testbed.workloads.settings import JOB_PARAMS
from testbed.workloads.dcqcn import DCQCN_PARAMS, LAB_TIME_SCALE, DcqcnSettings, check_run, dcqcn_needs
from traffic.dcqcn import scaled

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"dcqcn": "on", "transport": "rdma", "discipline": "step", "ecn": False, "pfc": "off", "rdma_timeout": 20,
        "topology_file": ""}


def settings(*sets: str) -> DcqcnSettings:
    return DcqcnSettings.from_params(resolve(DCQCN_PARAMS, list(sets)))


def test_the_defaults_are_the_papers_time_constants_scaled_and_the_lab_tuned_rates():
    p = settings().params(20.0)
    base = scaled(20.0, time_scale=LAB_TIME_SCALE)
    assert (p.cnp_interval_ns, p.alpha_timer_ns, p.increase_timer_ns, p.byte_reset) == (
        base.cnp_interval_ns, base.alpha_timer_ns, base.increase_timer_ns, base.byte_reset)
    assert p.cnp_interval_ns == 50_000_000 and p.line_rate_kbps == 20_000
    assert (p.min_rate_kbps, p.ai_rate_kbps, p.hai_rate_kbps) == (2000, 400, 4000)  # 10 %, 2 %, 20 %
    assert settings("dcqcn_time_scale=100").params(10.0).cnp_interval_ns == scaled(10.0).cnp_interval_ns


def test_a_given_parameter_replaces_the_scaled_one_and_n_is_also_the_cut_interval():
    p = settings("dcqcn_cnp_interval_ms=2", "dcqcn_increase_timer_ms=1.5", "dcqcn_min_rate_mbps=0.5",
                 "dcqcn_g=16", "dcqcn_byte_reset_bytes=64K").params(20.0)
    assert (p.cnp_interval_ns, p.cut_interval_ns, p.increase_timer_ns) == (2_000_000, 2_000_000, 1_500_000)
    assert (p.min_rate_kbps, p.g, p.byte_reset) == (500, 16, 64_000)
    assert p.alpha_timer_ns == scaled(20.0, time_scale=LAB_TIME_SCALE).alpha_timer_ns  # not given: scaled


@pytest.mark.parametrize("change, words", [
    ({"transport": "tcp"}, "needs transport=rdma"),
    ({"discipline": "droptail"}, "mark ECN"),
    ({"discipline": "red", "ecn": False}, "mark ECN"),
    ({"pfc": "on"}, "pfc_pause_hosts=false"),
    ({"rdma_timeout": 16}, "rdma_timeout >= 19"),
    ({"dcqcn_min_rate_mbps": 30.0}, "min_rate_kbps"),
])
def test_what_cannot_work_is_refused_in_one_line(change, words):
    p = {**resolve(DCQCN_PARAMS, []), **GOOD, **change}
    with pytest.raises(UsageError, match=words) as e:
        check_run(p, 20.0)
    assert "\n" not in str(e.value)


def test_mark_is_refused_like_on_but_lets_pfc_pause_the_hosts():
    base = {**resolve(DCQCN_PARAMS, []), **GOOD, "dcqcn": "mark"}
    check_run({**base, "pfc": "on", "pfc_pause_hosts": True}, 20.0)
    with pytest.raises(UsageError, match="dcqcn=mark needs transport=rdma"):
        check_run({**base, "transport": "tcp"}, 20.0)
    assert dcqcn_needs(base) == ("qdisc:clsact",) and dcqcn_needs({**base, "dcqcn": "on"})[0] == "qdisc:fq"


def test_the_ack_timeout_rule_is_for_on_only_mark_paces_nothing():
    default = resolve(JOB_PARAMS, [])["rdma_timeout"]  # a run's ACK timeout when not given (below 19)
    p = {**resolve(DCQCN_PARAMS, []), **GOOD, "rdma_timeout": default}
    check_run({**p, "dcqcn": "mark"}, 20.0)
    with pytest.raises(UsageError, match="dcqcn=on needs rdma_timeout >= 19") as e:
        check_run(p, 20.0)
    assert "\n" not in str(e.value)


def test_a_working_combination_passes_and_off_checks_nothing():
    check_run({**resolve(DCQCN_PARAMS, []), **GOOD}, 20.0)
    check_run({**resolve(DCQCN_PARAMS, []), **GOOD, "pfc": "on", "pfc_pause_hosts": False, "discipline": "red",
               "ecn": True}, 20.0)
    check_run({**resolve(DCQCN_PARAMS, []), "transport": "tcp"}, 20.0)


def test_the_cli_refuses_dcqcn_on_a_tcp_run_with_exit_status_2(tmp_path):
    out = tmp_path / "never"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "collective", "--set", "dcqcn=on",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "dcqcn=on needs transport=rdma" in lines[0]
    assert not out.exists()


def test_pfc_without_hosts_keeps_switch_queues_and_their_switch_feeders():
    q = lambda sw, feeders=(): types.SimpleNamespace(is_switch=sw, feeders=list(feeders))  # noqa: E731
    ctl = types.SimpleNamespace(queues={("leaf1", "h1", 11): q(True, [("h2", "eth0", 11), ("spine1", "leaf1", 11)]),
                                        ("spine1", "leaf1", 11): q(True, [("leaf2", "spine1", 11)]),
                                        ("leaf2", "spine1", 11): q(True, [("h3", "eth0", 11)]),
                                        ("h2", "eth0", 11): q(False), ("h3", "eth0", 11): q(False)})
    without_hosts(ctl)
    assert sorted(ctl.queues) == [("leaf1", "h1", 11), ("leaf2", "spine1", 11), ("spine1", "leaf1", 11)]
    assert ctl.queues[("leaf1", "h1", 11)].feeders == [("spine1", "leaf1", 11)]
    assert ctl.queues[("leaf2", "spine1", 11)].feeders == []


def rates_frame(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["t_s", "host", "peer", "rqpn", "rc_kbps", "rt_kbps", "alpha", "rate_cuts",
                                       "cnp_received", "cnp_ignored"])


def test_the_summary_numbers_come_from_the_counters_and_the_flows_rates():
    counters = pd.DataFrame([("h1", "cnp_sent", 0), ("h1", "cnp_received", 7), ("h1", "rate_cuts", 6),
                             ("h3", "cnp_received", 5), ("h3", "rate_cuts", 5), ("h2", "cnp_sent", 12),
                             ("h2", "ce_seen", 30)], columns=["host", "counter", "value"])
    rows = []
    for i in range(30):  # two senders converging to 10 Mbit/s each; h2's receiving QPs idle at the line rate
        t = 100 + i * 0.1
        rows += [(t, "h1", "h2", 17, 20000 - 300 * i if i < 20 else 10000, 20000, 0.5, i, i, 0),
                 (t, "h3", "h2", 18, 2000 + 400 * i if i < 20 else 10000, 20000, 0.5, i, i, 0),
                 (t, "h2", "h1", 17, 20000, 20000, 1.0, 0, 0, 0)]
    rates = rates_frame(rows)
    assert set(flows(rates)["host"]) == {"h1", "h3"}
    m = dcqcn_metrics(counters, rates)
    assert m["dcqcn_cnp_sent"] == 12 and m["dcqcn_rate_cuts"] == 11
    assert m["dcqcn_cnp_received_by_host"] == "h1=7; h3=5" and m["dcqcn_ce_seen"] == 30
    assert m["dcqcn_flows"] == 2 and m["dcqcn_rate_kbps_min"] == 2000
    assert m["dcqcn_rate_kbps_last_mean"] == 10000
    assert m["dcqcn_jain_last"] == pytest.approx(1.0)
    assert jain_last(rates.iloc[:30]) < 0.9  # the first second: far apart


def test_a_run_without_a_cnp_still_has_its_lowest_rate_the_line_rate():
    """K above every queue's peak: no QP got a CNP, so no flow; the lowest rate is still reported (every mapped QP
    at the line rate), so a lab statement on it has its metric (lab 17's K above XOFF saw 2-8 CNPs a run)."""
    counters = pd.DataFrame([("h1", "cnp_sent", 0), ("h3", "rate_cuts", 0)], columns=["host", "counter", "value"])
    rates = rates_frame([(100 + i * 0.1, h, "h2", q, 20000, 20000, 1.0, 0, 0, 0)
                         for i in range(5) for h, q in (("h1", 17), ("h3", 18))])
    m = dcqcn_metrics(counters, rates)
    assert m["dcqcn_flows"] == 0 and m["dcqcn_rate_kbps_min"] == 20000 and "dcqcn_rate_kbps_last_mean" not in m


def test_no_counters_no_numbers():
    assert dcqcn_metrics(pd.DataFrame(columns=["host", "counter", "value"]), rates_frame([])) == {}


def test_a_run_directory_with_the_two_files_loads_them_with_their_schemas(tmp_path):
    (tmp_path / "manifest.json").write_text('{"complete": true}')
    (tmp_path / "dcqcn.csv").write_text("host,counter,value\nh1,rate_cuts,4\n")
    (tmp_path / "dcqcn_rates.csv").write_text("t_s,host,peer,rqpn,rc_kbps,rt_kbps,alpha,rate_cuts,cnp_received,"
                                              "cnp_ignored\n1.5,h1,h2,17,1000,2000,0.25,4,5,1\n")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = load_run(tmp_path)
    assert run.dcqcn["value"].dtype == "int64" and run.dcqcn_rates["alpha"].dtype == "float64"
    assert dcqcn_metrics(run.dcqcn, run.dcqcn_rates)["dcqcn_rate_kbps_min"] == 1000


class FakeQdisc(dict):
    def get_attr(self, name):
        return self.get(name)


class FakeIpr:
    """Two drop-tail leaves under HTB 1:; replacing the second by fq fails (the kernel refusing it)."""

    def __init__(self):
        self.calls: list[tuple] = []

    def get_qdiscs(self, index):
        return [FakeQdisc(parent=0xFFFFFFFF, handle=0x10000, TCA_KIND="htb"),
                *(FakeQdisc(parent=0x10000 | c, handle=(0x10 + c) << 16, TCA_KIND="bfifo",
                            TCA_OPTIONS={"limit": 30000}) for c in (1, 2))]

    def tc(self, command, kind=None, **kw):
        self.calls.append((command, kind, kw.get("parent"), kw.get("handle")))
        if kind == "fq" and kw.get("parent") == 0x10002:
            raise OSError("EINVAL")


def test_a_failed_fq_leaf_puts_back_the_leaves_fq_already_replaced():
    from testbed.kernel.dcqcn import _fq_leaves

    ipr = FakeIpr()
    with pytest.raises(OSError):
        _fq_leaves(ipr, 3)
    assert ipr.calls == [("replace", "fq", 0x10001, None), ("replace", "fq", 0x10002, None),
                         ("replace", "bfifo", 0x10001, 0x110000)]  # the first leaf's bfifo back, its handle too


def test_jain_last_leaves_out_the_bins_where_the_flows_were_idle():
    rows = []
    for i in range(80):  # 2 s sending apart (16 vs 4 Mbit/s, cut after cut), then 6 s idle, both frozen at R_min
        t, n = i * 0.1, min(i, 20)
        a, b = (16000 - 100 * (i % 2), 4000 + 100 * (i % 2)) if i < 20 else (2000, 2000)
        rows += [(t, "h1", "h3", 17, a, 20000, 0.5, n, n, 0), (t, "h2", "h3", 18, b, 20000, 0.5, n, n, 0)]
    rates = rates_frame(rows)
    assert not sending(flows(rates)).iloc[-10:].any() and sending(flows(rates)).iloc[2:40].all()
    assert list(jain_sending(rates)["t_s"]) == [0.0, 0.5, 1.0, 1.5, 2.0]  # 2.0: the cut to R_min, then nothing
    assert jain_last(rates) < 0.9  # the frozen R_min bins (1.0) would have read as perfectly fair
    assert dcqcn_metrics(pd.DataFrame([("h1", "rate_cuts", 20)], columns=["host", "counter", "value"]),
                         rates)["dcqcn_jain_last"] == pytest.approx(jain_last(rates))


class FqIpr:
    """One fq under each of two HTB classes, with drops and fq's own stats (throttled 7/5, flows_plimit 1/0)."""

    def __init__(self):
        self.replaced: list[str] = []

    def get_qdiscs(self, index):
        def fq(parent, drops, throttled, plimit):
            app = (bytes(24) + throttled.to_bytes(8, "little") + plimit.to_bytes(8, "little") + bytes(64))
            s2 = FakeQdisc(TCA_STATS_QUEUE={"drops": drops}, TCA_STATS_APP=":".join(f"{b:02x}" for b in app))
            return FakeQdisc(parent=parent, handle=0x80000000 | parent, TCA_KIND="fq", TCA_STATS2=s2)
        if self.replaced:  # the leaves are back: fresh bfifos, zero counters
            return [FakeQdisc(parent=0x10010, handle=0x100000, TCA_KIND="bfifo")]
        return [FakeQdisc(parent=0xFFFFFFFF, handle=0x10000, TCA_KIND="htb"), fq(0x10010, 3, 7, 1),
                fq(0x10011, 2, 5, 0)]

    def tc(self, command, kind=None, **kw):
        if command == "replace":
            self.replaced.append(kind)


def test_fq_counters_are_read_before_the_leaf_queues_come_back(monkeypatch):
    import contextlib

    from testbed.kernel import dcqcn as kd

    ipr = FqIpr()
    monkeypatch.setattr(kd.netns, "ipr_in", lambda ns: contextlib.nullcontext(ipr))
    d = kd.Dcqcn("ns", "eth0", 2, None, types.SimpleNamespace(close=lambda: None),
                 [kd.Leaf(0x10010, 0x100000, "bfifo", 30000)])
    assert d.fq_stats() == {"fq_drops": 5, "fq_throttled": 12, "fq_flows_plimit": 1}
    d.fq = {}
    d.close()
    assert ipr.replaced[-1] == "bfifo" and d.fq_stats() == {"fq_drops": 5, "fq_throttled": 12, "fq_flows_plimit": 1}
    assert kd._fq_xstats(None) == {"fq_throttled": 0, "fq_flows_plimit": 0}
