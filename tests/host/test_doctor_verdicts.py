"""doctor's verdicts agree with the stock tools, on whatever kernel this runs (host or lab VM)."""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from capability_checks import independent_verdicts  # noqa: E402

# `report` (one `testbed doctor --json` per session) is in tests/conftest.py, shared with tests/integration.


def test_every_verdict_matches_an_independent_try(report):
    checked = 0
    disagreements = []
    verdicts = independent_verdicts([c["name"] for c in report["checks"]])
    for c in report["checks"]:
        v = verdicts.get(c["name"])
        if v is None:
            continue
        checked += 1
        if v != c["ok"]:
            disagreements.append(f"{c['name']}: doctor says {c['ok']}, stock tools say {v} ({c['detail']})")
    assert not disagreements, "\n".join(disagreements)
    assert checked >= 20


def test_missing_ones_say_what_they_disable_and_how_to_get_them(report):
    for c in report["checks"]:
        if not c["ok"]:
            assert c["disables"] and c["hint"], c


def test_doctor_leaves_nothing_behind(report):
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "tb-doctor" not in ns
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "tbdr" not in links
