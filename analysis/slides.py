"""A run as a few full-screen slides for a projector (``slides.html``, ``testbed report RUN_DIR --slides``).

Four slides, each one screen high, large type, one figure at most, built from the report's own blocks (the same
sentences and PNGs, nothing recomputed differently):

1. the story: what happened and why (:func:`analysis.story.tell`'s sentences), the key numbers, the fidelity line;
2. the key plot: the queue plot when the fabric dropped, marked or paused (the lesson is in a queue), else the
   op-time or round-time CDF;
3. the timeline: the per-rank timeline (who waited for whom), or for a run without ops the other plot (the round
   CDF, the PFC pause timeline);
4. what to look at next (:func:`next_steps`): the slowest op's explanation, and the experiment or view that tells
   more, computed from the same files (rerun without the late rank, try a smaller RTOmin, the port's panel, the
   trace in Perfetto, the full report).

Plain HTML and CSS, no script: each slide is a ``<section>`` one viewport high with scroll snapping, so Page Down,
Space or the arrow keys go from slide to slide in any browser, and printing puts one slide on a page.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from . import metrics as m
from .correlate import op_groups
from .load import Run
from .render import Block, fmt
from .story import incast_ideal_ms, late_rank, rto_min_ms, rto_rounds

__all__ = ["SLIDES_FILE", "next_steps", "pick_figures", "render_slides"]

SLIDES_FILE = "slides.html"

_CSS = """
html{scroll-snap-type:y mandatory}body{margin:0;font-family:system-ui,-apple-system,"Segoe UI",sans-serif;color:#111;
background:#fff}
section{box-sizing:border-box;height:100vh;scroll-snap-align:start;padding:4vh 5vw;display:flex;
flex-direction:column;overflow:hidden;break-after:page}
h1{font-size:4.4vh;margin:0 0 2vh}h2{font-size:3.6vh;margin:0 0 1.5vh;color:#333}
p,li{font-size:3vh;line-height:1.35;margin:.6vh 0}ul{margin:0;padding-left:1.2em}
table{border-collapse:collapse;font-size:2.6vh;margin:1.5vh 0;align-self:flex-start;min-width:50%}
td{border-bottom:1px solid #ddd;padding:.4vh 1.2vw}
td.num{text-align:right;font-variant-numeric:tabular-nums;font-weight:bold}
.ok,.alert{font-size:2.6vh;padding:.8vh 1.2vw;margin-top:1vh;font-weight:bold}
.ok{background:#e3f4e3;color:#1d5e1d}.alert{background:#fde2e2;color:#900}
figure{flex:1;min-height:0;margin:0;display:flex;flex-direction:column;align-items:center}
figure img{flex:1;min-height:0;max-width:100%;object-fit:contain}figcaption{font-size:2vh;color:#555}
.foot{margin-top:auto;font-size:1.8vh;color:#777}
"""


def pick_figures(files: dict[str, Path], network_acted: bool) -> tuple[str | None, str | None]:
    """(the key plot, the timeline slide's plot) among the report's PNGs, by file name (``files``: name -> path)."""
    order = (["queues.png"] if network_acted else []) + ["cdf_cct.png", "cdf_round.png", "queues.png"]
    key = next((f for f in order if f in files), None)
    rest = ["timeline.png", "cdf_round.png", "pauses.png", "queues.png", "cdf_cct.png"]
    second = next((f for f in rest if f in files and f != key), None)
    return key, second


def _acted(run: Run, qdeltas: pd.DataFrame | None) -> dict:
    """Drops, marks (and ``drops_port`` / ``marks_port``, the port with most) and pauses of the run."""
    out: dict = {}
    if qdeltas is not None and len(qdeltas):
        for c in ("drops", "marks"):
            out[c] = float(qdeltas[c].sum())
            if out[c] > 0:
                top = qdeltas.sort_values(c, ascending=False, kind="stable").iloc[0]
                out[f"{c}_port"] = f"{top['node']}:{top['port']}"
    out["pauses"] = float((run.pfc["event"] == "xoff").sum()) if len(run.pfc) else 0.0
    return out


def next_steps(run: Run, slowest: str = "", trace: bool = True) -> list[str]:
    """What to look at next, computed from the run's files: the slowest op's explanation (``slowest``), then the
    experiment or view each finding points to, then where the rest is."""
    qd = m.port_counter_deltas(run.queues) if len(run.queues) else None
    acted = _acted(run, qd)
    out = [slowest] if slowest else []
    late = late_rank(run.ops, op_groups(run.manifest)) if len(run.ops) else None
    if late is not None:
        out.append(f"Rank {late['rank']} started the ops a median {late['late_ms']:.0f} ms late: rerun with it on time "
                   "(no straggler) and `testbed compare` the two; what is left is the network's part.")
    if len(run.rounds) and rto_min_ms(run):
        hit = rto_rounds(run.rounds, run.queues, incast_ideal_ms(run), rto_min_ms(run))
        if len(hit):
            out.append(f"{len(hit)} rounds waited RTOmin ({rto_min_ms(run):.0f} ms): rerun with a smaller rto_min_ms "
                       "or with ECN marking, repeated (--repeat 5), and `testbed compare` the round p99.")
    if acted.get("drops", 0) > 0:
        out.append(f"{fmt(acted['drops'])} packets dropped, most at {acted['drops_port']}: its panel in the queue plot "
                   "shows when, against its buffer.")
    if acted.get("marks", 0) > 0:
        out.append(f"{fmt(acted['marks'])} packets ECN-marked, most at {acted['marks_port']}: did the senders back off "
                   "before the buffer filled?")
    if acted.get("pauses", 0) > 0:
        out.append(f"PFC paused {fmt(acted['pauses'])} times: the pause timeline in report.html shows who paused whom.")
    if (run.summary or {}).get("fidelity_ok") is False:
        out.append("This run is NOT faithful (the emulation fell behind): rerun it before drawing conclusions.")
    if trace:
        out.append("Open trace.json at ui.perfetto.dev: every rank's ops, the queues, drops and pauses on one clock.")
    out.append("report.html holds every table, metric and the configuration.")
    return out


def _img(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    e = html.escape
    return f'<figure><img alt="{e(caption)}" src="data:image/png;base64,{data}"><figcaption>{e(caption)}</figcaption>' \
           "</figure>"


def _story_slide(title: str, blocks: list[Block]) -> str:
    e = html.escape
    parts = [f"<h1>{e(title)}</h1>"]
    parts += [f"<p>{e(b.content)}</p>" for b in blocks if b.kind == "story"]
    nums = next((b.content for b in blocks if b.kind == "table" and list(b.content.columns) == ["what", "value"]),
                None)
    if nums is not None:
        rows = "".join(f'<tr><td>{e(str(w))}</td><td class="num">{e(str(v))}</td></tr>'
                       for w, v in nums.itertuples(index=False))
        parts.append(f"<table>{rows}</table>")
    fid = [str(b.content).replace("; details under Fidelity below", "") for b in blocks if b.kind in ("ok", "alert")]
    kind = next(b.kind for b in blocks if b.kind in ("ok", "alert")) if fid else ""
    parts += [f'<div class="{kind}">{e(fid[0])}</div>'] if fid else []
    return "".join(parts)


def _short(caption: str) -> str:
    """A caption's head, before its first parenthesis or colon: a projector shows one line, the report the rest."""
    return caption.split(" (", 1)[0].split(": ", 1)[0]


def _hottest_queue(run: Run, qd: pd.DataFrame, path: Path, t0: float | None) -> tuple[Path, str]:
    """The queue plot of the one port with most drops (else marks, else the highest peak), one tall panel."""
    from .queueplot import plot_queue_ports
    from .references import port_limits, queue_ticks

    peak = run.queues.groupby(["node", "port", "t_s"])["backlog_bytes"].sum().groupby(["node", "port"]).max()
    d = qd.assign(peak=[float(peak.get((n, p), 0.0)) for n, p in zip(qd["node"], qd["port"])])
    top = d.sort_values(["drops", "marks", "peak"], ascending=False, kind="stable").iloc[0]
    port = f"{top['node']}:{top['port']}"
    png = plot_queue_ports(run.queues, path, ports=[port], limits=port_limits(run, [port]), ticks=queue_ticks(run),
                           t0=t0, title=f"the queue at {port}", panel_height_in=4.4)
    return png, f"The queue at {port}: its own limits as lines, its drops, marks, pauses and RTOs as ticks"


def render_slides(run: Run, blocks: list[Block], title: str, trace: bool = True, files_dir: Path | None = None
                  ) -> str:
    """The slides page (module docstring) from the report's ``blocks`` (:func:`analysis.report.build_blocks`);
    ``files_dir``: where the report's PNGs are, and where the key plot's one-port version is drawn (a projector shows
    the hottest queue large, the report all four busiest)."""
    e = html.escape
    imgs = {Path(b.content[0]).name: (Path(b.content[0]), _short(b.caption)) for b in blocks if b.kind == "img"}
    qd = m.port_counter_deltas(run.queues) if len(run.queues) else None
    acted = _acted(run, qd)
    key, second = pick_figures({k: v[0] for k, v in imgs.items()},
                               acted.get("drops", 0) + acted.get("marks", 0) + acted.get("pauses", 0) > 0)
    if key == "queues.png" and files_dir is not None and qd is not None and len(qd):
        start = run.time_window()[0]
        imgs["queues.png"] = _hottest_queue(run, qd, files_dir / "slide_queue.png",
                                            None if start is None or start != start else start)
    slowest = next((b.content for b in blocks if b.kind == "p" and str(b.content).startswith("The slowest op:")), "")
    slides = [_story_slide(title, blocks)]
    for name, head in ((key, "The key plot"), (second, "Timeline" if second == "timeline.png" else "And over time")):
        if name:
            slides.append(f"<h2>{e(head)}</h2>" + _img(*imgs[name]))
    steps = next_steps(run, slowest, trace)
    slides.append("<h2>What to look at next</h2><ul>" + "".join(f"<li>{e(s)}</li>" for s in steps) + "</ul>")
    n = len(slides)
    body = [f'<section id="s{i + 1}">{s}<div class="foot">{e(run.name)} &middot; {i + 1} / {n}</div></section>'
            for i, s in enumerate(slides)]
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      f"<title>{e(title)} (slides)</title><style>{_CSS}</style></head><body>", *body,
                      "</body></html>"]) + "\n"
