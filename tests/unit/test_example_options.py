"""examples/ecmp_collision.py refuses options it cannot run: one line on stderr and exit status 2, before any lab
is built (so nothing is left behind, and no root is needed to see the refusal)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def example():
    spec = importlib.util.spec_from_file_location("ecmp_collision_example", ROOT / "examples" / "ecmp_collision.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("args, says", [
    (["--no-spray", "--no-adaptive"], "--no-spray and --no-adaptive together"),
    (["--tries", "0"], "--tries 0: must be at least 1"),
    (["--seconds", "0"], "--seconds 0: must be above 0"),
])
def test_a_run_that_cannot_compare_is_refused_before_any_lab(tmp_path, capsys, args, says):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        example().main(["--out", str(out), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ecmp_collision.py: error: ") and says in err, err
    assert not out.exists()


@pytest.mark.parametrize("args, runs", [([], (False, False)), (["--no-adaptive"], (False, True)),
                                        (["--no-spray"], (True, False))])
def test_either_comparison_alone_is_accepted(args, runs):
    a = example().parse_args(args)
    assert (a.no_spray, a.no_adaptive) == runs
