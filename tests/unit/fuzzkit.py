"""Shared pieces of the property-based fuzzing of bad input (issue 11, item 6): the example budget, the fixture
that proves nothing was created, the guarded CLI, the one-line checks, the command-line alphabets and resolve +
validate as one outcome. The tests are in test_fuzz_parameters.py (scenario parameters, the CLI) and
test_fuzz_topology_documents.py (topology documents and the files a scenario takes).

Every input either resolves (scenario parameters: a dict with every parameter; topology documents: a spec whose
derived plan evaluates) or is refused with one line: UsageError / SpecError, never another exception. Invalid
`testbed run` command lines are also driven through the real CLI in-process: exit 2, one line on stderr, and no
namespace created. main() is only called with input that resolve + validate refused in-process first, and with
namespace creation, the run and the VM path replaced by functions that fail the test.

Pure: nothing is created on the system (the module fixture compares the namespace list before and after). The
examples are derandomized (no database) so CI is reproducible; each file runs in a few seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck
from hypothesis import strategies as st

from testbed.errors import UsageError
from testbed.params import resolve
from testbed.scenario import all_scenarios

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


# characters a command line can carry: no NUL; lone surrogates only as surrogateescape produces them
ARGV_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00") | st.sampled_from(
    ["\udc80", "\udcff", "\n", "\r", "\t", " ", "=", ",", ":", ">", "-", "_", ".", "K", "e"])
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7e) | st.sampled_from(["\n", "\t", "\r", "é"])
garbage = st.text(ARGV_CHARS, max_size=20)


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
