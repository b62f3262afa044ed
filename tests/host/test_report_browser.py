"""report.html in a real browser: Debian's headless Chromium loads the one file (no network, no scripts),
renders it without JavaScript errors and takes a non-empty screenshot; every embedded plot decodes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis.report import write_report

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
CHROMIUM = "/usr/bin/chromium"
PNG = b"\x89PNG\r\n\x1a\n"


def _screenshot(html: Path, tmp: Path) -> tuple[Path, subprocess.CompletedProcess]:
    shot = tmp / "shot.png"
    profile = tmp / "profile"
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--screenshot={shot}",
            "--window-size=1280,2000", "--enable-logging=stderr", "--v=0", html.resolve().as_uri()]
    env = dict(os.environ, HOME=str(tmp))  # chromium writes under HOME; keep it in the test's folder
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    return shot, r


@pytest.mark.parametrize("fixture", ["small_collective", "incomplete"])
def test_chromium_renders_the_report(fixture, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/install.sh installs Debian's chromium")
    run = shutil.copytree(RUNS / fixture, tmp_path / "run")
    html, _ = write_report(run)
    shot, r = _screenshot(html, tmp_path)
    log = r.stdout + r.stderr
    assert shot.exists() and shot.stat().st_size > 10_000, log[-3000:]
    assert shot.read_bytes()[:8] == PNG
    js_errors = [ln for ln in log.splitlines() if "Uncaught" in ln or "CONSOLE" in ln and "error" in ln.lower()]
    assert js_errors == [], js_errors
    assert "ERR_FILE_NOT_FOUND" not in log and "net::ERR" not in log, log[-3000:]


def test_chromium_renders_the_slides(tmp_path):
    """slides.html (`testbed report --slides`) loads without script errors and its first slide is not blank."""
    from tests.unit.test_report_story import incast_run

    html, _ = write_report(incast_run(tmp_path / "run"), slides=True)
    shot, r = _screenshot(html.parent / "slides.html", tmp_path)
    log = r.stdout + r.stderr
    assert shot.exists() and shot.stat().st_size > 10_000, log[-3000:]
    assert [ln for ln in log.splitlines() if "Uncaught" in ln or "CONSOLE" in ln and "error" in ln.lower()] == []
    assert "net::ERR" not in log, log[-3000:]
