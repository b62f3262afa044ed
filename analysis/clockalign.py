"""Put a server's run files on the reference server's clock: every time column of its CSVs moved by the server's
measured offset (analysis.clockoffset), so its ops, queue samples, pauses and faults line up with the others'.

A server's files come back into their own folder (``RUN/servers/<server>/``); :func:`align_dir` rewrites them in
place and writes ``clock.json`` beside them (the model applied: offsets at the run's start and end, drift, the
uncertainty to show next to anything joined across servers). A folder that already has a clock.json is refused, so
an offset is never applied twice; every file is read and shifted in memory before any is written, so a cell that
does not parse leaves the whole folder as it was. Only time *points* move (``t_s``, ``start_s``, ``end_s``,
``iter_start_s``); durations (``wait_s``) and every other column are copied as written.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from analysis.clockoffset import ClockError, ClockModel

#: time-point columns per CSV (docs/rundir.md: seconds on the writer's CLOCK_MONOTONIC)
TIME_POINT_COLUMNS: dict[str, tuple[str, ...]] = {
    "rounds": ("start_s", "end_s"),
    "flows": ("start_s", "end_s"),
    "ops": ("start_s", "end_s", "iter_start_s"),
    "program": ("end_s",),
    "dcqcn_rates": ("t_s",),
    "queues": ("t_s",),
    "pfc": ("t_s",),
    "cpu": ("t_s",),
    "events": ("t_s",),
}
CLOCK_FILE = "clock.json"


def _shift_cell(text: str, model: ClockModel) -> str:
    cell = text.strip()
    if not cell:
        return text
    return f"{model.to_reference(float(cell)):.9f}"


def shifted_rows(path: Path, model: ClockModel) -> list[list[str]] | None:
    """One CSV's rows with its time-point columns on the reference clock (None for a table without time points,
    which is left untouched). ClockError when a time cell does not parse."""
    columns = TIME_POINT_COLUMNS.get(path.stem)
    if not columns:
        return None
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return None
    header = [c.strip() for c in rows[0]]
    where = [i for i, c in enumerate(header) if c in columns]
    if not where:
        return None
    for lineno, row in enumerate(rows[1:], start=2):
        for i in where:
            if i < len(row):
                try:
                    row[i] = _shift_cell(row[i], model)
                except ValueError:
                    raise ClockError(f"{path}:{lineno}: {header[i]} is not a number ({row[i]!r})") from None
    return rows


def _write_rows(path: Path, rows: list[list[str]]) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    tmp.replace(path)


def align_csv(path: Path, model: ClockModel) -> int:
    """Rewrite one CSV's time-point columns on the reference clock; returns the rows rewritten (0 for a table
    without time points, which is left untouched)."""
    rows = shifted_rows(path, model)
    if rows is None:
        return 0
    _write_rows(path, rows)
    return len(rows) - 1


def align_dir(folder: Path | str, model: ClockModel) -> dict[str, int]:
    """Move every time column of ``folder``'s CSVs onto the reference clock and record the model in clock.json.
    Returns rows rewritten per file. ClockError (one line) when the folder was aligned already or a time cell does
    not parse (then no file is rewritten and nothing is recorded)."""
    folder = Path(folder)
    record = folder / CLOCK_FILE
    if record.exists():
        raise ClockError(f"{folder} is on the reference clock already ({CLOCK_FILE} exists): not shifting it twice")
    shifted = {path: shifted_rows(path, model) for path in sorted(folder.glob("*.csv"))}
    done: dict[str, int] = {}
    for path, rows in shifted.items():
        if rows is not None:
            _write_rows(path, rows)
        done[path.name] = 0 if rows is None else len(rows) - 1
    record.write_text(json.dumps({"model": model.as_dict(), "rows": done}, indent=1) + "\n")
    return done


def applied(folder: Path | str) -> ClockModel | None:
    """The model a folder's files were shifted by (its clock.json), or None when they are on their own clock."""
    record = Path(folder) / CLOCK_FILE
    if not record.exists():
        return None
    return ClockModel.from_dict(json.loads(record.read_text())["model"])
