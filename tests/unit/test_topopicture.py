"""The topology picture (analysis.topopicture) and `testbed draw`, on hand-made run directories: the tiers of a
2x2 leaf-spine, a dumbbell and a graph whose tiers do not name hosts, which ports are hottest, colours that follow
the values, and the command's one-line refusals (exit status 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.text import Annotation, Text

from analysis.load import load_run
from analysis.topopicture import (PORT_CMAP, draw_topology, figure, hottest, layout, picture, port_values)
from testbed.cli import main as cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
QUEUE_HEADER = "t_s,node,port,class,backlog_bytes,backlog_packets,drops,marks,sent_bytes,sent_packets,overlimits"


def _leafspine_ports() -> list[tuple[str, str, str, str]]:
    rows = []
    for h, leaf in (("h1", "leaf1"), ("h2", "leaf1"), ("h3", "leaf2"), ("h4", "leaf2")):
        rows += [(h, "eth0", leaf, "host_nic"), (leaf, h, h, "leaf_down")]
    for leaf in ("leaf1", "leaf2"):
        for spine in ("spine1", "spine2"):
            rows += [(leaf, spine, spine, "leaf_up"), (spine, leaf, leaf, "spine")]
    return rows


def _dumbbell_ports() -> list[tuple[str, str, str, str]]:
    rows = []
    for h in ("h1", "h2", "h3"):
        rows += [(h, "eth0", "s1", "host_nic"), ("s1", h, h, "switch")]
    return rows + [("s1", "s2", "s2", "bottleneck"), ("s2", "s1", "s1", "switch"),
                   ("r1", "eth0", "s2", "host_nic"), ("s2", "r1", "r1", "switch")]


def _run_dir(path: Path, ports, samples, *, queues_topology=None, write_queues=True) -> Path:
    """A run directory: manifest, ports.csv and queues.csv with ``samples`` = {(node, port): [(t, bytes, pkts,
    drops, marks), ...]} (class 1:10)."""
    path.mkdir(parents=True)
    topo = {"kind": "test"} if queues_topology is None else {"kind": "test", "queues": queues_topology}
    (path / "manifest.json").write_text(json.dumps({"scenario": "test", "complete": True, "topology": topo}))
    (path / "summary.json").write_text(json.dumps({"sampler_interval_ms": 1.0}))
    if ports is not None:
        (path / "ports.csv").write_text("node,port,peer,tier,rate_mbps\n"
                                        + "".join(f"{n},{p},{peer},{t},10.0\n" for n, p, peer, t in ports))
    if write_queues:
        lines = [QUEUE_HEADER]
        for (node, port), rows in samples.items():
            lines += [f"{t},{node},{port},1:10,{b},{k},{d},{m},0,0,0" for t, b, k, d, m in rows]
        (path / "queues.csv").write_text("\n".join(lines) + "\n")
    return path


def _incast_like(tmp_path: Path) -> Path:
    """leaf2 -> h3 the hottest (peak 60000 B of a 64000 B buffer, 40 drops), spine1 -> leaf2 next, leaf1 -> spine1
    idle; the rest of the ports not sampled."""
    tiers = {"host_nic": {"buffer_bytes": 262144}, "leaf_down": {"buffer_bytes": 64000},
             "leaf_up": {"buffer_bytes": 262144}, "spine": {"buffer_bytes": 262144}}
    return _run_dir(tmp_path / "incast", _leafspine_ports(), queues_topology=tiers, samples={
        ("leaf2", "h3"): [(1.0, 1000, 1, 0, 0), (1.1, 60000, 40, 10, 0), (1.2, 20000, 14, 40, 0)],
        ("spine1", "leaf2"): [(1.0, 0, 0, 0, 0), (1.1, 15000, 10, 0, 3), (1.2, 3000, 2, 0, 5)],
        ("leaf1", "spine1"): [(1.0, 0, 0, 0, 0), (1.1, 0, 0, 0, 0), (1.2, 0, 0, 0, 0)],
    })


def test_leafspine_tiers_hosts_under_their_leaf_spines_on_top(tmp_path):
    lay = layout(load_run(_incast_like(tmp_path)).ports)
    assert lay.order == [["h1", "h2", "h3", "h4"], ["leaf1", "leaf2"], ["spine1", "spine2"]]
    assert {v: lay.tier[v] for v in ("h1", "leaf2", "spine1")} == {"h1": 0, "leaf2": 1, "spine1": 2}
    x = {v: xy[0] for v, xy in lay.xy.items()}
    assert x["leaf1"] == pytest.approx((x["h1"] + x["h2"]) / 2)  # a leaf over its hosts
    assert x["spine1"] < x["spine2"] and x["spine1"] != x["spine2"]  # same barycentre: spread, not stacked
    assert len(lay.links) == 8 and ("leaf1", "spine2") in lay.links
    assert layout(load_run(tmp_path / "incast").ports) == lay  # deterministic


def test_dumbbell_tiers_switches_side_by_side(tmp_path):
    run = load_run(_run_dir(tmp_path / "d", _dumbbell_ports(), {("s1", "s2"): [(1.0, 5000, 4, 0, 0)]}))
    lay = layout(run.ports)
    assert lay.order == [["h1", "h2", "h3", "r1"], ["s1", "s2"]]
    assert lay.xy["s1"][0] == pytest.approx(np.mean([lay.xy[h][0] for h in ("h1", "h2", "h3")]))
    assert lay.xy["s2"][0] == pytest.approx(lay.xy["r1"][0])


def test_a_graph_without_host_tiers_finds_hosts_by_their_single_port(tmp_path):
    """A Mininet Topo's graph names every tier `port`: hosts are the nodes with one port; tiers by hops."""
    links = [("h1", "a"), ("a", "b"), ("b", "c"), ("c", "h2"), ("x", "b")]  # x: a switch hanging off b
    ports = []
    for u, v in links:
        ports += [(u, f"{u}-eth{v}", v, "port"), (v, f"{v}-eth{u}", u, "port")]
    ports = [p for p in ports if p[0] != "x"] + [("x", "x-eth0", "b", "port"), ("x", "x-eth1", "b", "port")]
    lay = layout(load_run(_run_dir(tmp_path / "g", ports, {})).ports)
    assert lay.hosts == ["h1", "h2"]
    assert (lay.tier["a"], lay.tier["c"], lay.tier["b"], lay.tier["x"]) == (1, 1, 2, 3)
    fig = figure(picture(load_run(_run_dir(tmp_path / "g2", ports, {("x", "x-eth1"): [(1.0, 500, 1, 0, 0)]}))))
    drawn = np.vstack([c.get_offsets() for c in fig.axes[0].collections[-2:]])  # unsampled and sampled ports
    assert len(drawn) == len(ports)  # every port drawn once; x's two ports to b (parallel links) apart:
    assert len({tuple(np.round(xy, 6)) for xy in drawn}) == len(ports)


def test_hottest_ports_and_values_per_metric(tmp_path):
    run = load_run(_incast_like(tmp_path))
    backlog = port_values(run.queues, run.ports, "backlog").set_index(["node", "port"])["value"]
    assert backlog[("leaf2", "h3")] == 60000 and backlog[("spine1", "leaf2")] == 15000
    assert np.isnan(backlog[("h1", "eth0")])  # not sampled is not zero
    drops = port_values(run.queues, run.ports, "drops").set_index(["node", "port"])["value"]
    assert drops[("leaf2", "h3")] == 40 and drops[("spine1", "leaf2")] == 0
    hot = hottest(port_values(run.queues, run.ports, "backlog"))
    assert list(zip(hot["node"], hot["port"])) == [("leaf2", "h3"), ("spine1", "leaf2")]  # idle ports left out
    marks = hottest(port_values(run.queues, run.ports, "marks"), k=1)
    assert list(zip(marks["node"], marks["port"], marks["value"])) == [("spine1", "leaf2", 5.0)]


def test_classes_are_summed_at_each_sample(tmp_path):
    path = _incast_like(tmp_path)
    with open(path / "queues.csv", "a") as f:  # a second class on leaf2 -> h3: 30000 B at t=1.2 (sum 50000 < 60000)
        f.write("1.2,leaf2,h3,1:20,30000,20,0,0,0,0,0\n1.3,leaf2,h3,1:20,70000,50,0,0,0,0,0\n")
    run = load_run(path)
    v = port_values(run.queues, run.ports, "backlog").set_index(["node", "port"])["value"]
    assert v[("leaf2", "h3")] == 70000


def test_colours_follow_the_values(tmp_path):
    pic = picture(load_run(_incast_like(tmp_path)), "backlog")
    fig = figure(pic)
    fig.canvas.draw()  # maps the values to colours as saving does
    ports = [c for ax in fig.axes for c in ax.collections if c.get_gid() == "ports"]
    assert len(ports) == 1
    seen = pic.ports["value"].dropna().to_numpy()
    assert len(ports[0].get_offsets()) == len(seen) == 3  # the unsampled ports are drawn apart, hollow
    face = ports[0].get_facecolors()
    cmap, vmax = colormaps[PORT_CMAP], seen.max()
    assert np.allclose(face, [cmap(v / vmax) for v in seen])
    lum = face[:, :3] @ [0.299, 0.587, 0.114]  # hotter is darker
    assert list(np.argsort(lum)) == list(np.argsort(-seen))
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "leaf2\u2192h3: 59 KiB (94% of buffer)" in texts and "spine1\u2192leaf2: 15 KiB (6% of buffer)" in texts
    assert "peak backlog" in pic.title and "1.0 ms" in pic.title
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(a, renderer) for a in fig.axes[0].texts if isinstance(a, Annotation)]
    assert len(boxes) == 2 and not boxes[0].overlaps(boxes[1])  # labels never cover each other
    assert "peak backlog (KiB)" in fig.axes[1].get_ylabel()  # the colour bar, an axes of its own


def test_queues_sized_in_packets_are_drawn_in_packets(tmp_path):
    run = load_run(_run_dir(tmp_path / "p", _dumbbell_ports(), {("s1", "s2"): [(1.0, 9000, 6, 0, 0)]},
                            queues_topology={"bottleneck": {"buffer_packets": 20}, "switch": {"buffer_packets": 20}}))
    pic = picture(run, "backlog")
    assert pic.by == "packets" and pic.ports.set_index(["node", "port"])["value"][("s1", "s2")] == 6


def test_a_large_fabric_names_only_the_hottest_hosts(tmp_path):
    ports = []
    for i in range(1, 65):
        leaf = f"leaf{(i - 1) // 8 + 1}"
        ports += [(f"h{i}", "eth0", leaf, "host_nic"), (leaf, f"h{i}", f"h{i}", "leaf_down")]
    for l in range(1, 9):
        for s in range(1, 5):
            ports += [(f"leaf{l}", f"spine{s}", f"spine{s}", "leaf_up"), (f"spine{s}", f"leaf{l}", f"leaf{l}", "spine")]
    samples = {(f"leaf{(i - 1) // 8 + 1}", f"h{i}"): [(1.0, 100 * i, 1, 0, 0)] for i in range(1, 65)}
    run = load_run(_run_dir(tmp_path / "big", ports, samples))
    fig = figure(picture(run))
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"h64", "h60", "spine4", "leaf8"} <= texts and "h1" not in texts and "h59" not in texts
    assert draw_topology(run.path, tmp_path / "big.png").read_bytes().startswith(PNG_MAGIC)


def test_draw_topology_for_the_report(tmp_path):
    path = draw_topology(_incast_like(tmp_path), tmp_path / "out" / "topology.png")
    assert path is not None and path.read_bytes().startswith(PNG_MAGIC)
    bare = _run_dir(tmp_path / "bare", _leafspine_ports(), {}, write_queues=False)
    assert draw_topology(bare, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_cli_draws_a_run(tmp_path, capsys):
    run = _incast_like(tmp_path)
    assert cli(["draw", str(run)]) == 0
    assert (run / "topology-backlog.png").read_bytes().startswith(PNG_MAGIC)
    out = tmp_path / "pics" / "drops.svg"
    assert cli(["draw", str(run), "--by", "drops", "--out", str(out)]) == 0
    assert "<svg" in out.read_text()[:500]
    assert capsys.readouterr().out.split() == [str(run / "topology-backlog.png"), str(out)]


@pytest.mark.parametrize("case, expect", [
    ("missing", "no such run directory"),
    ("no_manifest", "no manifest.json"),
    ("no_ports", "no ports.csv"),
    ("no_queues", "no queues.csv"),
    ("empty_queues", "no queue samples"),
    ("bad_suffix", "name a .png, .svg or .pdf file"),
    ("out_is_dir", "is a directory"),
    ("bad_by", "invalid choice"),
])
def test_cli_refuses_bad_input_in_one_line(tmp_path, capsys, case, expect):
    run = tmp_path / "run"
    args = ["draw", str(run)]
    if case == "no_manifest":
        run.mkdir()
    elif case == "no_ports":
        _run_dir(run, None, {("leaf1", "h1"): [(1.0, 1, 1, 0, 0)]})
    elif case == "no_queues":
        _run_dir(run, _leafspine_ports(), {}, write_queues=False)
    elif case == "empty_queues":
        _run_dir(run, _leafspine_ports(), {})
    elif case != "missing":
        _incast_like(tmp_path).rename(run)
        args += {"bad_suffix": ["--out", str(tmp_path / "pic.txt")], "out_is_dir": ["--out", str(tmp_path)],
                 "bad_by": ["--by", "heat"]}[case]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    try:
        status = cli(args)
    except SystemExit as e:  # argparse's own refusals (OneLineErrorParser)
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and expect in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written
