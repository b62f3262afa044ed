"""`testbed report RUN_DIR --slides` (analysis.slides) on hand-made runs: four full-screen slides (the story, the key
plot, the timeline, what to look at next) built from the report's own sentences and PNGs, with no script."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from analysis.load import load_run
from analysis.report import write_report
from analysis.slides import next_steps, pick_figures
from tests.unit.test_report_story import collective_run, incast_run


def _sections(page: str) -> list[str]:
    return re.findall(r"<section id=\"s\d+\">(.*?)</section>", page, flags=re.S)


def test_incast_slides_open_with_the_story_and_show_the_queue_that_dropped(tmp_path):
    html_path, _ = write_report(incast_run(tmp_path / "i"), slides=True)
    page = (html_path.parent / "slides.html").read_text()
    s = _sections(page)
    assert len(s) == 4 and "<script" not in page and "scroll-snap-type" in page
    assert "3 of 10 incast rounds took 216-226 ms" in s[0] and "incast round time, p99 (n=10)" in s[0]
    assert "The key plot" in s[1] and "The queue at leaf1:h1" in s[1] and s[1].count("<img") == 1  # the hottest, alone
    assert (html_path.parent / "report_files" / "slide_queue.png").is_file()
    assert "round time CDF" in s[2] and s[2].count("<img") == 1  # no ops: the round CDF over time instead
    assert "3 rounds waited RTOmin (200 ms)" in s[3] and "most at leaf1:h1" in s[3]
    assert "1 / 4" in s[0] and "4 / 4" in s[3]


def test_straggler_slides_show_the_timeline_and_name_the_late_rank(tmp_path):
    html_path, _ = write_report(collective_run(tmp_path / "c", late_ms=600.0, late_rank=2), slides=True)
    s = _sections((html_path.parent / "slides.html").read_text())
    assert "Rank 2 (h3) was late" in s[0]
    assert "Collective completion time CDF" in s[1]  # the network did nothing: the op times are the key plot
    assert "Timeline" in s[2] and "Per-rank timeline" in s[2]
    assert "the cause is its late rank, rank 2 (h3)" in s[3]
    assert "Rank 2 started the ops a median 600 ms late" in s[3] and "dropped" not in s[3]


def test_pick_figures_and_next_steps(tmp_path):
    files = {n: Path(n) for n in ("queues.png", "cdf_cct.png", "timeline.png", "topology.png")}
    assert pick_figures(files, network_acted=True) == ("queues.png", "timeline.png")
    assert pick_figures(files, network_acted=False) == ("cdf_cct.png", "timeline.png")
    assert pick_figures({"cdf_round.png": Path("x")}, network_acted=True) == ("cdf_round.png", None)
    clean = load_run(collective_run(tmp_path / "c", late_ms=1.0))
    steps = next_steps(clean, trace=False)
    assert steps == ["report.html holds every table, metric and the configuration."]


def test_report_command_with_slides_prints_three_paths(tmp_path):
    run = incast_run(tmp_path / "i")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "report", str(run), "--slides", "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [Path(x).name for x in r.stdout.split()] == ["report.html", "report.md", "slides.html"]
    assert (tmp_path / "out" / "slides.html").is_file()
