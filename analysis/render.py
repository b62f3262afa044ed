"""How a report's blocks are written: one self-contained HTML page and Markdown, with every value through
:func:`fmt` (the short text each table cell shows)."""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["Block", "fmt", "md_table", "render_html", "render_markdown"]


def fmt(v: Any) -> str:
    """A value as short text: ints plain, floats with up to 4 decimals (or 4 significant digits when tiny),
    nan/None as ``-``, bools as ``true``/``false``."""
    if v is None:
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        x = float(v)
        if math.isnan(x):
            return "-"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if x == int(x) and abs(x) < 1e15:
            return str(int(x))
        if abs(x) >= 1:
            return f"{x:.4f}".rstrip("0").rstrip(".")
        return f"{x:.4g}"
    if isinstance(v, (dict, list, tuple)):
        return json.dumps(v, default=str, sort_keys=True)
    return str(v)


@dataclass
class Block:
    """One piece of the report. kind: ``h1``, ``h2``, ``p``, ``alert``, ``ok``, ``list``, ``table``, ``img``,
    ``pre``, ``details`` (content: ``(summary line, [Block, ...])``, folded until opened: HTML ``<details>``)."""

    kind: str
    content: Any = None
    caption: str = ""


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1100px;color:#222;
padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:.5em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.alert{background:#fde2e2;border:2px solid #c00;color:#900;padding:.7em 1em;font-weight:bold}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
caption{caption-side:bottom;font-size:.85em;color:#555;text-align:left}
.false{color:#c00;font-weight:bold}
.story{font-size:1.1em;line-height:1.45}
.ok{background:#e3f4e3;border:2px solid #2a7a2a;color:#1d5e1d;padding:.5em 1em;font-weight:bold}
details{margin:1em 0}summary{cursor:pointer;font-weight:bold;font-size:1.05em}
"""


def _is_num(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _html_table(df: pd.DataFrame, caption: str = "") -> str:
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in df.columns)
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for v in rec:
            t = fmt(v)
            cls = ' class="num"' if _is_num(t) else (' class="false"' if t.startswith("FALSE") else "")
            cells.append(f"<td{cls}>{e(t)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{e(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _html_block(b: Block) -> str:
    e = html.escape
    if b.kind in ("h1", "h2"):
        return f"<{b.kind}>{e(b.content)}</{b.kind}>"
    if b.kind == "p":
        return f"<p>{e(b.content)}</p>"
    if b.kind == "story":
        return f'<p class="story">{e(b.content)}</p>'
    if b.kind == "alert":
        return f'<div class="alert" role="alert">{e(b.content)}</div>'
    if b.kind == "ok":
        return f'<div class="ok">{e(b.content)}</div>'
    if b.kind == "list":
        return "<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in b.content) + "</ul>"
    if b.kind == "table":
        return _html_table(b.content, b.caption)
    if b.kind == "img":
        data = base64.b64encode(Path(b.content[0]).read_bytes()).decode("ascii")
        return (f'<figure><img alt="{e(b.caption)}" src="data:image/png;base64,{data}">'
                f"<figcaption>{e(b.caption)}</figcaption></figure>")
    if b.kind == "pre":
        return f"<pre>{e(b.content)}</pre>"
    if b.kind == "details":
        summary, inner = b.content
        return f"<details><summary>{e(summary)}</summary>" + "\n".join(_html_block(x) for x in inner) + "</details>"
    return ""


def render_html(blocks: list[Block], title: str) -> str:
    """One self-contained HTML page (inline CSS, PNGs as base64 data URIs, no scripts)."""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"]
    out += [_html_block(b) for b in blocks]
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(df: pd.DataFrame) -> str:
    """A DataFrame as a GitHub-flavoured Markdown table (values through :func:`fmt`)."""
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(_md_cell(c) for c in cols) + " |",
             "|" + "|".join("---:" if df[c].dtype.kind in "iuf" else "---" for c in df.columns) + "|"]
    for rec in df.itertuples(index=False):
        lines.append("| " + " | ".join(_md_cell(fmt(v)) for v in rec) + " |")
    return "\n".join(lines)


def _md_block(b: Block) -> str:
    if b.kind == "h1":
        return f"# {b.content}"
    if b.kind == "h2":
        return f"## {b.content}"
    if b.kind in ("p", "story"):
        return str(b.content)
    if b.kind == "alert":
        return f"> **{b.content}**"
    if b.kind == "ok":
        return f"> {b.content}"
    if b.kind == "list":
        return "\n".join(f"- {x}" for x in b.content)
    if b.kind == "table":
        return md_table(b.content) + (f"\n\n*{b.caption}*" if b.caption else "")
    if b.kind == "img":
        return f"![{b.caption}]({b.content[1]})\n\n*{b.caption}*"
    if b.kind == "pre":
        return f"```\n{b.content}\n```"
    if b.kind == "details":
        summary, inner = b.content
        body = "\n\n".join(_md_block(x) for x in inner)
        return f"<details><summary>{html.escape(summary)}</summary>\n\n{body}\n\n</details>"
    return ""


def render_markdown(blocks: list[Block]) -> str:
    """The same blocks as Markdown; images link to their PNG files by relative path; folded blocks as
    ``<details>`` (GitHub renders them folded)."""
    return "\n\n".join(_md_block(b) for b in blocks) + "\n"
