"""The README's Quick start as written, in a root shell without sudo (this machine has none, and a stub on PATH
proves nothing calls it), and as a user: the scripts re-run themselves under sudo, or say in one line that they
cannot. The `testbed` launcher on PATH refuses a user who cannot reach the installation in one line."""

import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def quick_start():
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```(?:sh|bash)?\n(.*?)```", section, re.S)[0]
    return [ln.strip() for ln in block.splitlines() if ln.strip()]


def stub_sudo(tmp_path: Path) -> tuple[Path, Path]:
    """A `sudo` that records its arguments and fails: on PATH first, it shows whether a script called sudo."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "sudo.log"
    (bindir / "sudo").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexit 99\n")
    (bindir / "sudo").chmod(0o755)
    return bindir, log


def test_demo_as_written_in_a_root_shell_without_sudo(tmp_path):
    bindir, log = stub_sudo(tmp_path)
    demo = quick_start()[0]
    out = tmp_path / "demo-run"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    r = subprocess.run(["bash", "-c", f"{demo} --out {out}"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert not log.exists(), log.read_text()  # nothing asked for sudo
    assert "round p99" in r.stdout and (out / "summary.json").is_file()


@pytest.fixture
def public_dir():
    """A scratch folder any user can enter (pytest's own tmp_path sits under a 0700 folder)."""
    d = Path(tempfile.mkdtemp(prefix="tb-quickstart-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _script_dir(tmp_path: Path) -> Path:
    """A copy of as-root.sh and a probe script in a folder any user can read (the checkout may be 0700)."""
    d = tmp_path / "scripts"
    d.mkdir()
    shutil.copy(ROOT / "scripts" / "as-root.sh", d / "as-root.sh")
    (d / "probe.sh").write_text('#!/usr/bin/env bash\nset -euo pipefail\n'
                                '. "$(dirname "${BASH_SOURCE[0]}")/as-root.sh" && as_root "${BASH_SOURCE[0]}" "$@"\n'
                                'echo "ran as $(id -u)"\n')
    for p in (tmp_path, d, d / "as-root.sh", d / "probe.sh"):
        p.chmod(p.stat().st_mode | stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
    return d


def test_user_without_sudo_gets_one_line(public_dir):
    d = _script_dir(public_dir)
    r = subprocess.run([*NOBODY, "bash", str(d / "probe.sh")], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "TESTBED_X": "1"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no sudo" in r.stderr, r.stderr
    assert "ran as" not in r.stdout


def test_user_with_sudo_reruns_under_sudo_keeping_settings(public_dir):
    d = _script_dir(public_dir)
    bindir, log = stub_sudo(public_dir)
    for p in (bindir, bindir / "sudo"):
        p.chmod(0o755)
    log.touch()
    log.chmod(0o666)
    r = subprocess.run([*NOBODY, "bash", str(d / "probe.sh"), "a b", "c"], capture_output=True, text=True,
                       timeout=60, env={"PATH": f"{bindir}:/usr/bin:/bin", "TESTBED_DEMO": "smoke", "HOME": "/"})
    assert r.returncode == 99, r.stderr  # the stub's status: the script exec'd sudo
    args = log.read_text().strip()
    assert args.startswith("-- env ") and "TESTBED_DEMO=smoke" in args, args
    assert args.endswith(f"bash {d / 'probe.sh'} a b c"), args


def test_launcher_refuses_a_user_who_cannot_reach_the_installation(public_dir):
    """The checkout in a 0700 folder: the user cannot even read the virtualenv; the launcher on PATH says so in one
    line (exit 2), as testbed itself does for a non-root user."""
    tmp_path = public_dir
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    (hidden / "venv").symlink_to(ROOT / ".venv")
    launcher = tmp_path / "testbed"
    launcher.write_text((ROOT / "scripts" / "testbed-launcher.sh").read_text().replace("@VENV@", str(hidden / "venv")))
    launcher.chmod(0o755)
    r = subprocess.run([*NOBODY, str(launcher), "doctor"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "root" in r.stderr, r.stderr
    r = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, timeout=60)  # root: it runs
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
