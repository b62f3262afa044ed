"""analysis must stay importable on a machine without the fabric: it never imports testbed/topologies/traffic."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, sys
import analysis, analysis.load, analysis.metrics, analysis.correlate, analysis.plots
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('testbed', 'topologies', 'traffic'))
print(json.dumps({"bad": bad, "pyplot": 'matplotlib.pyplot' in sys.modules}))
"""


def test_analysis_imports_nothing_from_the_fabric():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["bad"] == []
    assert res["pyplot"] is False  # Agg canvas only, no global pyplot state


def test_analysis_sources_do_not_mention_fabric_imports():
    for src in (ROOT / "analysis").glob("*.py"):
        text = src.read_text()
        for pkg in ("testbed", "topologies", "traffic"):
            assert f"import {pkg}" not in text and f"from {pkg}" not in text, (src.name, pkg)
