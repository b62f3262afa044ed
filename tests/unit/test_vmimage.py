"""The lab VM's Python image: which trees go in, when it is rebuilt, what the guest runs to use it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from testbed.vm import image as vmimage


def test_trees_are_the_interpreters_own_and_not_nested():
    trees = vmimage.python_trees()
    assert Path(sysconfig.get_paths()["stdlib"]).resolve() in trees
    assert Path(sysconfig.get_paths()["purelib"]).resolve() in trees
    for a in trees:
        assert a.is_dir()
        assert not any(a != b and a.is_relative_to(b) for b in trees)


def test_fingerprint_changes_when_a_package_appears_or_is_replaced(tmp_path):
    (tmp_path / "pkg").mkdir()
    before = vmimage.fingerprint([tmp_path])
    assert vmimage.fingerprint([tmp_path]) == before
    (tmp_path / "newpkg").mkdir()
    after = vmimage.fingerprint([tmp_path])
    assert after != before
    st = (tmp_path / "pkg").stat()
    os.utime(tmp_path / "pkg", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert vmimage.fingerprint([tmp_path]) != after


def test_guest_script_binds_every_tree_at_its_own_path():
    trees = [Path("/usr/lib/python3.11"), Path("/x/.venv/lib/python3.11/site-packages")]
    s = vmimage.guest_script(trees, Path("/var/cache/testbed/mplconfig"))
    assert f"mount -t ext4 -o ro,noload \"$tbdev\" {vmimage.MOUNT_POINT}" in s
    assert f"mount --bind {vmimage.MOUNT_POINT}/0 /usr/lib/python3.11" in s
    assert f"mount --bind {vmimage.MOUNT_POINT}/1 /x/.venv/lib/python3.11/site-packages" in s
    assert "cp /var/cache/testbed/mplconfig/fontlist-*.json /root/.cache/matplotlib/" in s
    assert "readonly=on" in " ".join(vmimage.qemu_args(Path("/c/vm-python.ext4")))


def test_image_holds_the_trees_and_is_rebuilt_only_when_they_change(tmp_path, monkeypatch):
    src = tmp_path / "site"
    (src / "mod").mkdir(parents=True)
    (src / "mod" / "__init__.py").write_text("X = 1\n")
    monkeypatch.setattr(vmimage, "python_trees", lambda: [src])
    monkeypatch.setattr(vmimage, "font_cache", lambda d: None)
    said = []
    image, trees = vmimage.ensure_image(tmp_path / "cache", said.append)
    assert trees == [src] and image.stat().st_size > 0 and len(said) == 1
    debugfs = shutil.which("debugfs") or "/usr/sbin/debugfs"
    out = subprocess.run([debugfs, "-R", "cat /0/mod/__init__.py", str(image)], capture_output=True, text=True)
    assert out.stdout == "X = 1\n"
    vmimage.ensure_image(tmp_path / "cache", said.append)
    assert len(said) == 1  # unchanged trees: the image is reused
    (src / "other").mkdir()
    vmimage.ensure_image(tmp_path / "cache", said.append)
    assert len(said) == 2  # a new package: rebuilt
    assert not list((tmp_path / "cache").glob("*.staging"))
