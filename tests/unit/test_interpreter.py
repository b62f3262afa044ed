"""How a rank's command gets its Python (testbed.workloads.interpreter): a bare python/python3 or a .py file runs
under testbed's own interpreter, as torchrun runs its ranks; an interpreter named by path and other commands are
left as written."""

import pytest

from testbed.workloads.interpreter import rank_command

PY = "/opt/venv/bin/python"


@pytest.mark.parametrize("cmd, expect", [
    ("python3 examples/programs/ddp_train.py --steps 20", f"{PY} examples/programs/ddp_train.py --steps 20"),
    ("python train.py", f"{PY} train.py"),
    ("python3.11 -u train.py", f"{PY} -u train.py"),
    ("  python3 x.py", f"  {PY} x.py"),
    ("python3", PY),
    ("OMP_NUM_THREADS=2 A=b python3 x.py", f"OMP_NUM_THREADS=2 A=b {PY} x.py"),
    ("train.py --steps 5", f"{PY} train.py --steps 5"),
    ("examples/programs/mpi_allreduce.py", f"{PY} examples/programs/mpi_allreduce.py"),
    ("python3 -c 'import sys; print(1)'", f"{PY} -c 'import sys; print(1)'"),
])
def test_a_bare_python_or_a_script_gets_testbeds_interpreter(cmd, expect):
    assert rank_command(cmd, PY) == expect


@pytest.mark.parametrize("cmd", [
    "/usr/bin/python3 train.py",          # named by its path: the user's choice
    ".venv/bin/python train.py",
    "~/miniconda/bin/python3 train.py",
    "sh -c 'exec python3 train.py'",      # a python3 deeper in the line is the shell's
    "./a.out --n 4",
    "sleep 60",
    "pythonista x",                       # not a Python name
    "'python3' x.py",                     # quoted: the shell's to resolve
    "$PY x.py",
    "A='x y' python3 x.py",               # a quoted assignment: left alone rather than mis-split
    "",
])
def test_other_commands_are_left_as_written(cmd):
    assert rank_command(cmd, PY) == cmd


def test_an_interpreter_path_with_spaces_is_quoted_and_none_leaves_the_command():
    assert rank_command("python3 x.py", "/opt/my env/bin/python") == "'/opt/my env/bin/python' x.py"
    assert rank_command("python3 x.py", "") == "python3 x.py"


def test_the_default_is_the_interpreter_running_testbed():
    import sys

    assert rank_command("python3 x.py") == f"{sys.executable} x.py"
