"""Property-based fuzzing of bad input (issue 11, item 6): scenario parameters and topology files.

Every input either resolves (scenario parameters: a dict with every parameter; topology documents: a spec whose
derived plan evaluates) or is refused with one line: UsageError / SpecError, never another exception. Invalid
`testbed run` command lines are also driven through the real CLI in-process: exit 2, one line on stderr, and no
namespace created. main() is only called with input that resolve + validate refused in-process first, and with
namespace creation, the run and the VM path replaced by functions that fail the test.

Pure: nothing is created on the system (the module fixture compares the namespace list before and after). The
examples are derandomized (no database) so CI is reproducible; the file runs in a few seconds.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from testbed.errors import UsageError
from testbed.params import Param, parse_number, resolve
from testbed.scenario import all_scenarios
from topologies import (DumbbellSpec, LeafSpineSpec, SpecError, from_dict, load_topology, loads_toml,
                        loads_yaml)

SCENARIOS = {s.name: s for s in all_scenarios()}

#: TESTBED_FUZZ_SCALE=20 multiplies every example count for a deeper local run (CI uses the default, 1).
_SCALE = float(os.environ.get("TESTBED_FUZZ_SCALE", "1"))


def examples(n: int) -> int:
    return max(1, int(n * _SCALE))


FUZZ = dict(deadline=None, derandomize=True, database=None, print_blob=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                   HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])


def one_line(msg: str) -> None:
    assert msg.strip(), "empty error message"
    assert "\n" not in msg and "\r" not in msg, f"multi-line error message: {msg!r}"


# ---- nothing is created -------------------------------------------------------------------------------------------


def _namespaces() -> set[str]:
    names = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    if shutil.which("ip"):
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
        names |= {line.split()[0] for line in out.splitlines() if line.strip()}
    return names


def _another_runs(name: str) -> bool:
    """A namespace of a run another process is doing at the same time (a shared development host): its run state
    file names a pid other than ours. CI runs the unit layer alone, where this never applies."""
    import json

    from testbed.kernel.state import STATE_DIR

    parts = name.split("-")
    if len(parts) < 3 or parts[0] != "tb":
        return False
    try:
        pid = json.loads((STATE_DIR / f"{parts[1]}.json").read_text())["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return pid != os.getpid()


@pytest.fixture(scope="module", autouse=True)
def no_namespace_created():
    before = _namespaces()
    yield
    new = {n for n in _namespaces() - before if not _another_runs(n)}
    if new:  # a concurrent run may have ended between the listing and the state check: look once more
        new = {n for n in new & _namespaces() if not _another_runs(n)}
    assert not new, f"namespaces appeared during the fuzz tests: {sorted(new)}"


def _forbidden(what):
    def fail(*a, **kw):
        raise AssertionError(f"{what} called for bad input {a!r}")
    return fail


@pytest.fixture
def guarded(monkeypatch):
    """main() with namespace creation, the run itself and the lab VM replaced by failures, and a non-root euid:
    bad input must be refused before the root check (a "needs root" line would mean it was not)."""
    import pyroute2.netns

    import testbed.kernel.netns
    import testbed.vm.labvm
    import testbed.commands.runner

    monkeypatch.setattr(testbed.kernel.netns, "create", _forbidden("testbed.kernel.netns.create"))
    monkeypatch.setattr(pyroute2.netns, "create", _forbidden("pyroute2.netns.create"))
    # belt and braces (raising=False: a renamed function must not break the suite; the euid below still stops it)
    monkeypatch.setattr(testbed.commands.runner, "run_scenario", _forbidden("testbed.commands.runner.run_scenario"),
                        raising=False)
    monkeypatch.setattr(testbed.commands.runner, "use_vm", _forbidden("testbed.commands.runner.use_vm"), raising=False)
    monkeypatch.setattr(testbed.vm.labvm, "run", _forbidden("testbed.vm.labvm.run"), raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    from testbed.cli import main

    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's errors end the process with status 2 (cli._Parser.error)
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_refused_by_cli(capsys, argv: list[str], reason: str | None = None) -> None:
    rc, out, err = run_cli(capsys, argv)
    assert rc == 2, (argv, rc, out, err)
    assert out == "", (argv, out)
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), (argv, err)
    one_line(lines[0])
    assert "needs root" not in lines[0], f"bad input reached the root check: {argv!r}: {lines[0]}"
    if reason is not None:
        assert lines[0].endswith(reason), (argv, lines[0], reason)


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

# characters a command line can carry: no NUL; lone surrogates only as surrogateescape produces them
_ARGV_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00") | st.sampled_from(
    ["\udc80", "\udcff", "\n", "\r", "\t", " ", "=", ",", ":", ">", "-", "_", ".", "K", "e"])
_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7e) | st.sampled_from(["\n", "\t", "\r", "é"])
garbage = st.text(_ARGV_CHARS, max_size=20)


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


def outcome(scn: str, sets: list[str]) -> dict | UsageError:
    """resolve + validate: the resolved dict, or the UsageError (checked to be one line). Any other exception
    propagates and fails the test with the input that caused it."""
    s = SCENARIOS[scn]
    try:
        params = resolve(s.params, sets)
        s.validate(params)
    except UsageError as e:
        one_line(str(e))
        return e
    assert set(params) == {p.name for p in s.params}, sets
    return params


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

_CLI_GARBAGE = st.text(_PRINTABLE, max_size=16)


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


# ---- topology documents ------------------------------------------------------------------------------------------

_RATES = st.sampled_from([0.01, 0.5, 1, 10, 20.0, 100, 1000, 40000, 100_000])


@st.composite
def link_doc(draw, mtu: st.SearchStrategy[int]) -> dict:
    d = {"rate_mbps": draw(_RATES | st.floats(0.01, 100_000))}
    if draw(st.booleans()):
        delay = draw(st.sampled_from([0, 0.05, 1, 10.0, 10_000]))
        d["delay_ms"] = delay
        if draw(st.booleans()):
            d["jitter_ms"] = draw(st.floats(0, delay))
    if draw(st.booleans()):
        d["loss_percent"] = draw(st.sampled_from([0, 0.1, 1, 50, 100]))
    d["mtu"] = draw(mtu)
    return d


@st.composite
def queue_doc(draw, frame: int) -> dict:
    """A queue that holds at least one frame of ``frame`` bytes."""
    disc = draw(st.sampled_from(["droptail", "red", "step"]))
    buf = draw(st.integers(max(frame, 20_000), 4_000_000))
    if disc == "droptail":
        if draw(st.booleans()):
            return {"discipline": disc, "buffer_packets": draw(st.integers(max(7, -(-frame // 1500)), 10_000))}
        return {"discipline": disc, "buffer_bytes": buf}
    if disc == "red":
        lo = draw(st.integers(1, buf - 1))
        hi = draw(st.integers(lo + 1, buf))
        d = {"discipline": disc, "buffer_bytes": buf, "min_bytes": lo, "max_bytes": hi,
             "probability": draw(st.sampled_from([0.01, 0.1, 1.0])), "ecn": draw(st.booleans())}
        if draw(st.booleans()):
            d["burst_packets"] = draw(st.integers(1, 100))
        return d
    return {"discipline": disc, "buffer_bytes": buf, "k_bytes": draw(st.integers(1, buf - 1))}


def tcp_doc() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional={
        "congestion_control": st.sampled_from(["cubic", "reno", "bbr"]),
        "rto_min_ms": st.integers(1, 120_000),
        "tcp_rmem_bytes": st.just([4096, 131072, 6291456]),
    })


@st.composite
def classes_doc(draw, frame: int) -> list[dict]:
    n = draw(st.integers(0, 3))
    if n == 0:
        return []
    out = []
    for i in range(n):
        c = {"name": f"c{i}", "dscp": [i * 8, i * 8 + 1], "default": i == 0}
        if draw(st.booleans()):
            c["priority"] = i
        else:
            c["weight"] = draw(st.integers(1, 1000))
        if i > 0 and draw(st.booleans()):
            c.update(lossless=True, pcp=i, xoff_bytes=10_000, xon_bytes=5_000, headroom_bytes=5_000,
                     queue={"discipline": "droptail", "buffer_bytes": max(frame, 20_000)})
        out.append(c)
    return out


@st.composite
def valid_topology_doc(draw) -> dict:
    """A document that must load: small fabrics, values inside every documented range."""
    kind = draw(st.sampled_from(["leafspine", "dumbbell"]))
    host_mtu = draw(st.sampled_from([576, 1500, 4000, 9000]))
    edge = draw(link_doc(st.just(host_mtu)))
    core = draw(link_doc(st.sampled_from([m for m in (1500, 9000) if m >= host_mtu])))
    frame = max(edge["mtu"], core["mtu"]) + 14
    doc: dict = {"kind": kind} if kind == "dumbbell" or draw(st.booleans()) else {}
    if kind == "leafspine":
        doc.update(spines=draw(st.integers(1, 3)), leaves=draw(st.integers(1, 4)),
                   hosts_per_leaf=draw(st.integers(1, 4)), host_link=edge, fabric_link=core)
        qfields = ["host_queue", "leaf_down_queue", "leaf_up_queue", "spine_queue"]
        if draw(st.booleans()):
            doc["load_balancing"] = draw(st.sampled_from(["ecmp", "spray"]))
    else:
        doc.update(senders=draw(st.integers(1, 6)), sender_link=edge, bottleneck_link=core)
        if draw(st.booleans()):
            doc["receivers"] = draw(st.integers(1, 3))
        if draw(st.booleans()):
            doc["receiver_link"] = draw(link_doc(st.just(host_mtu)))
        qfields = ["bottleneck_queue", "switch_queue", "host_queue"]
    for q in qfields:
        if draw(st.booleans()):
            doc[q] = draw(queue_doc(frame))
    classes = draw(classes_doc(frame))
    if classes:
        doc["classes"] = classes
        for q in qfields:  # a lossless class on a tier queue: that queue must not drop early and must fit it
            if q in doc and (doc[q]["discipline"] == "red" and not doc[q]["ecn"]
                             or doc[q].get("buffer_bytes", 10**9) < 20_000):
                doc[q] = {"discipline": "droptail", "buffer_bytes": 262_144}
    if draw(st.booleans()):
        doc["tcp"] = draw(tcp_doc())
    if draw(st.booleans()):
        doc["seed"] = draw(st.integers(0, 2**32 - 1))
    if draw(st.booleans()):
        doc["prefix"] = draw(st.from_regex(r"[a-z][a-z0-9]{0,7}", fullmatch=True))
    return doc


_WRONG = st.sampled_from([None, True, False, -1, 0, -5.5, 10**12, 1e308, float("inf"), float("nan"), "", "x",
                          "10", "1K", [], [1], {}, {"a": 1}, "a\nb", ["a\nb"]])


@st.composite
def mutated_doc(draw) -> object:
    """A valid document with one to three mutations at random places of its tree."""
    doc = draw(valid_topology_doc())
    for _ in range(draw(st.integers(1, 3))):
        doc = _mutate(draw, doc)
    return doc


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def _mutate(draw, doc):
    path = draw(st.sampled_from(list(_paths(doc))))
    op = draw(st.sampled_from(["wrong", "wrong", "negative", "unknown_key", "delete", "nest", "unnest", "kind",
                               "rename"]))
    if not path:
        if op == "kind":
            return {**doc, "kind": draw(st.sampled_from(["LeafSpine", "fattree", "", 1, None, ["dumbbell"]]))} \
                if isinstance(doc, dict) else doc
        return draw(_WRONG) if op == "wrong" else [doc] if op == "nest" else doc
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    key, value = path[-1], parent[path[-1]]
    if op == "wrong":
        parent[key] = draw(_WRONG)
    elif op == "negative" and isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = -value if value else -1
    elif op == "unknown_key" and isinstance(value, dict):
        value[draw(st.sampled_from(["rate", "Rate_mbps", "bogus", "", "a\nb", "mtu "]))] = 1
    elif op == "delete" and isinstance(parent, dict):
        del parent[key]
    elif op == "nest":
        parent[key] = {"value": value} if draw(st.booleans()) else [value]
    elif op == "unnest" and isinstance(value, dict) and value:
        parent[key] = next(iter(value.values()))
    elif op == "rename" and isinstance(parent, dict):
        parent[draw(st.sampled_from([f"{key}s", str(key).upper(), f"{key}_", "x" + str(key)]))] = parent.pop(key)
    return doc


def _toml_value(v) -> str:
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(type(v))


def _toml_key(k) -> str:
    import json

    return json.dumps(str(k))


def to_toml(doc: dict) -> str:
    """TOML text of a document (top-level keys, nested values inline; None is left out: TOML has no null)."""
    return "".join(f"{_toml_key(k)} = {_toml_value(v)}\n" for k, v in doc.items() if v is not None)


def check_plan(spec) -> None:
    """The derived plan a builder consumes evaluates without exception."""
    assert isinstance(spec, (LeafSpineSpec, DumbbellSpec))
    nodes, links = spec.nodes, spec.links
    assert nodes and links
    spec.addresses
    spec.routes
    assert len(spec.egress_ports()) == 2 * len(links)
    spec.describe()


def load_outcome(load, arg):
    try:
        spec = load(arg)
    except SpecError as e:
        one_line(str(e))
        return e
    check_plan(spec)
    return spec


@settings(max_examples=examples(60), **FUZZ)
@given(doc=valid_topology_doc(), fmt=st.sampled_from(["dict", "toml", "yaml"]))
def test_valid_topology_documents_load_and_plan(doc, fmt):
    import yaml

    if fmt == "dict":
        r = load_outcome(from_dict, doc)
    elif fmt == "toml":
        r = load_outcome(loads_toml, to_toml(doc))
    else:
        r = load_outcome(loads_yaml, yaml.safe_dump(doc))
    assert not isinstance(r, SpecError), f"{doc!r} refused: {r}"


@settings(max_examples=examples(150), **FUZZ)
@given(doc=mutated_doc(), fmt=st.sampled_from(["dict", "toml", "yaml"]))
def test_mutated_topology_documents_load_or_refuse_in_one_line(doc, fmt):
    import yaml

    if fmt == "dict":
        load_outcome(from_dict, doc)
    elif fmt == "toml":
        if not isinstance(doc, dict):
            return
        load_outcome(loads_toml, to_toml(doc))
    else:
        load_outcome(loads_yaml, yaml.safe_dump(doc))


_SYNTAX = st.sampled_from(["[", "]]", "=", "spines = ", "spines = 2\nspines = 3", "[host_link\n", "a.b.c = 1",
                           "{", "- x", ": :", "key: [1, 2", "'", '"', "\t", "!!python/object:os.system x",
                           "&a [*a]", "spines: &x 1\nleaves: *x", "---\n---", "\x7f", "\ufeff", "\\", "1979-05-27",
                           "[[classes]]\nname = 'x'", "kind = 'dumbbell'\n[[classes]]", "%YAML 9.9\n---"])


@settings(max_examples=examples(80), **FUZZ)
@given(parts=st.lists(_SYNTAX | st.text(_ARGV_CHARS.filter(lambda c: c not in "\udc80\udcff"), max_size=30),
                      max_size=5),
       valid=st.none() | valid_topology_doc(), fmt=st.sampled_from(["toml", "yaml"]))
def test_broken_syntax_is_one_line(parts, valid, fmt):
    import yaml

    base = "" if valid is None else (to_toml(valid) if fmt == "toml" else yaml.safe_dump(valid))
    text = base + "\n".join(parts)
    load_outcome(loads_toml if fmt == "toml" else loads_yaml, text)


@settings(max_examples=examples(20), **FUZZ)
@given(doc=st.none() | mutated_doc(), suffix=st.sampled_from([".toml", ".yaml", ".yml", ".json", "", ".TOML"]),
       name=st.sampled_from(["topo", "a b", "new\nline", "t\u00e9"]))
def test_topology_files_load_or_refuse_in_one_line(tmp_path, doc, suffix, name):
    import yaml

    path = tmp_path / f"{name}{suffix}"
    if doc is not None and isinstance(doc, dict):
        path.write_text(to_toml(doc) if suffix.lower() == ".toml" else yaml.safe_dump(doc), encoding="utf-8")
    elif doc is not None:
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    load_outcome(load_topology, path)


def test_topology_file_unreadable_is_one_line(tmp_path):
    for p in (tmp_path / "missing.toml", tmp_path, tmp_path / "bin.toml", tmp_path / "bin.yaml"):
        if p.name.startswith("bin"):
            p.write_bytes(b"\xff\xfe\x00garbage")
        r = load_outcome(load_topology, p)
        assert isinstance(r, SpecError) and str(p) in str(r), (p, r)


# ---- files given to a scenario, through the CLI ------------------------------------------------------------------


def _file_params() -> list[tuple[str, str]]:
    """(scenario, parameter) of every parameter that names a file (free text ending in _file, or a topology
    parameter without fixed choices)."""
    return [(s.name, p.name) for s in SCENARIOS.values() for p in s.params
            if p.kind is str and not p.choices and (p.name.endswith("_file") or "topology" in p.name)]


@settings(max_examples=examples(15), **FUZZ)
@given(content=st.sampled_from(["", "{", "[]", "null", '{"ranks": 2}', "garbage\n", '{"format": "x"}',
                                "\xff"]) | st.text(_PRINTABLE, max_size=40),
       where=st.sampled_from(["file", "missing", "dir"]))
def test_cli_refuses_bad_scenario_files(guarded, capsys, tmp_path_factory, content, where):
    """The files a scenario takes: collective's schedule_file and topology_file (incast's `topology` is a shape,
    leafspine|dumbbell). A bad one is one line, exit 2, nothing built; a topology file path where a shape is
    expected is refused the same way."""
    d = tmp_path_factory.mktemp("files")
    topo = d / "topo.toml"
    topo.write_text("spines = -1\n")
    assert_refused_by_cli(capsys, ["run", "incast", "--set", f"topology={topo}"])
    for scn, name in _file_params():
        path = d / f"{scn}-{name}{'.toml' if 'topology' in name else '.json'}"  # the suffix its loader reads
        if where == "file":
            path.write_text(content, encoding="utf-8", errors="surrogateescape")
        elif where == "dir":
            path.mkdir()
        r = outcome(scn, [f"{name}={path}"])
        if not isinstance(r, UsageError):
            continue  # a content that happens to be a valid file: never run it
        assert_refused_by_cli(capsys, ["run", scn, "--set", f"{name}={path}"], reason=str(r))


# ---- dcqcn with a topology file: checked at the rate and on the queues the install will find ----------------------

DCQCN_TOPOLOGY = """kind = "leafspine"
spines = 1
leaves = 2
hosts_per_leaf = 2

[host_link]
rate_mbps = 20

[fabric_link]
rate_mbps = 20

[leaf_down_queue]
discipline = "step"
buffer_bytes = 100000
k_bytes = 20000
"""


def _dcqcn_outcome(tmp_path, extra: str, *sets: str) -> dict | UsageError:
    (tmp_path / "topo.toml").write_text(DCQCN_TOPOLOGY + extra)
    return outcome("collective", ["transport=rdma", "rdma_timeout=20", "dcqcn=on",
                                  f"topology_file={tmp_path / 'topo.toml'}", *sets])


def test_dcqcn_min_rate_is_checked_against_a_host_port_rate_override(tmp_path):
    assert isinstance(_dcqcn_outcome(tmp_path, "", "dcqcn_min_rate_mbps=8"), dict)  # under 20 Mbit/s: fine
    slow = '\n[[ports]]\nport = "h1:eth0"\nrate_mbps = 5\n'  # h1's NIC at 5: DCQCN runs at the slowest host NIC
    r = _dcqcn_outcome(tmp_path, slow, "dcqcn_min_rate_mbps=8")
    assert isinstance(r, UsageError) and "min_rate_kbps" in str(r), r


def test_dcqcn_on_refuses_host_nic_queues_fq_could_not_put_back(tmp_path):
    red = ('\n[host_queue]\ndiscipline = "red"\nbuffer_bytes = 100000\nmin_bytes = 20000\nmax_bytes = 60000\n'
           'probability = 0.1\necn = true\n')
    r = _dcqcn_outcome(tmp_path, red)
    assert isinstance(r, UsageError) and "drop-tail host NIC queues" in str(r) and "red" in str(r), r
    assert isinstance(_dcqcn_outcome(tmp_path, red, "dcqcn=mark"), dict)  # mark leaves the host queues alone
