"""The dctcp scenario's delay_ms: propagation delay on the dumbbell's s1 - s2 link only (so the bottleneck queue
s2 -> r1 is the same queue, and the BDP can be made large against K), and refused where it has no meaning."""

from __future__ import annotations

import pytest

from testbed.errors import UsageError
from testbed.params import resolve
from testbed.scenario import get
from testbed.workloads.bottleneck import build_spec

DCTCP = get("dctcp")


def test_delay_goes_on_the_s1_s2_link_and_sets_the_base_rtt():
    p = resolve(DCTCP.params, ["delay_ms=20", "cc=reno"])
    DCTCP.validate(p)
    from scenarios.dctcp import fabric

    spec, receiver, senders, bottleneck = fabric(p)
    assert (receiver, bottleneck) == ("r1", ("s2", "r1"))
    assert spec.bottleneck_link.delay_ms == 20 and spec.sender_link.delay_ms == 0 == spec.receiver_link.delay_ms
    assert spec.base_rtt_ms == 40
    assert "qdisc:netem" in DCTCP.needs_of(p)  # delay is netem on the wire: the lab VM's kernel


def test_no_delay_is_the_old_fabric():
    p = resolve(DCTCP.params, [])
    from scenarios.dctcp import fabric

    assert fabric(p)[0].base_rtt_ms == 0
    assert "qdisc:netem" not in DCTCP.needs_of(p)


@pytest.mark.parametrize("bad", ["delay_ms=-1", "delay_ms=501", "delay_ms=soon"])
def test_bad_delay_is_refused(bad):
    with pytest.raises(UsageError):
        resolve(DCTCP.params, [bad])


def test_delay_on_a_leaf_spine_is_refused():
    base = {"senders": 2, "discipline": "droptail", "k_bytes": 30_000, "buffer_bytes": 64_000, "cc": "cubic",
            "ecn": False, "host_rate_mbps": 20.0, "fabric_rate_mbps": 40.0, "rto_min_ms": 200, "seed": 0,
            "topology": "leafspine", "hosts_per_leaf": 2, "spines": 1, "load_balancing": "ecmp"}
    build_spec(base)
    with pytest.raises(UsageError, match="dumbbell"):
        build_spec({**base, "delay_ms": 5.0})
