"""The queue plot's references on hand-made runs (analysis.references, analysis.queueplot): each port's limits are
its own queue's (a 64 kB leaf_down buffer is not drawn on a 256 kB uplink), a port whose buffer is in packets is
drawn in packets, PFC XOFF/XON only on the queue that crossed them, drops / marks / pauses / RTOs ticked on the port
they belong to, and the alpha-beta bound read from sweep.csv or summary.json."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import queueplot, references
from analysis.load import load_run
from tests.unit.test_report_story import QCOLS, incast_run, manifest


def _topology(run: Path, queues: dict, classes=None, ports=()) -> None:
    m = json.loads((run / "manifest.json").read_text())
    m["topology"] = {"kind": "leafspine", "queues": queues, "classes": classes, "ports": list(ports)}
    (run / "manifest.json").write_text(json.dumps(m))
    pd.DataFrame([("h1", "eth0", "leaf1", "host_nic", 20.0), ("leaf1", "h1", "h1", "leaf_down", 20.0),
                  ("leaf1", "spine1", "spine1", "leaf_up", 40.0), ("spine1", "leaf1", "leaf1", "spine", 40.0)],
                 columns=["node", "port", "peer", "tier", "rate_mbps"]).to_csv(run / "ports.csv", index=False)


TIERS = {"host_nic": {"discipline": "droptail", "buffer_bytes": 262144, "avpkt_bytes": 1500},
         "leaf_down": {"discipline": "droptail", "buffer_bytes": 64000, "avpkt_bytes": 1500},
         "leaf_up": {"discipline": "step", "buffer_bytes": 262144, "k_bytes": 30000, "avpkt_bytes": 1500},
         "spine": {"discipline": "droptail", "buffer_packets": 100, "avpkt_bytes": 1000}}


def test_each_port_gets_its_own_queues_limits(tmp_path):
    run = incast_run(tmp_path / "i")
    _topology(run, TIERS, ports=[{"port": "leaf1:h1", "queue": {"discipline": "red", "buffer_bytes": 50000,
                                                                  "min_bytes": 10000, "max_bytes": 30000}}])
    lim = references.port_limits(load_run(run), ["leaf1:h1", "leaf1:spine1", "spine1:leaf1", "h1:eth0"])
    assert lim["leaf1:h1"].lines == [("buffer", 50000.0), ("RED min", 10000.0), ("RED max", 30000.0)]  # override
    assert lim["leaf1:spine1"].lines == [("buffer", 262144.0), ("ECN K", 30000.0)]
    assert (lim["spine1:leaf1"].unit, lim["spine1:leaf1"].lines) == ("packets", [("buffer", 100.0)])
    assert lim["h1:eth0"].lines == [("buffer", 262144.0)] and lim["h1:eth0"].source == "topology"
    # without a topology description: the parameters' buffer on every port, said to be the run's, not the port's
    bare = references.port_limits(load_run(incast_run(tmp_path / "bare")), ["leaf1:h1"])["leaf1:h1"]
    assert (bare.lines, bare.source) == ([("buffer", 16000.0)], "parameters")


def test_pfc_levels_only_on_the_queue_that_crossed_them(tmp_path):
    run = incast_run(tmp_path / "p")
    _topology(run, TIERS, classes=[{"name": "rdma", "lossless": True, "xoff_bytes": 15000, "xon_bytes": 7500}])
    (run / "pfc.csv").write_text("t_s,node,port,prio,event,backlog_bytes\n100.02,leaf1,h1,3,above_xoff,15140\n"
                                 "100.021,h1,eth0,3,xoff,0\n100.05,leaf1,h1,3,below_xon,7000\n100.051,h1,eth0,3,xon,0\n")
    r = load_run(run)
    lim = references.port_limits(r, ["leaf1:h1", "h1:eth0", "spine1:leaf1"])
    assert lim["leaf1:h1"].lines == [("buffer", 64000.0), ("PFC XOFF", 15000.0), ("PFC XON", 7500.0)]
    for quiet in ("h1:eth0", "spine1:leaf1"):  # the paused feeder and a port PFC never acted at
        assert [k for k, _ in lim[quiet].lines] == ["buffer"], quiet
    ticks = references.queue_ticks(r)
    pauses = ticks[ticks["kind"] == "pause"]
    assert list(zip(pauses["t_s"], pauses["port"])) == [(100.02, "leaf1:h1"), (100.021, "h1:eth0")]


def test_ticks_name_their_port_and_rto_rounds_tick_where_the_sender_finished(tmp_path):
    r = load_run(incast_run(tmp_path / "i"))
    ticks = references.queue_ticks(r)
    rto = ticks[ticks["kind"] == "rto"]
    ends = r.rounds[r.rounds["round"].isin([2, 5, 7]) & (r.rounds["sender"] == "h5")]["end_s"].tolist()
    assert rto["t_s"].tolist() == pytest.approx(ends) and set(rto["port"]) == {"leaf1:h1"}
    assert set(ticks.loc[ticks["kind"] == "drops", "port"]) == {"leaf1:h1"}
    panels = queueplot.queue_panels(r.queues, ["leaf1:h1", "spine1:leaf1"],
                                    references.port_limits(r, ["leaf1:h1", "spine1:leaf1"]), ticks)
    hot, quiet = panels
    assert set(hot["ticks"]) == {"drops", "rto"} and len(hot["ticks"]["rto"]) == 3
    assert quiet["ticks"] == {}  # the quiet port gets none of the hot port's events
    assert hot["lines"] == [("buffer", 16.0)] and hot["unit"] == "kB" and hot["ylim"] == pytest.approx(20.0)


def test_a_packet_sized_queue_is_drawn_in_packets(tmp_path):
    run = incast_run(tmp_path / "k")
    _topology(run, {**TIERS, "leaf_down": {"discipline": "step", "buffer_packets": 40, "k_packets": 12,
                                           "avpkt_bytes": 1500}})
    r = load_run(run)
    lim = references.port_limits(r, ["leaf1:h1", "spine1:leaf1"])
    assert (lim["leaf1:h1"].unit, lim["leaf1:h1"].lines) == ("packets", [("buffer", 40.0), ("ECN K", 12.0)])
    p, other = queueplot.queue_panels(r.queues, ["leaf1:h1", "spine1:leaf1"], lim)
    assert p["unit"] == "packets" and set(p["y"]) == {5.0} and p["lines"] == [("buffer", 40.0), ("ECN K", 12.0)]
    # a packet-sized spine queue (avpkt 1000 B) keeps its unit; a byte-sized one is drawn in kB
    assert other["unit"] == "packets" and other["lines"] == [("buffer", 100.0)]
    png = queueplot.plot_queue_ports(r.queues, tmp_path / "q.png", ports=["leaf1:h1", "spine1:leaf1"], limits=lim,
                                     ticks=references.queue_ticks(r), t0=100.0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_alpha_beta_bound_from_sweep_or_summary(tmp_path):
    run = tmp_path / "c"
    manifest(run, "collective", {"ranks": 3}, {"bound_ms": 41.5})
    pd.DataFrame(columns=QCOLS).to_csv(run / "queues.csv", index=False)
    assert references.op_bounds_ms(load_run(run)) == {"*": 41.5}
    pd.DataFrame({"op": ["grad", "big"], "bound_us": [12000.0, float("nan")]}).to_csv(run / "sweep.csv", index=False)
    assert references.op_bounds_ms(load_run(run)) == {"grad": 12.0}
    (run / "summary.json").write_text("{}")
    (run / "sweep.csv").unlink()
    assert references.op_bounds_ms(load_run(run)) == {}


def test_the_op_time_cdf_draws_the_bound(tmp_path):
    from analysis.report import write_report
    from tests.unit.test_report_story import collective_run

    run = collective_run(tmp_path / "c")
    s = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**s, "bound_ms": 18.0}))
    _, md = write_report(run)
    assert "Collective completion time CDF (vertical lines: alpha-beta bound: the time no network could beat)" in \
        md.read_text()
