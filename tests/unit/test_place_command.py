"""`testbed place`: admission control from the command line, on burn-in's real health files; nothing is built, so
these run without root. Exit status 0 placed, 3 held, 4 refused, 2 bad input."""

from __future__ import annotations

import pytest

from testbed.cli import main

FIX = "tests/fixtures/burnin"
FAB = ["--set", "hosts_per_leaf=4"]


def run(capsys, *argv: str) -> tuple[int, list[str], str]:
    rc = main(["place", *argv])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def test_placed_off_the_flagged_host(capsys):
    rc, out, _ = run(capsys, *FAB, "--set", "ranks=4", "--health", f"{FIX}/slow-h2-health.json")
    assert rc == 0 and out[0] == "placed: 4 ranks on h5, h6, h7, h8 (leaf2; 0 spine crossings, topo)"
    assert [line.split()[1] for line in out[2:]] == ["h5", "h6", "h7", "h8"]


def test_held_while_busy(capsys):
    rc, out, _ = run(capsys, *FAB, "--set", "ranks=6", "--busy", "h5,h6", "--health", f"{FIX}/slow-h2-health.json")
    assert rc == 3 and out[0].startswith("held: 6 ranks need 6 healthy hosts; 5 of the 7 healthy are free")


def test_refused_with_the_reason(capsys):
    rc, out, _ = run(capsys, *FAB, "--set", "ranks=8", "--health", f"{FIX}/slow-h2-health.json")
    assert rc == 4 and len(out) == 1
    assert out[0].startswith("refused: 8 ranks need 8 healthy hosts; 7 are healthy (h2: tx_mbps 4.78 Mbit/s")
    rc, out, _ = run(capsys, *FAB, "--set", "ranks=6", "--health", f"{FIX}/slow-link-health.json")
    assert rc == 4 and "across the spine" in out[0] and "leaf2-spine1" in out[0]
    rc, out, _ = run(capsys, *FAB, "--set", "ranks=8", "--set", "max_spine_crossings=1")
    assert rc == 4 and out == ["refused: its ring would cross the spine 2 times (topo on 2 leaves); at most 1 allowed"]


def test_tp_groups_stay_in_a_server(capsys):
    rc, out, _ = run(capsys, *FAB, "--set", "ranks=8", "--set", "gpus_per_host=2", "--set", "tp=2")
    assert rc == 0 and [line.split()[1] for line in out[2:]] == ["h1", "h1", "h2", "h2", "h3", "h3", "h4", "h4"]


@pytest.mark.parametrize("argv, msg", [
    (["--set", "ranks=4", "--health", f"{FIX}/slow-h2-health.json"], "host h5 is not in this fabric"),
    (["--set", "ranks=4", "--busy", "h9"], "--busy: unknown host 'h9'"),
    (["--set", "ranks=3", "--set", "tp=2"], "tp, ep: ranks (3) must be a multiple of tp x ep"),
    (["--set", "placement=best"], "placement: must be one of"),
    (["--topo", "examples/topology-files/slow-spine-port.toml", "--set", "leaves=3"], "exclude each other"),
    (["--health", "/nonexistent/health.json"], "No such file"),
])
def test_bad_input_is_one_line_and_status_2(capsys, argv, msg):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == [] and msg in err and err.count("\n") == 1


def test_the_documented_place_commands_give_the_documented_decisions(capsys):
    """docs/operations.md's `testbed place` lines, in order: placed, held, refused three times (its table)."""
    import re
    import shlex
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    lines = [ln.split(" #", 1)[0].strip() for block in re.findall(r"```sh\n(.*?)```", doc, re.S)
             for ln in block.splitlines() if ln.startswith("testbed place")]
    codes = []
    for line in lines:
        codes.append(main(shlex.split(line)[1:]))
        out = capsys.readouterr().out.splitlines()
        assert out and out[0].split(":")[0] in ("placed", "held", "refused") and out[0] in doc, line
    assert codes == [0, 3, 4, 4, 4]
