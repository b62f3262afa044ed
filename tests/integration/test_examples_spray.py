"""examples/ecmp_collision.py's ECMP and spraying halves (`--no-adaptive`), in the lab VM (spraying needs
cls:basic+meta, act:skbedit and act:mirred, which the host kernel may lack): the pair that collides under ECMP gets
about one link's rate, spraying restores most of two. The ECMP half stays: it finds the colliding source ports that
the spraying half reuses. The adaptive half is left to the host (tests/host/test_examples.py runs the ECMP and
adaptive halves: the balancer splits the colliding pair); in the VM kernel, test_collective_mechanisms checks the
adaptive balancer's flowlets and its few retransmissions against spraying's, not the split."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_spraying_restores_the_colliding_pair(tmp_path):
    from testbed.kernel import doctor

    missing = doctor.missing(["qdisc:clsact", "cls:basic+meta", "act:skbedit", "act:mirred"])
    assert not missing, f"spraying needs {missing}"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "ecmp_collision.py"), "--out", str(tmp_path / "run"),
                        "--no-adaptive"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads(r.stdout.strip().splitlines()[-1])
    full = 2 * m["link_mbps"]
    # Each of the two runs is held against the links' rates, not against the other run (one run a side would be a
    # timing comparison): the example made sure both flows went up one spine, so HTB caps the pair at one link's
    # rate (measured in the lab VM 18.4, 19.1 and 18.7 of 20 Mbit/s); sprayed, the pair gets most of two links
    # (31.3 and 31.8 of 40). Together the bounds still say spraying beats the collision by over 0.65 x 2 / 1.05 = 1.24x.
    # With --no-adaptive (spraying right after ECMP; 5 runs, 3 VM boots, shared 2-CPU host): ECMP 19.0-19.6, spray
    # 30.9-33.1 in 4 runs and 23.7 once (a failure, while other jobs' test suites ran on the host; the whole example
    # before, on the same boots: spray 32.9 and 31.6). Not enough runs to tell a flake rate from that.
    assert m["ecmp_mbps"] <= 1.05 * m["link_mbps"] and m["ecmp_mbps"] < 0.65 * full, m
    # spraying splits each flow over both spines: the pair gets most of the fabric back, less the reordering cost
    # (CUBIC takes out-of-order arrivals for loss). Measured in the lab VM: 31.3 of 40 Mbit/s sprayed vs 18.4 under
    # the ECMP collision (1.7x)
    assert m["spray_mbps"] > 0.65 * full, m
    assert min(m["spray_uplink_packets"]) > 0.3 * max(m["spray_uplink_packets"]), m  # both spines carry it
    assert "adaptive_mbps" not in m, m  # --no-adaptive: that half was not run
