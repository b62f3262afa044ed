"""Which Python a rank's command runs under: the interpreter testbed itself runs on, as ``torchrun`` does.

``torchrun train.py`` starts every rank as ``[sys.executable, train.py]``: the ranks get torchrun's own interpreter,
whatever ``python3`` the shell's PATH finds first (a pyenv shim, a conda or virtualenv python without torch or
mpi4py). A program's ``cmd`` is a shell command line, so the same rule is applied to its first word:

* ``python``, ``python3`` or ``python3.11`` (a bare name, looked up on PATH) becomes this interpreter;
* a ``.py`` file as the command (``train.py --steps 5``) runs under this interpreter;
* an interpreter named by its path (``/usr/bin/python3``, ``.venv/bin/python``) and any other command (``sh -c
  ...``, ``./a.out``) are left as written: a ``python3`` deeper in the line is the shell's, found on PATH.

Leading ``NAME=value`` assignments (``OMP_NUM_THREADS=2 python3 x.py``) are kept before the command.
"""

from __future__ import annotations

import re
import shlex
import sys

#: a bare Python name as the shell would look it up on PATH
PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")
#: leading whitespace, NAME=value assignments (unquoted), the first word, the rest
_HEAD = re.compile(r"(\s*(?:[A-Za-z_][A-Za-z0-9_]*=[^\s'\"]*\s+)*)([^\s]+)(.*)", re.DOTALL)


def rank_command(cmd: str, python: str | None = None) -> str:
    """``cmd`` with its Python resolved to ``python`` (default: ``sys.executable``, the interpreter testbed runs
    on); see the module docstring. Unchanged when there is no interpreter to give or the head is quoted."""
    python = sys.executable if python is None else python
    m = _HEAD.fullmatch(cmd)
    if not python or m is None:
        return cmd
    lead, word, rest = m.groups()
    if any(c in word for c in "'\"\\$`"):
        return cmd  # a quoted or computed command word: the shell's to resolve
    if PYTHON_NAME.fullmatch(word):
        return f"{lead}{shlex.quote(python)}{rest}"
    if word.endswith(".py"):
        return f"{lead}{shlex.quote(python)} {word}{rest}"
    return cmd

