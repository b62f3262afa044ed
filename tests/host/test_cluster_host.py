"""A fabric split over two servers, both on this machine (host kernel): Mininet's cluster placer puts each leaf
with its hosts on one server and spreads the spines; the leaf-spine links that cross servers are VXLAN tunnels
over a datacentre network between the servers' namespaces. A ring all-reduce across the split carries verified
data, every byte between the two servers' hosts crosses a tunnel (the servers' UDP counters say so), the run
judges its own fidelity, and nothing is left behind. A split the fabric cannot take is one line and status 2
before anything exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from testbed.kernel import netns
from testbed.commands.runner import run_scenario
from testbed.scenario import get

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")

SIZE_BYTES = 1_000_000
ITERATIONS, WARMUP = 5, 1


def allreduce(tmp_path, name, servers, seed=1):
    sc = get("collective")
    p = {x.name: x.default for x in sc.params}
    p.update(collective="allreduce", size="1M", iterations=ITERATIONS, warmup=WARMUP, spines=2, leaves=2,
             hosts_per_leaf=2, host_rate_mbps=20.0, fabric_rate_mbps=20.0, sample_interval_ms=10, servers=servers)
    sc.validate(p)
    return run_scenario(sc, p, seed, tmp_path / name, quiet=True)


def test_a_collective_across_two_servers_is_verified_and_crosses_their_tunnels(tmp_path):
    before = set(netns.list_ours())
    s = allreduce(tmp_path, "split", servers=2)
    print({k: s.get(k) for k in ("cct_vs_bound", "servers", "tunnel_datagrams", "tunnel_drops", "fidelity_ok",
                                 "fidelity_reasons", "port_rate_ratio_min")})
    assert s["data_verified"] is True, s
    assert s["servers"] == 2 and s["tunnel_drops"] == 0, s
    # the ring h1 -> h2 -> h3 -> h4 -> h1 has two hops between the servers (h2 -> h3, h4 -> h1); each rank sends
    # 2(n-1)/n of the message per all-reduce, so at least this many full frames crossed a tunnel
    crossing_bytes = 2 * (2 * 3 / 4) * SIZE_BYTES * (ITERATIONS + WARMUP)
    assert s["tunnel_datagrams"] >= crossing_bytes / 1500, s
    manifest = json.loads((tmp_path / "split" / "manifest.json").read_text())
    servers = manifest["topology"]["builder"]["servers"]
    assert servers["nodes"] == {"server-1": ["h1", "h2", "leaf1", "spine1"],
                                "server-2": ["h3", "h4", "leaf2", "spine2"]}, servers
    assert len(servers["tunnels"]) == 2, servers  # leaf1-spine2 and leaf2-spine1
    # the tunnels' ports are judged like every other: within a band of the bound, or unfaithful and saying why
    assert s["cct_vs_bound"] <= 1.35 or (s["fidelity_ok"] is False and s["fidelity_reasons"]), s
    assert set(netns.list_ours()) == before  # servers, datacentre network and nodes all gone


def test_a_split_the_fabric_cannot_take_is_refused_before_anything_exists(tmp_path):
    before = set(netns.list_ours())
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "collective", "--vm", "never", "--set",
                        "servers=5", "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "servers=5: the fabric has only 4 switches" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert set(netns.list_ours()) == before and not (tmp_path / "x").exists()
