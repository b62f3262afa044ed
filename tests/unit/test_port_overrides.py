"""Per-port overrides (topologies/overrides.py): parsing, validation (each error names its field), the TOML round
trip, and the builder's plan (testbed.network.portplan.PortPlan, computed without building anything) of the overridden
port
and its neighbours. The collective scenario's topology_file is checked here too (pure parameter logic)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.errors import UsageError
from testbed.network.fabric import Fabric
from topologies import (ClassSpec, DumbbellSpec, LeafSpineSpec, LinkSpec, PortOverride, QueueSpec, SpecError,
                        dumps_toml, from_dict, load_topology, loads_toml, to_dict)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "topology-files" / "slow-spine-port.toml"
BASE = """
spines = 2
leaves = 2
hosts_per_leaf = 2
[host_link]
rate_mbps = 20
[fabric_link]
rate_mbps = 20
"""
SLOW = """
[[ports]]
port = "spine1:leaf2"
rate_mbps = 5
queue = { discipline = "droptail", buffer_bytes = 30000 }
"""
SHALLOW = QueueSpec("droptail", buffer_bytes=30_000)
LOSSLESS = (ClassSpec("bulk", dscp=[0], weight=1, default=True),
            ClassSpec("rdma", dscp=[26], priority=0, lossless=True, pcp=3, xoff_bytes=60_000, xon_bytes=30_000,
                      headroom_bytes=40_000))


def leaf_spine(**kw) -> LeafSpineSpec:
    return LeafSpineSpec(spines=2, leaves=2, hosts_per_leaf=2, host_link=LinkSpec(20), fabric_link=LinkSpec(20), **kw)


def plans(spec) -> dict:
    return {(p.node, p.ifname): p for p in Fabric(spec, "t1").port_plans}


# ---- parsing ----------------------------------------------------------------------------------------------------


def test_a_file_and_python_give_the_same_spec():
    from_file = loads_toml(BASE + SLOW)
    assert from_file.ports == (PortOverride("spine1:leaf2", rate_mbps=5, queue=SHALLOW),)
    assert from_file == leaf_spine(ports=(PortOverride("spine1:leaf2", rate_mbps=5.0, queue=SHALLOW),))
    o = from_file.ports[0]
    assert (o.node, o.ifname, type(o.rate_mbps)) == ("spine1", "leaf2", float)


def test_no_overrides_is_the_default_and_changes_nothing():
    assert leaf_spine().ports == () and loads_toml(BASE).ports == ()
    assert leaf_spine(ports=[]).links == leaf_spine().links


def test_the_overridden_egress_gets_its_rate_and_queue_and_only_it():
    spec = loads_toml(BASE + SLOW)
    eps = {(e.node, e.ifname): e for e in spec.egress_ports()}
    slow = eps[("spine1", "leaf2")]
    assert (slow.rate_mbps, slow.port.rate_mbps, slow.port.queue, slow.port.tier) == (5.0, 5.0, SHALLOW, "spine")
    assert slow.link.rate_mbps == 20.0  # the link itself is unchanged: its other direction keeps it
    for key, e in eps.items():
        if key != ("spine1", "leaf2"):
            assert e.port == spec.port_spec(e.port.tier) and e.rate_mbps == 20.0, key


def test_rate_only_keeps_the_tier_queue_and_queue_only_keeps_the_link_rate():
    spec = leaf_spine(ports=(PortOverride("leaf1:spine2", rate_mbps=2.5),
                             PortOverride("h1:eth0", queue=QueueSpec("step", buffer_bytes=50_000, k_bytes=9000))))
    eps = {(e.node, e.ifname): e for e in spec.egress_ports()}
    assert eps[("leaf1", "spine2")].rate_mbps == 2.5
    assert eps[("leaf1", "spine2")].port.queue == spec.leaf_up_queue
    assert eps[("h1", "eth0")].rate_mbps == 20.0 and eps[("h1", "eth0")].port.queue.threshold_bytes == 9000
    assert eps[("h1", "eth0")].port.rate_mbps is None


def test_the_override_queue_replaces_the_tier_queue_of_classes_without_their_own():
    own = QueueSpec("droptail", buffer_bytes=200_000)
    classes = (ClassSpec("bulk", dscp=[0], weight=1, default=True), ClassSpec("fast", dscp=[10], priority=0,
                                                                              queue=own))
    spec = leaf_spine(classes=classes, ports=(PortOverride("spine2:leaf1", queue=SHALLOW),))
    port = {(e.node, e.ifname): e.port for e in spec.egress_ports()}[("spine2", "leaf1")]
    assert [c.queue for c in port.classes] == [SHALLOW, own]
    plan = plans(spec)[("spine2", "leaf1")]
    assert [(name, q.kind, q.limit) for _, name, q, *_ in plan.classes] == [("bulk", "bfifo", 30_000),
                                                                           ("fast", "bfifo", 200_000)]


def test_a_dumbbell_takes_overrides_too():
    spec = DumbbellSpec(senders=2, sender_link=LinkSpec(10), bottleneck_link=LinkSpec(10),
                        ports=(PortOverride("s2:r1", rate_mbps=1, queue=SHALLOW),))
    p = plans(spec)
    assert (p[("s2", "r1")].rate_mbps, p[("s2", "r1")].classes[0][2].limit) == (1.0, 30_000)
    assert p[("s1", "s2")].rate_mbps == 10.0 and p[("r1", "eth0")].rate_mbps == 10.0
    assert loads_toml(dumps_toml(spec)) == spec


# ---- the builder's plan -----------------------------------------------------------------------------------------


def test_the_port_plan_of_the_overridden_port_has_the_new_rate_and_queue_while_its_neighbours_keep_theirs():
    p = plans(loads_toml(BASE + SLOW))
    slow = p[("spine1", "leaf2")]
    assert slow.rate_mbps == 5.0 and slow.tier == "spine"
    assert [(q.kind, q.limit) for _, _, q, *_ in slow.classes] == [("bfifo", 30_000)]
    default = ("bfifo", 262_144)
    for key in (("leaf2", "spine1"), ("spine1", "leaf1"), ("spine2", "leaf2"), ("leaf2", "h3"), ("h3", "eth0")):
        assert p[key].rate_mbps == 20.0, key
        assert [(q.kind, q.limit) for _, _, q, *_ in p[key].classes] == [default], key


def test_a_red_override_takes_its_port_rate_as_reds_bandwidth():
    red = QueueSpec("red", buffer_bytes=100_000, min_bytes=10_000, max_bytes=30_000, probability=0.1, ecn=True)
    plan = plans(leaf_spine(ports=(PortOverride("spine1:leaf2", rate_mbps=4, queue=red),)))[("spine1", "leaf2")]
    q = plan.classes[0][2]
    assert (plan.rate_mbps, q.kind, q.min_bytes, q.max_bytes, q.ecn) == (4.0, "red", 10_000, 30_000, True)


# ---- validation: every error names its field --------------------------------------------------------------------

FILE_ERRORS = [
    ('port = "spine1:leaf2"\nrate_mbps = -5', "ports[0].rate_mbps", "must be > 0 (got -5)"),
    ('port = "spine1:leaf2"\nrate_mbps = 0.001', "ports[0].rate_mbps", "must be >= 0.01"),
    ('port = "spine1:leaf2"\nrate_mbps = 200000', "ports[0].rate_mbps", "must be <= 100000"),
    ('port = "spine1:leaf2"\nrate_mbps = "fast"', "ports[0].rate_mbps", "must be a number (got 'fast')"),
    ('port = "spine1"\nrate_mbps = 5', "ports[0].port", "must be NODE:IFNAME"),
    ('port = "spine1:leaf2:x"\nrate_mbps = 5', "ports[0].port", "must be NODE:IFNAME"),
    ('port = "Spine1:leaf2"\nrate_mbps = 5', "ports[0].port", "node name must match"),
    ('port = 7\nrate_mbps = 5', "ports[0].port", "must be NODE:IFNAME"),
    ('port = "spine9:leaf2"\nrate_mbps = 5', "ports[0].port", "no egress port spine9:leaf2: no node 'spine9' "
                                                              "(write NODE:IFNAME, e.g. h1:eth0, leaf1:h1"),
    ('port = "spine1:leaf9"\nrate_mbps = 5', "ports[0].port", "no egress port spine1:leaf9: spine1's egress ports "
                                                              "are spine1:leaf1, spine1:leaf2"),
    ('port = "spine1:leaf2"', "ports[0]", "override of spine1:leaf2 sets neither rate_mbps nor queue"),
    ('port = "spine1:leaf2"\nrate = 5', "ports[0].rate", "unknown field (allowed: port, rate_mbps, queue)"),
    ('port = "spine1:leaf2"\nqueue = 5', "ports[0].queue", "must be a table (got 5)"),
    ('port = "spine1:leaf2"\nqueue = { discipline = "droptail", buffer_bytes = 1000 }',
     "ports[0].queue.buffer_bytes", "must hold one 1514-byte frame (MTU + Ethernet header) (got 1000 bytes)"),
    ('port = "spine1:leaf2"\nqueue = { discipline = "step", buffer_bytes = 10000, k_bytes = 20000 }',
     "ports[0].queue.k_bytes", "K must be < the buffer"),
    ('port = "spine1:leaf2"\nqueue = { discipline = "fifo", buffer_bytes = 10000 }', "ports[0].queue.discipline",
     "unknown discipline 'fifo'"),
]


@pytest.mark.parametrize("body,path,message", FILE_ERRORS, ids=[p + ":" + m[:30] for _, p, m in FILE_ERRORS])
def test_a_bad_override_in_a_file_names_its_field(body, path, message):
    with pytest.raises(SpecError) as e:
        loads_toml(BASE + "[[ports]]\n" + body + "\n")
    assert e.value.path == path and str(e.value).startswith(f"{path}: {message}"), str(e.value)


def test_a_port_listed_twice_is_an_error_naming_the_second_entry():
    text = BASE + SLOW + '[[ports]]\nport = "leaf1:spine1"\nrate_mbps = 1\n' + '[[ports]]\nport = "spine1:leaf2"\n' \
        'rate_mbps = 6\n'
    with pytest.raises(SpecError) as e:
        loads_toml(text)
    assert str(e.value) == "ports[2].port: port spine1:leaf2 is already overridden by ports[0] (one entry per port)"


def test_ports_must_be_a_list_of_tables():
    with pytest.raises(SpecError) as e:
        loads_toml(BASE.replace("spines = 2", 'ports = "spine1:leaf2"\nspines = 2'))
    assert e.value.path == "ports" and "must be a list" in str(e.value)


@pytest.mark.parametrize("queue,field,why", [
    (QueueSpec("droptail", buffer_bytes=30_000), "xoff_bytes", "xoff_bytes + headroom_bytes must fit the buffer (got "
     "60000 + 40000 = 100000 > 30000 bytes of the ports[0].queue buffer)"),
    (QueueSpec("red", buffer_bytes=300_000, min_bytes=30_000, max_bytes=90_000, probability=0.1), "lossless",
     "a lossless class cannot use a RED queue without ecn"),
])
def test_lossless_classes_must_fit_the_override_queue(queue, field, why):
    with pytest.raises(SpecError) as e:
        leaf_spine(classes=LOSSLESS, ports=(PortOverride("spine1:leaf2", queue=queue),))
    assert e.value.path == "ports[0].queue"
    assert str(e.value).startswith(f"ports[0].queue: does not suit lossless class 'rdma' (classes[1].{field}): {why}")


def test_a_lossless_class_with_its_own_queue_ignores_the_override_queue():
    own = QueueSpec("droptail", buffer_bytes=300_000)
    classes = (LOSSLESS[0], replace(LOSSLESS[1], queue=own))
    spec = leaf_spine(classes=classes, ports=(PortOverride("spine1:leaf2", queue=SHALLOW),))
    port = {(e.node, e.ifname): e.port for e in spec.egress_ports()}[("spine1", "leaf2")]
    assert [c.queue for c in port.classes] == [SHALLOW, own]


def test_python_errors_name_the_field_too():
    with pytest.raises(SpecError) as e:
        PortOverride("spine1:leaf2", rate_mbps=0)
    assert str(e.value) == "port.rate_mbps: must be > 0 (got 0)"
    with pytest.raises(SpecError) as e:
        PortOverride("spine1:leaf2", queue={"discipline": "droptail"})
    assert e.value.path == "port.queue"
    with pytest.raises(SpecError) as e:
        leaf_spine(ports=(PortOverride("leaf1:spine1", rate_mbps=1), "spine1:leaf2"))
    assert str(e.value) == "ports[1]: must be a PortOverride (got 'spine1:leaf2')"
    with pytest.raises(SpecError) as e:
        leaf_spine(ports=(PortOverride("leaf3:spine1", rate_mbps=1),))
    assert e.value.path == "ports[0].port" and "no node 'leaf3'" in str(e.value)


def test_a_file_error_names_the_file(tmp_path):
    f = tmp_path / "topo.toml"
    f.write_text(BASE + SLOW.replace("rate_mbps = 5", "rate_mbps = -5"))
    with pytest.raises(SpecError) as e:
        load_topology(f)
    assert str(e.value) == f"{f}: ports[0].rate_mbps: must be > 0 (got -5)"


def test_an_ecn_marking_override_with_ecn_off_hosts_is_a_warning():
    spec = leaf_spine(ports=(PortOverride("spine1:leaf2", queue=QueueSpec("step", buffer_bytes=50_000,
                                                                          k_bytes=9000)),))
    assert spec.warnings() == ["queues mark ECN (port spine1:leaf2) but host TCP has ECN off"]


# ---- round trip and description ---------------------------------------------------------------------------------


def test_load_write_load_round_trips_with_the_overrides(tmp_path):
    first = load_topology(EXAMPLE)
    assert first.ports and first.ports[0].port == "spine1:leaf2"
    text = dumps_toml(first)
    assert "[[ports]]" in text and "[ports.queue]" in text
    again = tmp_path / "again.toml"
    again.write_text(text)
    assert load_topology(again) == first
    assert from_dict(to_dict(first)) == first
    yaml = pytest.importorskip("yaml")
    y = tmp_path / "again.yaml"
    y.write_text(yaml.safe_dump(to_dict(first)))
    assert load_topology(y) == first


def test_describe_lists_the_overrides():
    d = loads_toml(BASE + SLOW).describe()
    assert d["ports"] == [{"port": "spine1:leaf2", "rate_mbps": 5.0,
                           "queue": {"discipline": "droptail", "buffer_bytes": 30000, "avpkt_bytes": 1500,
                                     "ecn": False}}]
    assert leaf_spine().describe()["ports"] == []


def test_the_docs_per_port_example_loads():
    doc = (ROOT / "docs" / "topologies.md").read_text()
    section = doc[doc.index("## Per-port overrides"):]
    block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    spec = loads_toml(BASE + block)
    assert [o.port for o in spec.ports] == ["spine1:leaf2", "leaf1:spine2"]
    p = plans(spec)
    assert p[("spine1", "leaf2")].rate_mbps == 5.0 and p[("leaf1", "spine2")].classes[0][2].k_bytes == 10_000


# ---- the collective scenario's topology_file --------------------------------------------------------------------


def collective(*sets: str) -> dict:
    from testbed.params import resolve
    from testbed.scenario import get

    s = get("collective")
    p = resolve(s.params, list(sets))
    s.validate(p)
    return p


def test_collective_builds_the_files_fabric():
    from testbed.scenario import get

    p = collective(f"topology_file={EXAMPLE}", "ranks=4")
    spec = get("collective").topology(p, 1).spec
    assert spec == load_topology(EXAMPLE)
    assert plans(spec)[("spine1", "leaf2")].rate_mbps == 5.0


@pytest.mark.parametrize("sets,message", [
    (["ranks=5"], f"ranks: 5 ranks but topology_file {EXAMPLE} has only 4 hosts (2 leaves x 2 hosts)"),
    (["spines=4", "buffer_bytes=64K"], f"topology_file: the file sets spines, buffer_bytes: leave them unset, or "
                                       f"set them in {EXAMPLE}"),
    (["pfc=on"], f"pfc=on: topology_file {EXAMPLE} has no lossless class with the collective's DSCP 26"),
])
def test_collective_refuses_a_file_that_does_not_fit(sets, message):
    with pytest.raises(UsageError) as e:
        collective(f"topology_file={EXAMPLE}", *sets)
    assert str(e.value).startswith(message), str(e.value)


def test_collective_refuses_bad_files_in_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE.read_text().replace("rate_mbps = 5\n", "rate_mbps = -5\n"))
    dumbbell = tmp_path / "d.toml"
    dumbbell.write_text('kind = "dumbbell"\nsenders = 3\n[sender_link]\nrate_mbps = 10\n[bottleneck_link]\n'
                        'rate_mbps = 10\n')
    for path, message in ((bad, f"topology_file: {bad}: ports[0].rate_mbps: must be > 0 (got -5)"),
                          (tmp_path / "missing.toml", f"topology_file: cannot read {tmp_path / 'missing.toml'}"),
                          (dumbbell, f"topology_file: {dumbbell} is a dumbbell; the collective runs on a "
                                     f"leaf-spine")):
        with pytest.raises(UsageError) as e:
            collective(f"topology_file={path}")
        assert str(e.value).startswith(message), str(e.value)
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "collective", "--set", f"topology_file={bad}"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "ports[0].rate_mbps: must be > 0" in r.stderr, r.stderr
