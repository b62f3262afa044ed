"""In the lab VM doctor finds every capability (and its verdicts still match the stock tools: the host test module
tests/host/test_doctor_verdicts.py is collected in the VM session too)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "host"))
from test_doctor_verdicts import report  # noqa: E402,F401  (the module-scoped doctor --json fixture)


def test_everything_present_in_the_lab_vm(report):  # noqa: F811
    missing = [c["name"] for c in report["checks"] if not c["ok"]]
    assert report["all_ok"] and not missing, f"lab VM kernel lacks: {missing}"
    assert report["in_lab_vm"]
