"""The scenarios that are not yet scripts in scenarios/ (see testbed.scenario, which finds both)."""

from __future__ import annotations

from testbed.scenario import all_scenarios, get, names

__all__ = ["all_scenarios", "get", "names"]
