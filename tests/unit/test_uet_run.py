"""UET and trimming as run options, their pure parts: trim=auto resolved, what trimming cannot work with refused
before anything is built (one line, exit status 2 from the CLI), each switch port's buffer and threshold, and
analysis.uet's numbers from the raw files a run writes (uet.csv, trim.csv)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.load import load_csv, load_run
from analysis.metricnames import known
from analysis.uet import trim_metrics, uet_metrics
from testbed.errors import UsageError
from testbed.kernel.qdisc import LeafQueue
from testbed.network.portplan import PortPlan
from testbed.workloads.trimming import (check_run, port_buffer_bytes, port_problem, spec_switch_ports, switch_ports,
                                       threshold_for, trim_wanted)
from topologies import QueueSpec, uniform_leaf_spine


def plan(node: str, queue: LeafQueue, mtu: int = 1500) -> PortPlan:
    return PortPlan(node, "p", "x", "q", "leaf", 20.0, mtu, ((0x10, "1:10", queue, 0, 1.0, frozenset()),), 0x10)


@pytest.mark.parametrize("p, on", [
    ({"transport": "uet"}, True),
    ({"transport": "tcp"}, False),
    ({"transport": "uet", "pfc": "on"}, False),
    ({"transport": "uet", "load_balancing": "spray"}, False),
    ({"transport": "uet", "trim": "off"}, False),
    ({"transport": "uet", "trim": "on"}, True),
])
def test_auto_trims_uet_on_lossy_ecmp_ports_only(p, on):
    assert trim_wanted(p) is on


@pytest.mark.parametrize("p, words", [
    ({"trim": "on", "transport": "tcp"}, "trim=on needs transport=uet"),
    ({"trim": "on", "transport": "uet", "pfc": "on"}, "needs lossy ports"),
    ({"trim": "on", "transport": "uet", "load_balancing": "flowlet"}, "needs load_balancing=ecmp"),
])
def test_what_cannot_work_is_refused_in_one_line(p, words):
    with pytest.raises(UsageError) as e:
        check_run(p)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_port_problem_is_one_line_naming_the_port_and_none_for_a_port_that_can_trim():
    """The wording of both port refusals, asserted here only (check_run, TrimRun.install and the CLI say it)."""
    fine = plan("leaf1", LeafQueue("bfifo", 12_000))
    assert port_problem(fine, 0) is None and port_problem(fine, 12_000) is None
    assert port_problem(fine, 12_001) == ("trim_threshold_bytes (12001) is above the buffer of switch port leaf1:p "
                                          "(12000 bytes): the queue never reaches it")
    two = PortPlan("leaf1", "p", "x", "q", "leaf", 20.0, 1500, (*fine.classes, (0x20, "1:20", fine.classes[0][2], 0,
                                                                               1.0, frozenset())), 0x10)
    assert port_problem(two, 0) == ("trimming needs single-class switch ports (port leaf1:p has 2 classes; its "
                                    "threshold is the default class's buffer, and UET's DSCP may pick another): use "
                                    "a topology without classes, or trim=off")


def _refusal(p: dict, spec) -> str:
    with pytest.raises(UsageError) as e:
        check_run(p, spec)
    return str(e.value)


def test_a_threshold_above_a_switch_port_buffer_is_refused_and_half_the_buffer_is_the_default():
    spec = uniform_leaf_spine(1, 2, 1, 20.0, 20.0, switch_queue=QueueSpec("droptail", buffer_bytes=12_000),
                              host_queue=QueueSpec("droptail", buffer_bytes=64_000))
    check_run({"transport": "uet", "trim_threshold_bytes": 12_000}, spec)
    first = spec_switch_ports(spec)[0]
    assert _refusal({"transport": "uet", "trim_threshold_bytes": 12_001}, spec) == port_problem(first, 12_001)
    check_run({"transport": "tcp", "trim_threshold_bytes": 99_999}, spec)  # no trimming: nothing to check
    assert threshold_for(plan("leaf1", LeafQueue("bfifo", 12_000)), 0) == 6_000
    assert threshold_for(plan("leaf1", LeafQueue("bfifo", 12_000)), 4_000) == 4_000


def test_trimming_ports_with_several_classes_is_refused():
    from topologies import ClassSpec, LeafSpineSpec, LinkSpec

    spec = LeafSpineSpec(spines=1, leaves=2, hosts_per_leaf=1, host_link=LinkSpec(20), fabric_link=LinkSpec(20),
                         classes=(ClassSpec("bulk", dscp=[0], weight=1, default=True),
                                  ClassSpec("fast", dscp=[26], weight=1)))
    first = spec_switch_ports(spec)[0]
    assert len(first.classes) == 2
    assert _refusal({"transport": "uet", "trim": "on"}, spec) == port_problem(first, 0)
    check_run({"transport": "uet", "trim": "off"}, spec)


def test_install_refuses_a_port_that_cannot_trim_before_loading_anything():
    """The Lab API's guard (lab.trim() skips check_run): the same message, raised before any program is loaded."""
    from types import SimpleNamespace

    from testbed.workloads.trimming import LAB_NAMES, TrimRun

    ports = [plan("leaf1", LeafQueue("bfifo", 64_000)), plan("spine1", LeafQueue("bfifo", 12_000))]
    fabric = SimpleNamespace(port_plans=ports, role={"leaf1": "leaf", "spine1": "spine"})
    run = TrimRun(fabric, None, threshold_bytes=12_001)
    with pytest.raises(UsageError) as e:
        run.install()
    assert str(e.value) == port_problem(ports[1], 12_001, LAB_NAMES) and run.loaded == {}
    assert str(e.value).startswith("lab.trim()'s threshold_bytes (12001) is above")  # the name its caller used


class _FakeTrimmer:
    """A loaded program's stand-in: its counters as ktrim.Trimmer.stats() returns them."""

    def __init__(self, stats: dict[str, int]):
        self._s, self.created_clsact = stats, False

    def stats(self) -> dict[str, int]:
        return dict(self._s)

    def close(self) -> None:
        pass


class _FakeRunDir:
    def __init__(self, path):
        self.path = path

    def write_csv(self, name, columns, rows):
        pd.DataFrame([tuple(r) for r in rows], columns=columns).to_csv(self.path / name, index=False)
        return self.path / name


def test_finish_writes_each_ports_limits_and_leaves_the_empty_case_to_trim_metrics(tmp_path):
    from types import SimpleNamespace

    from testbed.workloads.trimming import TrimRun

    ports = [plan("leaf1", LeafQueue("bfifo", 64_000)), plan("spine1", LeafQueue("bfifo", 12_000))]
    run = TrimRun(SimpleNamespace(port_plans=ports, role={"leaf1": "leaf", "spine1": "spine"}), _FakeRunDir(tmp_path))
    for pl, (trimmed, peak) in zip(ports, ((7, 40_000), (0, 1_000))):
        key = (pl.node, pl.ifname)
        run.loaded[key] = (1, _FakeTrimmer({"trimmed_packets": trimmed, "vq_peak_bytes": peak}))
        run.limits[key] = {"threshold_bytes": threshold_for(pl, 0), "buffer_bytes": port_buffer_bytes(pl)}
    s = run.finish()
    rows = load_csv(tmp_path / "trim.csv", "trim")
    limits = rows[rows["counter"].isin(["threshold_bytes", "buffer_bytes"])]
    assert sorted(limits["value"]) == [6_000, 12_000, 32_000, 64_000] and run.loaded == {}
    assert (s["uet_trim_threshold_bytes_min"], s["uet_trim_threshold_bytes_max"]) == (6_000, 32_000)
    assert s == {**trim_metrics(rows), "uet_trim": "on"} and s["uet_trim_ports_at_threshold"] == 1
    none = TrimRun(SimpleNamespace(port_plans=[], role={}), _FakeRunDir(tmp_path)).finish()
    assert none == {"uet_trim": "on"}  # no port: no threshold, rather than a made-up 0


def test_a_pfifo_buffer_counts_mtu_frames_and_hosts_do_not_trim():
    assert port_buffer_bytes(plan("s", LeafQueue("pfifo", 10))) == 15_140
    assert port_buffer_bytes(plan("s", LeafQueue("bfifo", 8_000))) == 8_000
    plans = [plan("h1", LeafQueue("bfifo", 1)), plan("leaf1", LeafQueue("bfifo", 1))]
    assert [p.node for p in switch_ports(plans, {"h1": "host", "leaf1": "leaf"})] == ["leaf1"]


def _first_port_problem(spec, threshold_bytes: int) -> str:
    return next(filter(None, (port_problem(pl, threshold_bytes) for pl in spec_switch_ports(spec))))


@pytest.mark.parametrize("sets, want", [
    (["trim=on"], lambda spec: _refusal({"trim": "on", "transport": "tcp"}, None)),
    (["transport=uet", "trim_threshold_bytes=99999999"], lambda spec: _first_port_problem(spec, 99_999_999)),
    (["entropy_values=64"], lambda spec: "entropy_values=64 needs transport=uet (with transport=tcp a connection "
                                         "keeps its one source port)"),
    (["uet_loss_rule=rack"], lambda spec: "uet_loss_rule=rack needs transport=uet"),
    (["transport=uet", "uet_loss_rule=path", "load_balancing=spray"],
     lambda spec: "uet_loss_rule=path assumes one path per entropy value, which load_balancing=spray does not keep "
                  "(use auto or rack)"),
])
def test_the_cli_refuses_what_cannot_trim_in_that_one_line_with_exit_status_2(sets, want, tmp_path, capsys):
    """In-process (the runner's imports are paid once for both cases, not by a new interpreter each)."""
    from scenarios import incast
    from testbed.cli import main
    from testbed.params import resolve
    from testbed.workloads.bottleneck import build_spec

    out = tmp_path / "never"
    assert main(["run", "incast", *[a for s in sets for a in ("--set", s)], "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"testbed: {want(build_spec(resolve(incast.PARAMS, sets))[0])}"]
    assert not out.exists()


UET_ROWS = pd.DataFrame([
    (0, "r1", "acks_sent", 40), (0, "r1", "trimmed_received", 7),
    (1, "s1", "data_packets", 20), (1, "s1", "retransmitted_packets", 5), (1, "s1", "nacks_received", 4),
    (1, "s1", "nack_retransmits", 4), (1, "s1", "rto_events", 1), (1, "s1", "cc_NACK_DECREASE", 3),
    (2, "s2", "data_packets", 20), (2, "s2", "retransmitted_packets", 3), (2, "s2", "nacks_received", 3),
    (2, "s2", "nack_retransmits", 3), (2, "s2", "retransmitted_bytes", 4200),
], columns=["rank", "host", "counter", "value"])


def test_the_transport_numbers_sum_over_ranks_with_a_per_rank_breakdown():
    m = uet_metrics(UET_ROWS)
    assert (m["uet_data_packets"], m["uet_retransmitted_packets"], m["uet_nacks_received"]) == (40, 8, 7)
    assert m["uet_trimmed_received"] == 7 and m["uet_nack_retransmits"] == 7 and m["uet_rto_events"] == 1
    assert m["uet_retransmitted_bytes"] == 4200 and m["uet_fast_retransmits"] == 0  # absent counters are 0
    assert m["uet_cc_nack_decrease"] == 3
    assert m["uet_rto_events_by_host"] == "s1=1" and m["uet_nacks_received_by_host"] == "s1=4; s2=3"
    assert m["uet_retransmit_fraction"] == pytest.approx(0.2) and m["uet_hosts"] == 3
    assert m["uet_block_mismatches"] == 0
    assert all(known(k) for k in m), [k for k in m if not known(k)]
    assert uet_metrics(UET_ROWS.iloc[0:0]) == {}


def test_trimmed_unanswered_counts_trimmed_headers_no_sender_resent():
    assert uet_metrics(UET_ROWS)["uet_trimmed_unanswered"] == 0  # 7 headers received, 4 + 3 resent on a NACK
    lost_nack = UET_ROWS.copy()
    lost_nack.loc[lost_nack["counter"] == "nack_retransmits", "value"] = [4, 1]
    assert uet_metrics(lost_nack)["uet_trimmed_unanswered"] == 2


def test_the_switch_numbers_sum_over_ports_and_name_the_ports_that_trimmed():
    rows = pd.DataFrame([("s2", "r1", "trimmed_packets", 9), ("s2", "r1", "vq_peak_bytes", 7000),
                         ("s2", "r1", "trimmed_bytes_cut", 9 * 1400), ("s1", "s2", "trimmed_packets", 0),
                         ("s1", "s2", "vq_peak_bytes", 9000)], columns=["node", "port", "counter", "value"])
    m = trim_metrics(rows)
    assert m["uet_trimmed_packets"] == 9 and m["uet_trimmed_bytes_cut"] == 12_600 and m["uet_too_short_to_trim"] == 0
    assert m["uet_trimmed_by_port"] == "s2:r1=9" and m["uet_trim_vq_peak_bytes_max"] == 9000
    assert m["uet_trim_ports"] == 2
    assert all(known(k) for k in m) and known("uet_trim") and known("uet_trim_threshold_bytes_max")
    # a trim.csv written before the ports' limits were in it
    assert "uet_trim_threshold_bytes_min" not in m and "uet_trim_ports_at_threshold" not in m
    assert trim_metrics(rows.iloc[0:0]) == {}
    limits = pd.DataFrame([("s2", "r1", "threshold_bytes", 4000), ("s2", "r1", "buffer_bytes", 8000),
                           ("s1", "s2", "threshold_bytes", 131072), ("s1", "s2", "buffer_bytes", 262144)],
                          columns=rows.columns)
    m = trim_metrics(pd.concat([rows, limits]))
    assert (m["uet_trim_threshold_bytes_min"], m["uet_trim_threshold_bytes_max"]) == (4000, 131072)
    assert m["uet_trimmed_packets"] == 9 and m["uet_trim_ports"] == 2  # the limits are no counters
    assert m["uet_trim_ports_at_threshold"] == 1  # s2:r1 peaked at 7000 over its 4000; s1:s2 stayed below


def test_a_run_directory_with_the_two_files_loads_them_with_their_schemas(tmp_path):
    (tmp_path / "manifest.json").write_text('{"complete": true, "scenario": "incast"}')
    UET_ROWS.to_csv(tmp_path / "uet.csv", index=False)
    (tmp_path / "trim.csv").write_text("node,port,counter,value\ns2,r1,trimmed_packets,9\n")
    run = load_run(tmp_path)
    assert len(run.uet) == len(UET_ROWS) and run.uet["value"].dtype == "int64"
    assert run.trim["value"].tolist() == [9] and uet_metrics(run.uet)["uet_data_packets"] == 40


class _Dir:
    """A run directory's write_csv into a dict (TrafficFiles only writes through it)."""

    def __init__(self, path):
        self.path, self.files = path, {}

    def write_csv(self, name, columns, rows):
        self.files[name] = (list(columns), list(rows))


def test_uet_rows_of_two_bursts_append_and_keep_one_number_per_host():
    from testbed.workloads.handles import TrafficFiles

    files, d = TrafficFiles(), _Dir("/run")
    files.add_uet(d, {"r1": {"trimmed_received": 2}, "s1": {"nack_retransmits": 2}})
    files.add_uet(d, {"r2": {"trimmed_received": 1}, "s1": {"nack_retransmits": 1}})  # another receiver, s1 again
    rows = d.files["uet.csv"][1]
    assert {(r, h) for r, h, _k, _v in rows} == {(0, "r1"), (1, "s1"), (2, "r2")}
    m = uet_metrics(pd.DataFrame(rows, columns=d.files["uet.csv"][0]))
    assert m["uet_nack_retransmits"] == 3 and m["uet_trimmed_unanswered"] == 0 and m["uet_hosts"] == 3


def test_the_loss_rule_a_run_gets_follows_the_fabrics_balancing():
    from traffic.uet_options import loss_rule_for

    assert loss_rule_for("auto", "ecmp") == "path"  # one EV, one 5-tuple, one hashed path: order holds on it
    assert [loss_rule_for("auto", lb) for lb in ("spray", "flowlet", "adaptive")] == ["rack"] * 3
    assert loss_rule_for("rack", "ecmp") == "rack" and loss_rule_for("path", "ecmp") == "path"
