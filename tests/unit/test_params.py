"""Scenario parameter parsing and validation (pure logic, no kernel)."""

import pytest

from testbed.errors import UsageError
from testbed.params import Param, parse_number, resolve
from testbed.scenario import get

P = [Param("rate_mbps", float, 10.0, "Mbit/s", min=0.01, max=100_000), Param("n", int, 4, min=1, max=64),
     Param("cc", str, "cubic", choices=("cubic", "dctcp")), Param("ecn", bool, False)]


@pytest.mark.parametrize("text,integer,value", [("1500", True, 1500), ("64K", True, 64_000), ("1M", True, 10**6),
                                                ("1Mi", True, 2**20), ("2.5", False, 2.5), ("64KB", True, 64_000)])
def test_numbers_with_suffixes(text, integer, value):
    assert parse_number(text, integer) == value


def test_defaults_and_overrides():
    assert resolve(P, []) == {"rate_mbps": 10.0, "n": 4, "cc": "cubic", "ecn": False}
    assert resolve(P, ["rate_mbps=50", "n=8", "cc=dctcp", "ecn=on"]) == {"rate_mbps": 50.0, "n": 8,
                                                                        "cc": "dctcp", "ecn": True}


@pytest.mark.parametrize("bad,words", [("rate_mbps=-5", "must be >="), ("n=0", "must be >="), ("n=65", "<= 64"),
                                       ("n=1.5", "not a valid int"), ("cc=vegas", "one of"), ("ecn=maybe", "bool"),
                                       ("nosuch=1", "unknown parameter"), ("rate_mbps", "name=value")])
def test_bad_values_are_one_line_usage_errors(bad, words):
    with pytest.raises(UsageError) as e:
        resolve(P, [bad])
    assert words in str(e.value) and "\n" not in str(e.value)


def test_smoke_cross_checks():
    s = get("smoke")
    p = resolve(s.params, ["red_min_bytes=50000", "red_max_bytes=40000"])
    with pytest.raises(UsageError, match="red_min_bytes"):
        s.validate(p)
    p = resolve(s.params, ["red_max_bytes=300000"])
    with pytest.raises(UsageError, match="buffer_bytes"):
        s.validate(p)


def test_unknown_scenario():
    with pytest.raises(UsageError, match="unknown scenario"):
        get("nosuch")


def test_every_scenario_documents_every_parameter():
    from testbed.scenario import all_scenarios

    for s in all_scenarios():
        text = s.help()
        for p in s.params:
            assert p.name in text and (p.help or p.unit), (s.name, p.name)
