"""Scenarios `testbed run` knows. Each module defines SCENARIO (a testbed.runner.Scenario)."""

from __future__ import annotations

import importlib

NAMES = ("smoke", "incast", "dctcp", "collective", "pfc-hol")


def get(name: str):
    from testbed.errors import UsageError

    if name not in NAMES:
        raise UsageError(f"unknown scenario {name!r} (known: {', '.join(NAMES)})")
    return importlib.import_module(f"testbed.scenarios.{name.replace('-', '_')}").SCENARIO


def all_scenarios():
    return [get(n) for n in NAMES]
