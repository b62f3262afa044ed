"""The collective scenario as the collective tests run it (tests/host/test_collective_host.py on the host kernel,
tests/integration/test_collective.py in the lab VM): 4 ranks, one per host, on a 2x2 leaf-spine at 20 Mbit/s."""

from __future__ import annotations

from testbed.commands.runner import run_scenario
from testbed.scenario import get

COLL = get("collective")


def params(**kw):
    p = {x.name: x.default for x in COLL.params}
    p.update(host_rate_mbps=20.0, fabric_rate_mbps=20.0, spines=2, leaves=2, hosts_per_leaf=2, ranks=4,
             sample_interval_ms=20.0)
    p.update(kw)
    COLL.validate(p)
    return p


def run(tmp_path, name, **kw):
    return run_scenario(COLL, params(**kw), 1, tmp_path / name, quiet=True)


KEYS = ("cct_ms_p50", "cct_ms_p99", "cct_ms_max", "bound_ms", "cct_vs_bound", "step_ms_p50", "step_ms_p99",
        "comm_wait_fraction", "busbw_gbps", "tcp_retrans_segs", "bg_goodput_mbps", "cpu_busy_fraction")


def show(label, s):
    print(label, {k: (round(s[k], 4) if isinstance(s.get(k), float) else s.get(k)) for k in KEYS})
