"""`testbed run collective --set transport=uet`: the agents' UET transport (traffic.uet) carries a ring all-reduce
over a 2-leaf, 2-spine fabric, every rank's result verified, and its entropy values spray each flow over both
spines, where kernel TCP keeps a flow on the one path its 5-tuple hashes to.

Asserted from the ports' counters (queues.csv): each leaf's two uplinks each carry at least 25% of the bytes the
leaf sends up. Without spraying the other uplink would still carry the ACKs of the flow coming the other way (114 B
per 1514 B data packet, ~7% of the bytes), so the floor sits well above that. The ring's one cross-leaf flow per
direction uses 64 entropy values (`entropy_values=64`; UDP source ports, new each run) in turn, each a 64th of the
data; with fib_multipath_hash_policy=1 an uplink falls below 25% only when it gets at most 15 of them: 2 x
P(Bin(64, 1/2) <= 15) = 2.4e-5 per leaf, 4.8e-5 per run (the ACKs make it rarer still). Measured with the
default 16 (one run each): 2.52 / 4.46 MB and 3.65 / 3.33 MB, the smaller uplink's share 23-48% (at 16 a 25% floor
would fail ~8% of runs per leaf); 7.84 / 0.18 MB (the ACKs) for TCP. Every rank's transport reports the 64 it was
given (the run manifest's uet_entropy_values_by_rank, from the agents' ready messages); with 64, 3 runs: the
smaller uplink's share 44-49%. The run directory's
uet.csv has every rank's counters and trim.csv every switch port's (trimming is on by default with UET). No timing
is asserted (one run; docs/uet.md gives the CCT against the bound). About 6 s."""

from __future__ import annotations

import csv
import json
import os

import pytest

from testbed.commands.runner import run_scenario
from testbed.kernel import netns
from testbed.scenario import get

EVS = 64  # --set entropy_values: each rank's UDP source ports per peer

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="builds namespaces: run as root")


def test_a_uet_allreduce_is_verified_and_sprayed_over_both_spines(tmp_path):
    before = set(netns.list_ours())
    sc = get("collective")
    p = {x.name: x.default for x in sc.params}
    p.update(transport="uet", collective="allreduce", size="1M", iterations=3, warmup=1, spines=2, leaves=2,
             hosts_per_leaf=2, host_rate_mbps=20.0, fabric_rate_mbps=20.0, entropy_values=EVS)
    sc.validate(p)
    s = run_scenario(sc, p, 1, tmp_path / "uet", quiet=True)
    print({k: s.get(k) for k in ("data_verified", "cct_vs_bound", "switch_drops", "tcpinfo_total_retrans")})
    assert s["data_verified"] is True, s
    manifest = json.loads((tmp_path / "uet" / "manifest.json").read_text())
    assert manifest["uet_entropy_values_by_rank"] == {str(r): EVS for r in range(4)}  # as each agent reports it
    first, last = {}, {}
    with open(tmp_path / "uet" / "queues.csv") as f:
        for row in csv.DictReader(f):
            key = (row["node"], row["port"])
            first.setdefault(key, int(row["sent_bytes"]))
            last[key] = int(row["sent_bytes"])
    up = {k: last[k] - first[k] for k in last if k[0].startswith("leaf") and k[1].startswith("spine")}
    print(up)
    for leaf in ("leaf1", "leaf2"):
        mine = {k: v for k, v in up.items() if k[0] == leaf}
        assert len(mine) == 2 and all(v >= 0.25 * sum(mine.values()) for v in mine.values()), mine
    # the run directory keeps the transport's and the switches' counters: every rank's, every switch port's
    # (2 leaves x (2 hosts + 2 spines) + 2 spines x 2 leaves = 12), trimming on by default with UET
    assert s["uet_hosts"] == 4 and s["uet_data_packets"] > 0 and s["uet_acks_received"] > 0, s
    assert s["uet_trim"] == "on" and s["uet_trim_ports"] == 12, s
    with open(tmp_path / "uet" / "uet.csv") as f:
        assert {r["host"] for r in csv.DictReader(f)} == {"h1", "h2", "h3", "h4"}
    assert not set(netns.list_ours()) - before  # nothing left behind
