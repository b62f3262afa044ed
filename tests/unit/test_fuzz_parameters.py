"""Property-based fuzzing of bad scenario parameters (issue 11, item 6): values, --set items and combinations
resolve or are refused in one line, and the CLI refuses them with exit 2 before anything is built. Shared pieces and
the rules every fuzz test keeps: tests/unit/fuzzkit.py."""

from __future__ import annotations


import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from testbed.errors import UsageError
from testbed.params import Param, parse_number, resolve
from tests.unit.fuzzkit import (FUZZ, SCENARIOS, PRINTABLE, assert_refused_by_cli, examples,
                                 garbage, guarded, no_namespace_created, outcome)

__all__ = ["guarded", "no_namespace_created"]  # fixtures, used by name

# ---- scenario parameters: values ---------------------------------------------------------------------------------

#: In-range values that make validate() itself expensive (it generates every collective schedule up front: ring
#: allreduce is O(ranks^2 x chunks) transfers; ranks=256 takes ~18 s). Valid values are drawn below these caps.
COST_CAPS = {("collective", "ranks"): 8, ("collective", "chunks"): 4, ("collective", "leaves"): 4,
             ("collective", "hosts_per_leaf"): 4, ("collective", "spines"): 4}
NO_MAX_CAP = 10**9

#: Free-text parameters (no choices): values the scenario accepts, and near misses.
FREE_TEXT = {
    "collective": ["allreduce", "all_reduce", "all-gather", "ALLTOALL", "reducescatter", "broadcast", "reduce",
                   "gather", "incast", "pipeline", "p2p", "allsum", "", " ", "ring"],
    "algorithm": ["", "ring", "tree", "double_tree", "halving_doubling", "pairwise", "direct", "chain", "bogus"],
    "size": ["1K", "64K", "1M", "4Ki", "1K,64K", "1KB", "1024", "0", "-1K", "1.5", "1,,2", ",", "", "1e3", "nan",
             "inf", "x", "1K,"],
    "buckets": ["", "1K,2K", "4K", "1K,,2K", "0", "x"],
    "stragglers": ["", "1", "1,3", "0", "1,1", "a", "99", "-1", "1,"],
    "background": ["", "h1>h3", "h2:h4", "h1-h2", "h1>h1", "h1>h99", ">h1", "h1", "h1>h3,h2>h4", "h9>h1,"],
    "loss_host": ["h1", "h2", "h4", "h99", "", "leaf1"],
    "capture": ["", "h1:eth0", "leaf1:spine1", "spine1:leaf1", "h1", ":eth0", "h1:", "nosuch:eth0",
                "h1:nosuch", "h1:eth0:x"],
    "schedule_file": ["", "/nonexistent/schedule.json", "/", "/proc/self/status", "\n", "a\nb"],
    "topology_file": ["", "/nonexistent/topo.toml", "/", "/proc/self/status", "topo.yaml", "\n", "a\nb.toml"],
}

_BOOL_WORDS = ["1", "true", "yes", "on", "0", "false", "no", "off", "True", "ON", "No", "FALSE"]
_SUFFIX = [("K", 10**3), ("k", 10**3), ("KB", 10**3), ("M", 10**6), ("Ki", 2**10), ("Mi", 2**20), ("G", 10**9)]
#: mantissas whose product with any suffix is exact in binary floating point
_FRACTIONS = [0, 0.5, 0.25, 0.75]


def _name_forms(name: str) -> st.SearchStrategy[str]:
    return st.sampled_from([name, name.replace("_", "-"), f" {name} ", f"{name} "])


def _cap(scn: str, p: Param) -> float | None:
    hi = p.max if p.max is not None else NO_MAX_CAP
    c = COST_CAPS.get((scn, p.name))
    return min(hi, c) if c is not None else hi


@st.composite
def valid_int_text(draw, lo: int, hi: int) -> tuple[int, str]:
    v = draw(st.integers(lo, hi) | st.sampled_from([lo, hi]))
    forms = [str(v), f" {v} ", f"{v}.0"] + ([f"+{v}"] if v >= 0 else [])
    for suf, mult in _SUFFIX:
        for frac in _FRACTIONS:
            m = v / mult
            if m == int(m) + frac and m >= 1:
                forms.append(f"{int(m)}{suf}" if frac == 0 else f"{int(m) + frac}{suf}")
    return v, draw(st.sampled_from(forms))


@st.composite
def valid_float_text(draw, lo: float, hi: float) -> tuple[float, str]:
    v = draw(st.floats(lo, hi, allow_nan=False, allow_infinity=False) | st.sampled_from([lo, hi]))
    forms = [repr(v)]
    if v == int(v):
        forms.append(str(int(v)))
    for suf, mult in _SUFFIX:
        if v >= mult and (v / mult) * 4 == int((v / mult) * 4) and float(repr(v / mult)) * mult == v:
            forms.append(f"{v / mult!r}{suf}")
    return v, draw(st.sampled_from(forms))


def valid_value(scn: str, p: Param) -> st.SearchStrategy[tuple[object, str] | tuple[None, str]]:
    """(expected parsed value or None if only resolve() knows it, text) of a value Param.parse accepts."""
    if p.kind is bool:
        return st.sampled_from(_BOOL_WORDS).map(lambda w: (w.lower() in ("1", "true", "yes", "on"), w))
    if p.choices:
        return st.sampled_from(list(p.choices)).map(lambda c: (c, c))
    if p.kind is int:
        return valid_int_text(int(p.min if p.min is not None else -NO_MAX_CAP), int(_cap(scn, p)))
    if p.kind is float:
        return valid_float_text(float(p.min if p.min is not None else -NO_MAX_CAP), float(_cap(scn, p)))
    texts = FREE_TEXT.get(p.name, [str(p.default)])
    return st.sampled_from(texts).map(lambda t: (t, t))


def invalid_value(p: Param) -> st.SearchStrategy[str]:
    """A value Param.parse must refuse: out of range, wrong type, not a choice."""
    out = []
    if p.kind in (int, float):
        words = st.sampled_from(["", " ", "abc", "1,000", "0x10", "--5", "1KK", "K", "1 2", "1e", "12Q", "one",
                                 "true", "1/2", "5%", "1..2", "\n", "1\n2"])
        out.append(words)
        if p.kind is int:
            out.append(st.sampled_from(["1.5", "0.5", "2.25", "1.0001K", "1.5B", "0.1"]).filter(
                lambda t: parse_number(t, False) != int(parse_number(t, False))))
            if p.min is not None:
                out.append(st.integers(int(p.min) - 10**12, int(p.min) - 1).map(str))
            if p.max is not None:
                out.append(st.integers(int(p.max) + 1, int(p.max) * 1000 + 10**6).map(str))
        else:
            if p.min is not None:
                out.append(st.floats(max_value=p.min, exclude_max=True, allow_nan=False)
                           .filter(lambda x: x < p.min).map(repr))
            if p.max is not None:
                out.append(st.floats(min_value=p.max, exclude_min=True, allow_nan=False)
                           .filter(lambda x: x > p.max).map(repr))
    elif p.kind is bool:
        out.append(garbage.filter(lambda t: t.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off")))
    elif p.choices:
        out.append(garbage.filter(lambda t: t not in p.choices))
        out.append(st.sampled_from([c.upper() for c in p.choices] + [f" {c}" for c in p.choices]).filter(
            lambda t: t not in p.choices))
    return st.one_of(out) if out else st.nothing()


def _param(scn: str, name: str) -> Param | None:
    return {p.name: p for p in SCENARIOS[scn].params}.get(name.strip().replace("-", "_"))


# ---- scenario parameters: --set items ----------------------------------------------------------------------------


@st.composite
def valid_item(draw, scn: str) -> tuple[str, object, str]:
    p = draw(st.sampled_from(list(SCENARIOS[scn].params)))
    value, text = draw(valid_value(scn, p))
    return p.name, value, f"{draw(_name_forms(p.name))}={text}"


@st.composite
def invalid_item(draw, scn: str) -> str:
    """A --set item resolve() must refuse on its own."""
    params = SCENARIOS[scn].params
    names = {p.name for p in params}
    kind = draw(st.sampled_from(["value", "value", "value", "unknown", "no_equals"]))
    if kind == "unknown":
        k = draw(garbage.filter(lambda t: "=" not in t and t.strip().replace("-", "_") not in names)
                 | st.sampled_from(["sender", "Senders", "rate", "seed_", "out", "vm", "topology_file"]).filter(
                     lambda t: t not in names))
        return f"{k}={draw(garbage)}"
    if kind == "no_equals":
        return draw(garbage.filter(lambda t: "=" not in t) | st.sampled_from([p.name for p in params]))
    p = draw(st.sampled_from([p for p in params if p.kind is not str or p.choices]))
    return f"{draw(_name_forms(p.name))}={draw(invalid_value(p))}"


@st.composite
def garbage_item(draw, scn: str) -> str:
    """Anything: a known name with a random value, or random text."""
    names = [p.name for p in SCENARIOS[scn].params]
    return draw(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(names), garbage) | garbage)


#: (scenario, --set items) pairs every one of which validate() must refuse (cross-parameter checks)
CROSS_INVALID = {
    "smoke": [["red_min_bytes=50000", "red_max_bytes=40000"], ["red_min_bytes=45000", "red_max_bytes=45000"],
              ["red_max_bytes=300000"], ["buffer_bytes=20000", "red_max_bytes=30000"]],
    "dctcp": [["warmup_s=6", "duration_s=6"], ["warmup_s=10", "duration_s=2"], ["cc=dctcp", "ecn=false"],
              ["discipline=step", "k_bytes=149000"], ["discipline=red", "k_bytes=200000", "buffer_bytes=150000"]],
    "incast": [["discipline=step", "k_bytes=63000"], ["discipline=red", "k_bytes=64000"],
               ["discipline=red", "k_bytes=100000", "buffer_bytes=64000"], ["cc=dctcp", "ecn=false"]],
    "pfc-hol": [["xon_bytes=15000"], ["xon_bytes=20000", "xoff_bytes=15000"], ["discipline=step", "k_bytes=119000"],
                ["xoff_bytes=100000", "headroom_bytes=100000"], ["capture=nosuch:eth0"], ["capture=h1"],
                ["mode=lossless_ecn", "k_bytes=119000"]],
    "collective": [["ranks=9", "leaves=2", "hosts_per_leaf=4"], ["pfc=on", "pfc_xon_bytes=40000"],
                   ["pfc=on", "background=h1>h3", "bg_dscp=26"], ["background=h1>h99"], ["background=h1>h1"],
                   ["stragglers=1,1"], ["stragglers=x"], ["size=1,,2"], ["size=0"], ["collective=allsum"],
                   ["algorithm=bogus"], ["buckets=1K,,2K"], ["schedule_file=/nonexistent/s.json"],
                   ["schedule_file=/"], ["rdma_mtu=300"], ["transport=rdma", "rdma_mtu=4096"],
                   ["loss_percent=1", "loss_host=h99"], ["capture=h1:nosuch"], ["dtype=float64", "size=1004"],
                   ["dcqcn=on"], ["dcqcn=on", "transport=rdma", "rdma_timeout=20"],
                   ["dcqcn=on", "transport=rdma", "discipline=step", "rdma_timeout=16"],
                   ["dcqcn=on", "transport=rdma", "discipline=step", "rdma_timeout=20", "pfc=on"],
                   ["dcqcn=on", "transport=rdma", "discipline=step", "rdma_timeout=20", "dcqcn_min_rate_mbps=30"]],
    "program": [["ranks=9"], ["ranks=4", "hosts_per_leaf=1"], ["ranks=8", "ranks_per_host=1"], ["background=h1>h99"],
                ["background=h1>h1"], ["background=h1"], ["cmd=   "], ["cc=dctcp"],
                ["discipline=step", "k_bytes=300000"]],
    "burnin": [["size=abc"], ["size=12Q"], ["leaves=1", "hosts_per_leaf=1"]],
    "canary": [["change=k_bytes=3000"], ["change=cc=dctcp"], ["change=rto_min_ms=1"], ["canary=leaf1,leaf2"],
               ["tolerance=2", "ceiling=1.5"], ["change=bogus=1"]],
    "jobs": [["solo=nobody"], ["file=labs"], ["file=labs/12-burn-in/lab.toml"], ["file=/nonexistent/jobs.toml"]],
}


# ---- scenario parameters: properties -----------------------------------------------------------------------------


@pytest.mark.parametrize("scn", sorted(SCENARIOS))
def test_defaults_resolve_and_validate(scn):
    s = SCENARIOS[scn]
    p = outcome(scn, [])
    assert isinstance(p, dict) and p == {q.name: q.default for q in s.params}


@pytest.mark.parametrize("scn", sorted(SCENARIOS))
@settings(max_examples=examples(25), **FUZZ)
@given(data=st.data())
def test_valid_values_resolve(scn, data):
    """Values drawn from the Param metadata (in range, a choice, with unit suffixes) always resolve to the value
    meant; validate() then accepts the combination or refuses it in one line."""
    items = data.draw(st.lists(valid_item(scn), max_size=4), label="items")
    sets = [t for _, _, t in items]
    params = resolve(SCENARIOS[scn].params, sets)
    last = {name: value for name, value, _ in items}
    for name, value in last.items():
        assert params[name] == value, (sets, name, params[name], value)
    outcome(scn, sets)


@pytest.mark.parametrize("scn", sorted(SCENARIOS))
@settings(max_examples=examples(40), **FUZZ)
@given(data=st.data())
def test_any_set_list_resolves_or_is_one_line(scn, data):
    """Any mix of valid, invalid and garbage items: a dict with every parameter, or one UsageError line; an item
    that is invalid on its own always makes it refuse."""
    kinds = st.sampled_from(["valid", "invalid", "garbage"])
    sets, must_fail = [], False
    for kind in data.draw(st.lists(kinds, max_size=4), label="kinds"):
        if kind == "valid":
            sets.append(data.draw(valid_item(scn))[2])
        elif kind == "invalid":
            sets.append(data.draw(invalid_item(scn)))
            must_fail = True
        else:
            sets.append(data.draw(garbage_item(scn)))
    r = outcome(scn, sets)
    if must_fail:
        assert isinstance(r, UsageError), f"accepted invalid input {sets!r}"


@pytest.mark.parametrize("scn,sets", [(s, x) for s, xs in CROSS_INVALID.items() for x in xs])
def test_combinations_validate_rejects(scn, sets):
    assert isinstance(outcome(scn, sets), UsageError), sets


@pytest.mark.parametrize("scn,item", [("smoke", "rate_mbps=nan"), ("pfc-hol", "duration_s=NaN"),
                                      ("incast", "senders=inf"), ("smoke", "red_min_bytes=1e999"),
                                      ("dctcp", "buffer_bytes=-inf")])
def test_non_finite_numbers_are_refused(scn, item):
    """Found by this test: NaN passed every range check, int('inf') raised OverflowError (a traceback)."""
    assert isinstance(outcome(scn, [item]), UsageError)


# ---- scenario parameters: the CLI end to end ---------------------------------------------------------------------

_CLI_GARBAGE = st.text(PRINTABLE, max_size=16)


@st.composite
def cli_bad_run(draw) -> tuple[str, list[str], list[str], bool]:
    """(scenario, argv after `testbed run SCENARIO`, its --set items, whether an item is invalid on its own)."""
    scn = draw(st.sampled_from(sorted(SCENARIOS)))
    sets = draw(st.lists(valid_item(scn).map(lambda t: t[2]), max_size=2))
    alone = draw(st.sampled_from([True, True, True, False]))
    if alone:
        item = draw(invalid_item(scn).filter(lambda t: "\udc80" not in t and "\udcff" not in t))
        sets.insert(draw(st.integers(0, len(sets))), item)
    else:
        sets += draw(st.sampled_from(CROSS_INVALID[scn]))
    argv = []
    for s in sets:
        argv += draw(st.sampled_from([[f"--set={s}"], ["--set", s]])) if not s.startswith("-") else [f"--set={s}"]
    extra = draw(st.sampled_from([[], [], ["--quiet"], ["--seed", "3"], ["--vm", "never"]]))
    return scn, argv + extra, sets, alone


@settings(max_examples=examples(60), **FUZZ)
@given(case=cli_bad_run())
def test_cli_refuses_bad_parameters(guarded, capsys, case):
    scn, argv, sets, alone = case
    r = outcome(scn, sets)
    if not alone:  # a valid item drawn before a cross-parameter pair can make the pair valid
        assume(isinstance(r, UsageError))
    assert isinstance(r, UsageError), f"accepted invalid input {sets!r}"  # never run main() on valid input
    assert_refused_by_cli(capsys, ["run", scn, *argv], reason=str(r))


@settings(max_examples=examples(20), **FUZZ)
@given(scn=st.sampled_from(sorted(SCENARIOS)),
       opts=st.sampled_from([["--seed", "abc"], ["--seed", "1.5"], ["--seed"], ["--vm", "sometimes"], ["--vm"],
                             ["--out"], ["--set"], ["--bogus"], ["--set", "x=1", "--nosuch", "2"]]))
def test_cli_refuses_bad_options(guarded, capsys, scn, opts):
    assert_refused_by_cli(capsys, ["run", scn, *opts])


@settings(max_examples=examples(20), **FUZZ)
@given(name=_CLI_GARBAGE.filter(lambda t: t not in SCENARIOS and not t.startswith("-")))
def test_cli_refuses_unknown_scenario(guarded, capsys, name):
    assert_refused_by_cli(capsys, ["run", name, "--set", "senders=2"])
