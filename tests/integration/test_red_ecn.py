"""Two namespaces joined through an HTB-shaped switch port with a RED/ECN leaf: kernel TCP with ECN, asserted on
the qdisc's own counters and the receiver's CE counter."""

from testbed.commands.runner import run_scenario
from testbed.scenario import get

SMOKE = get("smoke")


def params(**kw):
    p = {x.name: x.default for x in SMOKE.params}
    p.update(kw)
    return p


def test_red_ecn_marks_and_does_not_drop(tmp_path):
    s = run_scenario(SMOKE, params(rate_mbps=20, duration_s=3, ecn=True), 1, tmp_path / "ecn", quiet=True)
    # The flow kept the port busy (so its queue, not the sender, set the pace). Not a fidelity check (that is
    # test_fabric's shaped-path test): a loaded CI machine's emulated VM once pushed only 12.6 of 20 Mbit/s here.
    assert s["shaper_sent_bytes"] > 0.5 * 20e6 / 8 * 3, s
    assert s["ecn_marks"] > 0, s
    assert s["receiver_ce_packets"] > 0, s  # the marks arrived as CE at the receiver
    assert s["bottleneck_drops"] <= s["bottleneck_packets"] * 0.001, s
    assert (tmp_path / "ecn" / "manifest.json").exists()


def test_red_without_ecn_drops_instead(tmp_path):
    s = run_scenario(SMOKE, params(rate_mbps=20, duration_s=3, ecn=False), 1, tmp_path / "drop", quiet=True)
    assert s["ecn_marks"] == 0, s
    assert s["bottleneck_drops"] > 0, s
    assert s["tcp_retrans_segs"] > 0, s
