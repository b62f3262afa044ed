"""The layering contracts (import-linter, pyproject.toml [tool.importlinter]) and ruff hold for the checkout.

scripts/test.sh runs both as its first step; this test makes `pytest tests/unit` catch a regression too (a cycle,
a forbidden import such as traffic -> testbed, an unused import, a function over the complexity limit).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the virtualenv's bin: scripts/install.sh installs both with `-e .[dev]`


@pytest.mark.parametrize("argv", [["lint-imports", "--no-cache"], ["ruff", "check", "--no-cache", "."]],
                         ids=["import-linter", "ruff"])
def test_lint_passes(argv):
    tool = BIN / argv[0]
    assert tool.exists(), f"{tool} is missing: run scripts/install.sh (installs the dev extras)"
    r = subprocess.run([str(tool), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(argv)} failed:\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}"
