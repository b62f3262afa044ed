import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TESTBED_STATE_DIR", "/run/testbed")


@pytest.fixture(scope="session")
def report():
    """`testbed doctor --json` of this kernel, run once per session (host tests and the lab VM's tests share it)."""
    import json
    import subprocess

    r = subprocess.run([sys.executable, "-m", "testbed.cli", "doctor", "--json"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads(r.stdout)
    # exit status says whether everything is present
    assert r.returncode == (0 if rep["all_ok"] else 1)
    return rep
