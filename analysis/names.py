"""Node and port names in the order people count them: ``h2`` before ``h10``, ``s1:r2`` before ``s1:r10``."""

from __future__ import annotations

import re


def natural_key(name: str) -> tuple:
    """Sort key that compares the digit runs of ``name`` as numbers and the rest as text."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
