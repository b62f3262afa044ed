"""A fixture for host tests that build fabrics: the test leaves no project namespace behind (the lab VM's tests get
the same check from tests/integration/conftest.py). Namespaces up before the test are not its own and not counted."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_leftovers():
    from testbed.kernel import netns

    before = set(netns.list_ours())
    yield
    left = sorted(set(netns.list_ours()) - before)
    assert not left, f"namespaces left behind: {left}"
