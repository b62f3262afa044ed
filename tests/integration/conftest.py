"""Integration tests need the real kernel features: they run inside the lab VM (`testbed vm -- pytest ...`).

Run on a kernel that lacks a capability, the session fails at once with the capability's name: never a skip.
"""

import subprocess
import sys

import pytest

NEEDED = ["qdisc:htb", "qdisc:bfifo", "qdisc:red+ecn", "qdisc:netem", "qdisc:prio", "qdisc:plug", "tcp:dctcp",
          "sysctl:ecn"]


def pytest_sessionstart(session):
    from testbed.kernel import doctor

    missing = doctor.missing(NEEDED)
    if missing:
        raise pytest.UsageError(
            f"integration tests need {', '.join(missing)} which this kernel lacks: "
            "run them in the lab VM (testbed vm -- python -m pytest tests/integration)")


def _ours() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith("tb-")]


@pytest.fixture(autouse=True)
def no_leftovers():
    """Every integration test leaves no project namespace behind: none it made, and none at all unless a module
    fixture's fabric (shared by the module's tests, built before the test) holds it; such a fixture checks its own
    namespaces gone when it tears the fabric down (test_rdma_grant.py's)."""
    before = set(_ours())
    yield
    left = sorted(set(_ours()) - before)
    if left:  # clean up for the next test, then fail this one
        subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], capture_output=True)
    assert not left, f"namespaces left behind: {left}"
