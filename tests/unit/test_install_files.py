"""The install entry points stay consistent: the Vagrantfile is valid Ruby and provisions with the same script CI
runs; the README's Quick start has exactly the two commands, and .ci/run calls the test one."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_vagrantfile_is_valid_ruby():
    r = subprocess.run(["ruby", "-c", str(ROOT / "Vagrantfile")], capture_output=True, text=True)
    assert r.returncode == 0 and "Syntax OK" in r.stdout, r.stderr


def test_vagrant_provisions_with_the_install_script():
    text = (ROOT / "Vagrantfile").read_text()
    assert "scripts/install.sh" in text
    assert re.search(r"memory\s*=\s*(\d+)", text) and int(re.search(r"memory\s*=\s*(\d+)", text)[1]) >= 4096
    assert re.search(r"cpus\s*=\s*(\d+)", text) and int(re.search(r"cpus\s*=\s*(\d+)", text)[1]) >= 2


def quick_start_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(?:sh|bash)?\n(.*?)```", section, re.S)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_readme_quick_start_has_exactly_two_commands():
    cmds = quick_start_commands()
    assert len(cmds) == 2, cmds
    assert "demo" in cmds[0] and "test" in cmds[1]


def test_ci_runs_the_readme_test_command():
    test_cmd = quick_start_commands()[1]
    script = re.search(r"scripts/\S+\.sh", test_cmd)[0]
    assert script in (ROOT / ".ci" / "run").read_text()


def test_install_script_parses_and_refuses_unknown_options():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "install.sh")]).returncode == 0
    r = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--nonsense"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown option" in r.stderr


def test_quick_start_works_without_sudo_and_ci_runs_it_as_written():
    """The two commands are written so a root shell without sudo runs them as they are (the scripts re-run
    themselves under sudo for a user); .ci/run runs the test command exactly as the README writes it."""
    demo, test = quick_start_commands()
    for cmd in (demo, test):
        assert not cmd.startswith("sudo"), cmd
        script = ROOT / cmd.split()[0]
        assert script.is_file() and script.stat().st_mode & 0o111, cmd
        assert 'as_root "${BASH_SOURCE[0]}" "$@"' in script.read_text(), f"{cmd} does not re-run itself as root"
    assert f"exec {test}" in (ROOT / ".ci" / "run").read_text()
