"""An output folder that cannot be written (testbed.rundir.check_out_dir) is refused in one line, before
anything is created; one that can is accepted and not created."""

from __future__ import annotations

import os

import pytest

from testbed.errors import UsageError
from testbed.rundir import check_out_dir


# ---------------------------------------------------------------------------------------------- check_out_dir

def _refused(path, *words, flag="--out"):
    with pytest.raises(UsageError) as e:
        check_out_dir(path, flag)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(flag), msg
    for w in words:
        assert w in msg, msg
    return msg


def test_a_missing_chain_under_a_writable_folder_is_accepted_and_not_created(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    assert check_out_dir(out) == out
    assert check_out_dir(str(out)) == out
    assert not (tmp_path / "a").exists()


def test_an_existing_writable_folder_is_accepted(tmp_path):
    assert check_out_dir(tmp_path) == tmp_path


def test_relative_and_dotdot_paths_are_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_out_dir("x/y") == tmp_path / "x" / "y"
    assert check_out_dir(f"{tmp_path}/x/../z") == tmp_path / "z"


def test_a_file_in_the_way_is_refused(tmp_path):
    f = tmp_path / "afile"
    f.write_text("")
    _refused(f, str(f), "not a directory")
    _refused(f / "run", str(f), "not a directory")
    _refused(f / "a" / "b" / "run", str(f), "not a directory")
    assert f.read_text() == ""


@pytest.mark.parametrize("path", ["/proc/forbidden", "/proc", "/sys", "/sys/x", "/sys/class/net/x/y",
                                  "/proc/../sys/z"])
def test_kernel_filesystems_are_refused(path):
    root = "/proc" if path.startswith("/proc") and "sys" not in path else "/sys"
    _refused(path, f"inside {root}")


def test_a_symlink_into_proc_is_refused(tmp_path):
    (tmp_path / "link").symlink_to("/proc/self")
    _refused(tmp_path / "link" / "run", "inside /proc", "/proc/")


def test_names_like_proc_are_not_kernel_filesystems(tmp_path):
    for name in ("proc", "sys", "procx"):
        assert check_out_dir(tmp_path / name / "run") == tmp_path / name / "run"


def test_a_folder_that_is_not_writable_is_refused(tmp_path, monkeypatch):
    seen = []

    def access(path, mode):
        seen.append((str(path), mode))
        return False

    monkeypatch.setattr(os, "access", access)
    msg = _refused(tmp_path / "a" / "run", str(tmp_path), "nearest existing folder", "not writable")
    assert seen == [(str(tmp_path), os.W_OK | os.X_OK)]  # asked of the nearest existing ancestor only
    assert "read-only" not in msg
    _refused(tmp_path, "not writable")


def test_a_read_only_filesystem_is_named(tmp_path, monkeypatch):
    class Vfs:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(os, "statvfs", lambda path: Vfs())
    _refused(tmp_path / "run", "read-only filesystem")


def test_other_impossible_paths_are_one_line(tmp_path):
    _refused("", "empty")
    _refused(tmp_path / ("n" * 300) / "run", "too long")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(UsageError):
        check_out_dir(tmp_path / "loop" / "run")


def test_the_flag_is_named(tmp_path):
    _refused("/proc/x", "RUN_DIR", flag="RUN_DIR")
