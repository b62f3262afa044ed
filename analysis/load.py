"""Load one run directory (see docs/rundir.md) into pandas, and nothing else.

This module, like the rest of ``analysis``, reads only the run folder: it never imports the
``testbed``, ``topologies`` or ``traffic`` packages, so it works on a laptop with no kernel features.

Decisions (also in docs/analysis.md):

* A CSV that is absent, zero bytes long, or header-only loads as an **empty DataFrame with the
  documented columns and dtypes**, never ``None``; ``Run.present`` tells you which files existed.
  Every metric therefore works on a TCP-only run (no ``rdma.csv``) without special cases.
* A missing or unparsable ``manifest.json``, an unparsable ``summary.json``, a CSV lacking a documented
  column, or a row whose numeric field does not parse raise :class:`RunDirError` with a one-line message.
  Exception: in an *incomplete* run (manifest ``complete: false``) a damaged **last** row of a CSV is the
  expected result of an interrupted writer; it is dropped and a note is added to ``Run.warnings``.
* ``Run.complete`` mirrors the manifest's ``complete``; an incomplete run still loads, with
  ``Run.complete == False``, a note in ``Run.warnings`` and an :class:`IncompleteRunWarning`.
* Extra columns a newer writer adds are kept as strings-or-numbers as pandas reads them.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "SCHEMAS",
    "IncompleteRunWarning",
    "Run",
    "RunDirError",
    "empty_frame",
    "load_csv",
    "load_run",
]

INT = "int64"
FLOAT = "float64"
STR = "str"

#: Documented columns and the dtype each is converted to, per CSV (docs/rundir.md).
SCHEMAS: dict[str, dict[str, str]] = {
    "rounds": {"round": INT, "sender": STR, "start_s": FLOAT, "end_s": FLOAT, "bytes": INT},
    "ops": {
        "iteration": INT,
        "op": STR,
        "op_index": INT,
        "collective": STR,
        "rank": INT,
        "host": STR,
        "start_s": FLOAT,
        "end_s": FLOAT,
        "bytes_sent": INT,
        "bytes_recv": INT,
        "wait_s": FLOAT,
    },
    "queues": {
        "t_s": FLOAT,
        "node": STR,
        "port": STR,
        "class": STR,
        "backlog_bytes": INT,
        "backlog_packets": INT,
        "drops": INT,
        "marks": INT,
        "sent_bytes": INT,
        "sent_packets": INT,
        "overlimits": INT,
    },
    "tcp": {"host": STR, "phase": STR, "counter": STR, "value": INT},
    "rdma": {"host": STR, "device": STR, "phase": STR, "counter": STR, "value": INT},
    "pfc": {"t_s": FLOAT, "node": STR, "port": STR, "prio": INT, "event": STR, "backlog_bytes": INT},
    "cpu": {"t_s": FLOAT, "busy_fraction": FLOAT},
    "servers": {"server": STR, "namespace": STR, "nodes": STR, "udp_in_datagrams": INT,
                "udp_rcvbuf_errors": INT, "udp_in_errors": INT},
    "events": {"t_s": FLOAT, "kind": STR, "target": STR, "detail": STR},
    "ports": {"node": STR, "port": STR, "peer": STR, "tier": STR, "rate_mbps": FLOAT},
    "balancing": {"node": STR, "flowlets": INT, "moved_packets": INT, "packets": INT},
    "dcqcn": {"host": STR, "counter": STR, "value": INT},
    "dcqcn_rates": {"t_s": FLOAT, "host": STR, "peer": STR, "rqpn": INT, "rc_kbps": INT, "rt_kbps": INT,
                    "alpha": FLOAT, "rate_cuts": INT, "cnp_received": INT, "cnp_ignored": INT},
    "uet": {"rank": INT, "host": STR, "counter": STR, "value": INT},
    "trim": {"node": STR, "port": STR, "counter": STR, "value": INT},
    "clocks": {"rank": INT, "host": STR, "server": STR, "offset_s": FLOAT, "uncertainty_s": FLOAT, "drift_ppm": FLOAT,
               "drift_bound_ppm": FLOAT},
}

#: Time-series tables (have a ``t_s`` or ``start_s``/``end_s`` on the monotonic clock).
_TIME_COLUMNS = {"rounds": ("start_s", "end_s"), "ops": ("start_s", "end_s"), "queues": ("t_s",),
                 "pfc": ("t_s",), "cpu": ("t_s",), "events": ("t_s",), "dcqcn_rates": ("t_s",)}


class RunDirError(Exception):
    """A run directory cannot be read: missing manifest or a corrupt file. The message is one line."""


class IncompleteRunWarning(UserWarning):
    """The run's manifest says ``complete: false`` (still running, or interrupted)."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def empty_frame(name: str) -> pd.DataFrame:
    """An empty DataFrame with the documented columns and dtypes of ``<name>.csv``."""
    schema = SCHEMAS[name]
    return pd.DataFrame({col: pd.Series([], dtype=_pandas_dtype(dt)) for col, dt in schema.items()})


def _pandas_dtype(dt: str) -> Any:
    return object if dt == STR else dt


def _load_typed(path: Path, schema: dict[str, str]) -> pd.DataFrame | None:
    """The fast path for a well-formed file: one typed ``read_csv`` (pandas' C parser converts while it reads). None
    when anything is off (extra or missing columns, an unparsable or empty value, a truncated row): the careful
    path then finds and reports it. About 10x faster on a million-row queues.csv."""
    try:
        header = [str(c).strip() for c in pd.read_csv(path, nrows=0, skipinitialspace=True).columns]
        if sorted(header) != sorted(schema) or len(header) != len(set(header)):
            return None
        dtypes = {c: (str if dt == STR else dt) for c, dt in schema.items()}
        df = pd.read_csv(path, dtype=dtypes, keep_default_na=False, na_values={c: [""] for c in schema
                                                                                if schema[c] != STR},
                         skipinitialspace=True, on_bad_lines="error")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError, TypeError,
            OverflowError):
        return None
    df.columns = header
    for col, dt in schema.items():
        if dt == STR:
            df[col] = df[col].str.strip().astype(object)
        elif df[col].isna().any():
            return None
    return df[list(schema)].reset_index(drop=True)


def _parse_columns(raw: pd.DataFrame, schema: dict) -> tuple[dict[str, pd.Series], np.ndarray]:
    """Each column of a CSV read as text, parsed to its schema type (extra columns: numbers if all parse), and
    a mask of the rows holding a value that does not parse."""
    out: dict[str, pd.Series] = {}
    bad = np.zeros(len(raw), dtype=bool)
    for col in raw.columns:
        s = raw[col].astype(object)
        dt = schema.get(col)
        if dt is None:  # extra column: let pandas guess
            num = pd.to_numeric(s, errors="coerce")
            out[col] = num if num.notna().all() else s.astype(object)
            continue
        if dt == STR:
            out[col] = s.map(lambda v: v.strip() if isinstance(v, str) else v).astype(object)
            continue
        num = pd.to_numeric(s.str.strip() if hasattr(s, "str") else s, errors="coerce")
        if dt == INT:
            ok = num.notna() & np.isfinite(num.astype(float)) & (num.astype(float) % 1 == 0)
        else:
            ok = num.notna()
        bad |= ~ok.to_numpy()
        out[col] = num
    return out, bad


def load_csv(path: str | Path, name: str, *, tolerate_truncated_tail: bool = False,
             notes: list[str] | None = None) -> pd.DataFrame:
    """Read one run CSV and enforce its schema.

    ``name`` is the table name (``"ops"``, ``"queues"`` ...). Absent / empty / header-only files give
    :func:`empty_frame`. String columns hold Python ``str`` (object dtype), integer columns ``int64``,
    float columns ``float64``. Raises :class:`RunDirError` on a missing column or an unparsable value.
    """
    path = Path(path)
    schema = SCHEMAS[name]
    if not path.exists() or path.stat().st_size == 0:
        return empty_frame(name)
    fast = _load_typed(path, schema)
    if fast is not None:
        return fast
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        return empty_frame(name)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise RunDirError(_one_line(f"corrupt {path.name} in {path.parent}: {exc}")) from None
    raw.columns = [str(c).strip() for c in raw.columns]
    missing = [c for c in schema if c not in raw.columns]
    if missing:
        raise RunDirError(_one_line(f"corrupt {path.name} in {path.parent}: missing columns {missing}"))
    if raw.empty:
        return empty_frame(name).assign(**{c: pd.Series([], dtype=object) for c in raw.columns
                                            if c not in schema})

    out, bad = _parse_columns(raw, schema)
    if bad.any():
        first_bad = int(np.flatnonzero(bad)[0])
        only_tail = first_bad == len(raw) - 1
        if only_tail and tolerate_truncated_tail:
            if notes is not None:
                notes.append(f"{path.name}: dropped damaged last row (interrupted writer)")
            keep = ~bad
            out = {c: s[keep] for c, s in out.items()}
        else:
            row = raw.iloc[first_bad].tolist()
            # +2: one for the header line, one for 1-based numbering
            raise RunDirError(_one_line(f"corrupt {path.name} in {path.parent}: line {first_bad + 2} "
                                        f"has an unparsable value: {row}"))
    df = pd.DataFrame(out)
    for col, dt in schema.items():
        df[col] = df[col].astype(_pandas_dtype(dt))
    return df.reset_index(drop=True)


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunDirError(_one_line(f"corrupt {path.name} in {path.parent}: {exc}")) from None


def _as_epoch(value: Any) -> float | None:
    """Wall-clock value (epoch seconds, or an ISO 8601 string) as epoch seconds, or None."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


@dataclass
class Run:
    """One loaded run directory. All DataFrames are present (possibly empty, never None)."""

    path: Path
    manifest: dict
    summary: dict
    ops: pd.DataFrame
    rounds: pd.DataFrame
    queues: pd.DataFrame
    tcp: pd.DataFrame
    rdma: pd.DataFrame
    pfc: pd.DataFrame
    cpu: pd.DataFrame
    #: the fault timeline's changes and routing's reactions (testbed.faults.timeline), empty without faults
    events: pd.DataFrame = field(default_factory=lambda: empty_frame("events"))
    #: every shaped egress port as built: its peer, tier and configured rate
    ports: pd.DataFrame = field(default_factory=lambda: empty_frame("ports"))
    #: the flowlet balancer's counters per router (load_balancing flowlet or adaptive), read at the run's end
    balancing: pd.DataFrame = field(default_factory=lambda: empty_frame("balancing"))
    #: a fabric split over servers (testbed.network.cluster): per server, its nodes and its tunnels' UDP counters
    servers: pd.DataFrame = field(default_factory=lambda: empty_frame("servers"))
    #: DCQCN's counters per host at the run's end and every QP's rate over time (runs with dcqcn on)
    dcqcn: pd.DataFrame = field(default_factory=lambda: empty_frame("dcqcn"))
    dcqcn_rates: pd.DataFrame = field(default_factory=lambda: empty_frame("dcqcn_rates"))
    #: each UET rank's transport counters at the job's end (transport=uet) and each switch port's trimming
    #: counters (trimming on): analysis.uet
    uet: pd.DataFrame = field(default_factory=lambda: empty_frame("uet"))
    trim: pd.DataFrame = field(default_factory=lambda: empty_frame("trim"))
    #: a run over servers that are machines: per rank, its server's clock against the reference's (offset at the
    #: job's start, the bound, the drift), by which its ops were put on the reference clock
    clocks: pd.DataFrame = field(default_factory=lambda: empty_frame("clocks"))
    #: file names (``"ops.csv"`` ...) that existed in the folder
    present: set[str] = field(default_factory=set)
    #: human-readable notes about anything unusual found while loading
    warnings: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """The manifest's ``complete`` flag (False while running or when interrupted)."""
        return self.manifest.get("complete") is True

    @property
    def name(self) -> str:
        return self.path.name

    def has(self, table: str) -> bool:
        """Did ``<table>.csv`` exist in the run directory (even if empty)?"""
        return f"{table}.csv" in self.present

    def time_window(self) -> tuple[float, float]:
        """``(start_s, end_s)`` of the run on the monotonic clock the CSVs use.

        Start is the manifest's ``t0_monotonic`` when present, else the earliest timestamp in any table.
        End is ``t0_monotonic + (ended_wall - started_wall)`` when all three are known (a complete run),
        else the latest timestamp in any table. Returns ``(nan, nan)`` for a run with no timestamps.
        """
        lo, hi = math.inf, -math.inf
        for name, cols in _TIME_COLUMNS.items():
            df = getattr(self, name)
            for c in cols:
                if len(df):
                    lo = min(lo, float(df[c].min()))
                    hi = max(hi, float(df[c].max()))
        t0 = self.manifest.get("t0_monotonic")
        t0 = float(t0) if isinstance(t0, (int, float)) and not isinstance(t0, bool) else None
        start_w, end_w = _as_epoch(self.manifest.get("started_wall")), _as_epoch(self.manifest.get("ended_wall"))
        start = t0 if t0 is not None else lo
        end = hi
        if t0 is not None and start_w is not None and end_w is not None and end_w >= start_w:
            end = max(t0 + (end_w - start_w), hi) if math.isfinite(hi) else t0 + (end_w - start_w)
        if not math.isfinite(start) or not math.isfinite(end):
            return (math.nan, math.nan)
        return (float(start), float(end))

    def to_wall(self, t_s: float | np.ndarray | pd.Series) -> Any:
        """Monotonic seconds -> wall-clock epoch seconds (needs ``t0_monotonic`` and ``started_wall``)."""
        t0 = self.manifest.get("t0_monotonic")
        w0 = _as_epoch(self.manifest.get("started_wall"))
        if t0 is None or w0 is None:
            raise ValueError("manifest lacks t0_monotonic or started_wall")
        return t_s - float(t0) + w0


def load_run(path: str | Path) -> Run:
    """Load a run directory. Raises :class:`RunDirError` (one-line message) if it cannot be read."""
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"not a run directory: {path}")
    mpath = path / "manifest.json"
    if not mpath.exists():
        raise RunDirError(f"missing manifest.json in {path}")
    manifest = _read_json(mpath)
    if not isinstance(manifest, dict):
        raise RunDirError(f"corrupt manifest.json in {path}: expected a JSON object")
    notes: list[str] = []
    complete = manifest.get("complete") is True
    if not complete:
        notes.append("run is incomplete (manifest complete is not true): still running or interrupted")

    spath = path / "summary.json"
    summary: dict = {}
    if spath.exists() and spath.stat().st_size > 0:
        summary = _read_json(spath)
        if not isinstance(summary, dict):
            raise RunDirError(f"corrupt summary.json in {path}: expected a JSON object")
    elif complete:
        notes.append("summary.json is missing")

    present = {p.name for p in path.iterdir() if p.is_file()}
    tables = {name: load_csv(path / f"{name}.csv", name, tolerate_truncated_tail=not complete, notes=notes)
              for name in SCHEMAS}
    run = Run(path=path, manifest=manifest, summary=summary, present=present, warnings=notes, **tables)
    if not complete:
        warnings.warn(f"{path.name}: incomplete run (complete=false); results may be partial",
                      IncompleteRunWarning, stacklevel=2)
    return run
