"""Loading topology files (topologies/load.py)."""

import sys

import pytest

from topologies import (ClassSpec, DumbbellSpec, HostTcpSpec, LeafSpineSpec, LinkSpec, QueueSpec, SpecError,
                        dumps_toml, from_dict, load_topology, loads_toml, loads_yaml, to_dict)

EXAMPLE = """
kind = "leafspine"
prefix = "tb"
spines = 2
leaves = 4
hosts_per_leaf = 4
load_balancing = "ecmp"
seed = 7

[host_link]
rate_mbps = 1000
delay_ms = 0.05

[fabric_link]
rate_mbps = 1000
delay_ms = 0.05

[leaf_up_queue]
discipline = "step"
buffer_bytes = 400000
k_packets = 20

[spine_queue]
discipline = "step"
buffer_bytes = 400000
k_packets = 20

[tcp]
congestion_control = "dctcp"
rto_min_ms = 5

[[classes]]
name = "bulk"
dscp = [0]
weight = 1
default = true

[[classes]]
name = "rdma"
dscp = [26]
priority = 0
lossless = true
pcp = 3
xoff_bytes = 60000
xon_bytes = 30000
headroom_bytes = 40000

[classes.queue]
discipline = "droptail"
buffer_bytes = 300000
"""


def test_load_example():
    t = loads_toml(EXAMPLE)
    assert isinstance(t, LeafSpineSpec)
    assert t.seed == 7 and t.host_count == 16 and t.oversubscription == 2.0
    assert t.spine_queue == QueueSpec("step", buffer_bytes=400_000, k_packets=20)
    assert t.host_queue.discipline == "droptail"  # default
    assert t.classes[1].queue == QueueSpec(buffer_bytes=300_000)
    assert t.classes[1].dscp == frozenset({26})
    assert t.tcp == HostTcpSpec("dctcp", rto_min_ms=5)
    assert t.host_link.rate_mbps == 1000.0


def test_toml_round_trip_leafspine():
    t = loads_toml(EXAMPLE)
    text = dumps_toml(t)
    assert loads_toml(text) == t
    assert dumps_toml(loads_toml(text)) == text


def test_toml_round_trip_dumbbell():
    d = DumbbellSpec(senders=8, sender_link=LinkSpec(1000, delay_ms=0.1, jitter_ms=0.05, loss_percent=0.01),
                     bottleneck_link=LinkSpec(100, mtu=9000), receivers=2, prefix="db",
                     bottleneck_queue=QueueSpec("red", buffer_bytes=100_000, min_bytes=10_000, max_bytes=30_000,
                                                probability=0.05, ecn=True, burst_packets=20),
                     tcp=HostTcpSpec("cubic", ecn=True, tcp_wmem_bytes=(4096, 16384, 4194304)),
                     classes=(ClassSpec("be", weight=3, default=True), ClassSpec("hi", dscp={46}, priority=0)))
    assert loads_toml(dumps_toml(d)) == d
    assert from_dict(to_dict(d)) == d


def test_file_loading(tmp_path):
    p = tmp_path / "topo.toml"
    p.write_text(EXAMPLE)
    assert load_topology(p) == loads_toml(EXAMPLE)
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE.replace("[fabric_link]\nrate_mbps = 1000", "[fabric_link]\nrate_mbps = -5"))
    with pytest.raises(SpecError) as ei:
        load_topology(bad)
    assert ei.value.path == "fabric_link.rate_mbps"
    assert str(ei.value) == f"{bad}: fabric_link.rate_mbps: must be > 0 (got -5)"
    with pytest.raises(SpecError, match="unknown topology file type '.json'"):
        (tmp_path / "x.json").write_text("{}")
        load_topology(tmp_path / "x.json")
    with pytest.raises(SpecError, match="cannot read"):
        load_topology(tmp_path / "missing.toml")


@pytest.mark.parametrize("edit, path, msg", [
    (("rate_mbps = 1000\ndelay_ms = 0.05\n\n[fabric", "rate_mbps = 0\ndelay_ms = 0.05\n\n[fabric"),
     "host_link.rate_mbps", "must be > 0"),
    (("k_packets = 20\n\n[tcp]", "k_packets = 9999\n\n[tcp]"), "spine_queue.k_packets", "K must be < the buffer"),
    (("xon_bytes = 30000", "xon_bytes = 70000"), "classes[1].xon_bytes", "must be < xoff_bytes"),
    (("xoff_bytes = 60000", "xoff_bytes = 290000"), "classes[1].xoff_bytes", "must fit the buffer"),
    (("[classes.queue]\ndiscipline = \"droptail\"", "[classes.queue]\ndiscipline = \"fifo\""),
     "classes[1].queue.discipline", "unknown discipline 'fifo' (allowed: droptail, red, step)"),
    (("hosts_per_leaf = 4", "hosts_per_leaf = 300"), "hosts_per_leaf", "300 hosts exceed the /24 address plan"),
    (("seed = 7", "seed = 7\nspeed = 3"), "speed", "unknown field"),
    (("[tcp]\n", "[tcp]\nretries = 3\n"), "tcp.retries", "unknown field"),
    (("[host_link]\n", "[host_link]\nrate = 3\n"), "host_link.rate", "unknown field"),
    (("kind = \"leafspine\"", "kind = \"torus\""), "kind", "unknown topology kind 'torus'"),
    (("spines = 2\n", ""), "spines", "required field is missing"),
    (("dscp = [26]", "dscp = 26"), "classes[1].dscp", "must be a list"),
    (("[fabric_link]\nrate_mbps = 1000", "[fabric_link]\nrate_mbps = \"1G\""), "fabric_link.rate_mbps",
     "must be a number (got '1G')"),
])
def test_errors_name_the_field_path(edit, path, msg):
    old, new = edit
    assert old in EXAMPLE
    with pytest.raises(SpecError) as ei:
        loads_toml(EXAMPLE.replace(old, new, 1))
    assert ei.value.path == path
    assert msg in str(ei.value)
    assert str(ei.value).startswith(f"{path}: ")


def test_invalid_toml_and_non_table():
    with pytest.raises(SpecError, match="invalid TOML"):
        loads_toml("spines = = 2")
    with pytest.raises(SpecError, match="must be a table/mapping"):
        from_dict([1, 2])
    with pytest.raises(SpecError, match="^host_link: must be a table"):
        from_dict({"spines": 1, "leaves": 1, "hosts_per_leaf": 1, "host_link": 5, "fabric_link": {"rate_mbps": 1}})


def test_yaml_loading(tmp_path):
    pytest.importorskip("yaml")
    text = """
kind: dumbbell
senders: 4
sender_link: {rate_mbps: 1000}
bottleneck_link: {rate_mbps: 100, delay_ms: 1}
bottleneck_queue: {discipline: step, buffer_packets: 200, k_packets: 30}
tcp: {congestion_control: dctcp}
"""
    d = loads_yaml(text)
    assert isinstance(d, DumbbellSpec) and d.bottleneck_queue.k_packets == 30
    p = tmp_path / "d.yaml"
    p.write_text(text.replace("rate_mbps: 100,", "rate_mbps: -1,"))
    with pytest.raises(SpecError) as ei:
        load_topology(p)
    assert ei.value.path == "bottleneck_link.rate_mbps"


def test_yaml_missing_gives_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` raise ImportError
    with pytest.raises(SpecError, match="YAML topologies need PyYAML"):
        loads_yaml("spines: 1")


def test_docs_example_loads():
    import re
    from pathlib import Path
    doc = Path(__file__).resolve().parents[2] / "docs" / "topologies.md"
    block = re.search(r"```toml\n(.*?)```", doc.read_text(), re.S).group(1)
    t = loads_toml(block)
    assert t.oversubscription == 2.0 and t.spine_queue.marks_ecn and not t.warnings()
