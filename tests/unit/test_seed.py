"""A seed is an integer 0..2**32-1 (testbed.params.parse_seed, the `--seed` type of testbed run and testbed
sweep); anything else is argparse's one-line error, exit status 2."""

from __future__ import annotations

import argparse

import pytest

from testbed.commands import runner
from testbed.cli import build_parser
from testbed.params import SEED_MAX, parse_seed


@pytest.mark.parametrize("text,value", [("0", 0), ("1", 1), ("42", 42), (str(SEED_MAX), 2**32 - 1), (" 7 ", 7)])
def test_seed_in_range(text, value):
    assert parse_seed(text) == value


@pytest.mark.parametrize("text", ["-1", str(2**32), "abc", "", "1.5", "1e3", "+3", "0x10", "1_000", "٣"])
def test_seed_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"0\.\.4294967295"):
        parse_seed(text)


def test_run_and_sweep_parsers_use_it(capsys):
    assert runner._options(["--seed", "0"]).seed == 0
    assert runner._options(["--seed", str(SEED_MAX)]).seed == SEED_MAX
    assert runner._options([]).seed == 1
    p = build_parser()
    assert p.parse_args(["sweep", "smoke", "--seed", str(SEED_MAX)]).seed == SEED_MAX
    for bad in ("-1", str(2**32), "abc"):
        for argv in (["--seed", bad], ["sweep", "smoke", "--seed", bad]):
            with pytest.raises(SystemExit) as e:
                runner._options(argv) if argv[0] == "--seed" else p.parse_args(argv)
            assert e.value.code == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and "seed" in err, err
