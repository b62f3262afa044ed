"""The collective workload with the queue mechanisms the lab compares (lab VM: RED/step marking and DCTCP): an
incast-heavy collective (gather: every rank sends its block to one) over CUBIC and drop-tail, and over DCTCP with
step marking at K, same buffer."""

from __future__ import annotations

from testbed.commands.runner import run_scenario
from testbed.scenario import get

COLL = get("collective")


def run(tmp_path, name, **kw):
    p = {x.name: x.default for x in COLL.params}
    p.update({"collective": "gather", "size": "256K", "iterations": 10, "warmup": 1, "buffer_bytes": 40_000,
              "host_rate_mbps": 20.0, "fabric_rate_mbps": 20.0, "sample_interval_ms": 0, **kw})
    COLL.validate(p)
    return run_scenario(COLL, p, 1, tmp_path / name, quiet=True)


def test_dctcp_with_step_marking_drops_far_less_than_cubic_over_droptail_in_a_gather(tmp_path):
    cubic = run(tmp_path, "cubic", cc="cubic")
    dctcp = run(tmp_path, "dctcp", cc="dctcp", ecn=True, discipline="step", k_bytes=12_000)
    keys = ("cct_ms_p50", "cct_ms_p99", "switch_drops", "ecn_marks", "tcp_retrans_segs")
    print({k: (cubic.get(k), dctcp.get(k)) for k in keys})
    assert cubic["data_verified"] and dctcp["data_verified"]
    # measured in the lab VM (2 runs each): CUBIC 163-197 drops, DCTCP 15-18 (its first window still overflows a
    # 40 kB buffer: 3 senders x 10 segments) with 2594-2696 marks
    assert cubic["ecn_marks"] == 0 and dctcp["ecn_marks"] > 100, (cubic, dctcp)
    assert dctcp["switch_drops"] < 0.3 * cubic["switch_drops"], (cubic, dctcp)



def test_a_slow_spine_is_an_ecmp_hot_spot_and_spraying_pays_the_slow_path_on_every_flow(tmp_path):
    """Both leaves' uplinks to spine1 at a quarter of their rate (a degraded spine), an all-to-all of 6 ranks across
    two leaves. ECMP: the flows hashed onto spine1 finish last, so the op's tail rises (9 cross-leaf connections,
    each direction hashed on its own: the chance that no direction uses spine1 is 1/2^18; with 2 ranks per leaf a
    run had none on leaf1's slow uplink). Per-packet spraying does not fix an asymmetric fabric: every flow sends
    half its packets through a slow port and reorders, so the tail rises more and TCP sees many reordering
    retransmissions (the case for adaptive load balancing, which weighs the paths by their delay:
    tests/host/test_load_balancing_host.py).
    Measured in the lab VM, 6 ranks, both spine1 uplinks slow: ECMP p99 374 ms clean, 699 ms slow (1.87x), the
    deepest queue at leaf1:spine1; spraying 363 ms clean, 915 ms slow (2.5x), 642 retransmissions against ECMP's 9.
    (4 ranks, one slow uplink, 2 runs: ECMP 1.33-1.72x, spraying 1.9-2.1x with 222-293 retransmissions.)
    Adaptive flowlet balancing, same slow spine, 2 runs in the lab VM: p99 438-461 ms against ECMP's 651-703 and
    spraying's 866-910, with 63-65 retransmissions against spraying's 595-693."""
    from analysis.load import load_run
    from testbed.faults import plan as faultplan

    slow = [faultplan.parse(f"slow-port {leaf}:spine1 at_s=0 fraction=0.25") for leaf in ("leaf1", "leaf2")]
    kw = dict(collective="alltoall", size="128K", iterations=6, spines=2, leaves=2, hosts_per_leaf=3, ranks=6,
              host_rate_mbps=10.0, fabric_rate_mbps=10.0, buffer_bytes=256_000)
    runs = {}
    for lb in ("ecmp", "spray", "adaptive"):
        p = {x.name: x.default for x in COLL.params}
        p.update(warmup=1, sample_interval_ms=20, load_balancing=lb, **kw)
        COLL.validate(p)
        if lb != "adaptive":
            runs[lb] = run_scenario(COLL, p, 1, tmp_path / lb, quiet=True)
        runs[f"{lb}-slow"] = run_scenario(COLL, p, 1, tmp_path / f"{lb}-slow", quiet=True, faults=slow)
    keys = ("cct_ms_p50", "cct_ms_p99", "switch_drops", "tcp_retrans_segs", "slow_ms_total", "flowlets")
    for name, s in runs.items():
        print(name, {k: s.get(k) for k in keys})
    assert all(s["data_verified"] for s in runs.values())
    assert runs["ecmp-slow"]["cct_ms_p99"] > 1.15 * runs["ecmp"]["cct_ms_p99"], runs
    assert runs["spray-slow"]["cct_ms_p99"] > 1.3 * runs["spray"]["cct_ms_p99"], runs
    assert runs["spray-slow"]["tcp_retrans_segs"] > 5 * max(5, runs["ecmp-slow"]["tcp_retrans_segs"]), runs
    # adaptive (CONGA-style flowlets) weighs the paths by their delay: a lower tail than ECMP's hot spot, and far
    # fewer reordering retransmissions than spraying
    # (against ECMP at a quarter of the rate the p99 is too close to call in one VM run: adaptive 438-631 ms, ECMP
    # 520-703 over 3 runs; tests/host/test_load_balancing_host.py asserts the ECMP comparison at a tenth)
    assert runs["adaptive-slow"]["cct_ms_p99"] < runs["spray-slow"]["cct_ms_p99"], runs
    assert runs["adaptive-slow"]["tcp_retrans_segs"] < 0.5 * runs["spray-slow"]["tcp_retrans_segs"], runs
    q = load_run(tmp_path / "ecmp-slow").queues
    fabric = q[q["node"].str.match(r"(leaf|spine)\d") & q["port"].str.match(r"(leaf|spine)\d")]
    peak = {f"{n}:{p}": int(g["backlog_bytes"].max()) for (n, p), g in fabric.groupby(["node", "port"])}
    print(sorted(peak.items(), key=lambda kv: -kv[1])[:4])
    assert max(peak, key=peak.get) in ("leaf1:spine1", "leaf2:spine1"), peak  # the hot spot is a slow port
