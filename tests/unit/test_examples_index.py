"""examples/README.md is the index of every example and every lab, one line each (as Mininet's examples/README):
each file under examples/ and each lab folder under labs/ is linked from it, and every link there exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
INDEX = EXAMPLES / "README.md"


def links() -> list[str]:
    """The index's link targets, as written (relative to examples/)."""
    return re.findall(r"\]\(([^)#\s]+)\)", INDEX.read_text())


def test_every_example_file_is_listed():
    listed = {(EXAMPLES / t).resolve() for t in links()}
    files = [p for p in EXAMPLES.rglob("*") if p.is_file() and p != INDEX and "__pycache__" not in p.parts]
    assert files, "examples/ has no files"
    missing = sorted(str(p.relative_to(EXAMPLES)) for p in files if p.resolve() not in listed)
    assert not missing, f"examples/README.md does not list: {', '.join(missing)}"


def test_every_lab_is_listed():
    listed = {(EXAMPLES / t).resolve() for t in links()}
    labs = [d for d in (ROOT / "labs").iterdir() if d.is_dir() and re.match(r"\d\d-", d.name)]
    assert len(labs) >= 11
    missing = sorted(d.name for d in labs if d.resolve() not in listed)
    assert not missing, f"examples/README.md does not list the labs: {', '.join(missing)}"


def test_every_link_exists_and_each_entry_is_one_line():
    stale = [t for t in links() if not (EXAMPLES / t).exists()]
    assert not stale, f"examples/README.md links to what does not exist: {', '.join(stale)}"
    entries = [line for line in INDEX.read_text().splitlines() if line.startswith("- [")]
    assert len(entries) == len(links()), "one link per entry line"
