"""DCTCP with step marking at K keeps the bottleneck's queue near K; CUBIC over drop-tail fills the buffer."""

from testbed.commands.runner import run_scenario
from testbed.scenario import get

DCTCP = get("dctcp")


def run(tmp_path, name, **kw):
    """One run; again (once) when the run itself says it was not faithful (fidelity_ok false: the flows carried
    less than 80% of the link, or the CPU was saturated). Measured: DCTCP 16.1-17.4 Mbit/s of 20 in the lab VM,
    and once 12.6 in a fresh-clone CI run, flagged so by the run; the assertions judge the second run then."""
    p = {x.name: x.default for x in DCTCP.params}
    p.update(duration_s=6, warmup_s=2, senders=2, host_rate_mbps=20, buffer_bytes=150_000, k_bytes=30_000, **kw)
    DCTCP.validate(p)
    s = run_scenario(DCTCP, p, 1, tmp_path / name, quiet=True)
    if not s["fidelity_ok"]:
        print(f"{name}: not faithful ({s['fidelity_reasons']}); running it again")
        s = run_scenario(DCTCP, p, 1, tmp_path / f"{name}-again", quiet=True)
    return s


def test_dctcp_holds_the_queue_near_k_while_cubic_fills_the_buffer(tmp_path):
    d = run(tmp_path, "dctcp", cc="dctcp", ecn=True, discipline="step")
    c = run(tmp_path, "cubic", cc="cubic", ecn=False, discipline="droptail")
    k_pk = 30_000 / 1514
    buf_pk = 150_000 / 1514
    assert d["ecn_marks"] > 0 and d["bottleneck_drops"] == 0, d
    assert c["bottleneck_drops"] > 0 and c["ecn_marks"] == 0, c
    # ordering, and bands: DCTCP's median within [K/4, 2.5 K]; CUBIC's p90 above half the buffer
    assert d["queue_median_packets"] < c["queue_median_packets"], (d, c)
    assert 0.25 * k_pk <= d["queue_median_packets"] <= 2.5 * k_pk, d
    assert c["queue_p90_packets"] >= 0.5 * buf_pk, c
    # same link, similar throughput
    assert d["goodput_mbps"] > 0.7 * c["goodput_mbps"], (d, c)
