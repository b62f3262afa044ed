"""`testbed burnin` names a lossy link (lab VM: netem is not in the host kernel). 3% random loss on what spine1
sends to leaf2: the pinned path through it retransmits, the paths that avoid it do not, and the link is in
health.json's bad links. The loss happens on the link's receiving end (netem on an IFB), not in the port's qdisc,
so the evidence is the senders' retransmissions and the verdict cannot tell the path's two links apart."""

import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_a_lossy_link_is_named(tmp_path):
    from testbed.kernel import doctor

    assert not doctor.missing(["qdisc:netem"]), "netem is needed (run in the lab VM)"
    out = tmp_path / "lossy"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "burnin", "--vm", "never", "--quiet", "--out", str(out),
                        "--fault", "netem spine1:leaf2 at_s=0 loss_percent=3"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 1, r.stderr[-3000:]
    with open(out / "burnin.csv") as fh:
        rows = {(x["target"], x["metric"]): x for x in csv.DictReader(fh)}
    lossy = rows[("leaf1>spine1>leaf2", "path_retrans_pct")]
    assert lossy["verdict"] == "outlier" and float(lossy["value"]) > 1.0, lossy
    assert rows[("leaf1>spine2>leaf2", "path_retrans_pct")]["verdict"] == "ok"
    doc = json.loads((out / "health.json").read_text())
    assert not doc["links"]["leaf2-spine1"]["ok"] and doc["links"]["leaf1-spine2"]["ok"], doc["links"]
