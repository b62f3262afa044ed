"""The training-job model the collective agents replay (the metrics over what they measure live in analysis).

A job is a sequence of *segments*; a segment is ``iterations`` iterations of the same shape (a size sweep is one
segment per size). One iteration, on every rank:

1. a **compute phase**: ``compute_ms`` scaled by a uniform jitter in ``[1 - jitter, 1 + jitter]``; a *straggler*
   rank is slowed by ``straggler_factor`` in an iteration with probability ``straggler_prob`` (1 = always);
2. then its **collectives** one after another (gradient buckets of the given sizes; NCCL serialises the
   collectives of one communicator on one stream, so do we): op ``op_index`` k of the iteration.

Everything random comes from ``random.Random(seed).random()`` only (same plan on every Python version), so every
agent and the controller derive the same plan. ``warmup`` iterations run first (no straggler, no jitter) and are
not reported, like nccl-tests' warm-up.

Optional **background flows** (checkpoint traffic) run between chosen hosts for the whole job with their own DSCP.

The metrics of a job (CCT, step times, step CV, comm-wait fraction, algbw/busbw, percentiles) are computed by
``analysis`` (analysis.metrics, analysis.summary) from the ops.csv the run writes, never here: one definition.
What this module adds for them is :func:`iteration_starts`, when each rank began each measured iteration (the
``iter_start_s`` column of ops.csv), so a step time includes its compute phase from the first measured
iteration on.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["JobError", "BackgroundFlow", "JobSpec", "parse_size", "parse_sizes", "parse_int_list", "parse_flows",
           "compute_plan", "iteration_plan", "iteration_starts", "format_nccl_table"]


class JobError(ValueError):
    """Bad job parameters; one line."""


_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_size(text: str | int) -> int:
    """'1500', '64K', '1M', '1Mi', '4MB' -> bytes (K/M/G decimal, Ki/Mi/Gi binary); must be > 0."""
    if isinstance(text, bool):
        raise JobError(f"size: not a size ({text!r})")
    if isinstance(text, int):
        v = text
    else:
        t = str(text).strip().lower()
        if t.endswith("b"):
            t = t[:-1]
        mult = 1
        for suf in ("ki", "mi", "gi", "k", "m", "g"):
            if t.endswith(suf):
                mult, t = _SUFFIX[suf], t[: -len(suf)]
                break
        try:
            f = float(t) * mult
        except ValueError:
            raise JobError(f"size: not a size ({text!r})") from None
        if not math.isfinite(f) or f != int(f):
            raise JobError(f"size: not a whole number of bytes ({text!r})")
        v = int(f)
    if v <= 0:
        raise JobError(f"size: must be > 0 bytes (got {text!r})")
    return v


def parse_sizes(text: str) -> list[int]:
    """'1K,64K,1M' -> [1000, 64000, 1000000]; empty items are errors."""
    items = [x.strip() for x in str(text).split(",")]
    if not items or any(not x for x in items):
        raise JobError(f"size: expected a size or a comma list of sizes (got {text!r})")
    return [parse_size(x) for x in items]


def parse_int_list(text: str, what: str) -> list[int]:
    """'' -> [], '1,3' -> [1, 3]."""
    t = str(text).strip()
    if not t:
        return []
    out = []
    for x in t.split(","):
        x = x.strip()
        try:
            out.append(int(x))
        except ValueError:
            raise JobError(f"{what}: expected a comma list of integers (got {text!r})") from None
    if len(set(out)) != len(out):
        raise JobError(f"{what}: duplicate entries in {text!r}")
    return out


@dataclass(frozen=True)
class BackgroundFlow:
    """Bulk TCP from host ``src`` to host ``dst`` for the whole job (checkpoint traffic)."""

    src: str
    dst: str
    dscp: int = 0
    rate_mbps: float = 0.0  # 0: as fast as TCP goes; else paced with SO_MAX_PACING_RATE
    src_port: int = 0  # 0: the kernel picks; else the sender binds it (fixes the 5-tuple an ECMP hash sees)
    ack_dscp: int | None = None  # DSCP of the receiver's packets (its ACKs); None: the same as dscp


def parse_flows(text: str, dscp: int = 0, rate_mbps: float = 0.0) -> list[BackgroundFlow]:
    """'h1>h3,h2>h4' (or ':' / '-' as the separator) -> flows."""
    t = str(text).strip()
    if not t:
        return []
    out = []
    for item in t.split(","):
        item = item.strip()
        for sep in (">", ":", "-"):
            if sep in item:
                a, b = (x.strip() for x in item.split(sep, 1))
                break
        else:
            raise JobError(f"background: expected SRC>DST pairs like h1>h3 (got {item!r})")
        if not a or not b:
            raise JobError(f"background: expected SRC>DST pairs like h1>h3 (got {item!r})")
        if a == b:
            raise JobError(f"background: a flow needs two different hosts (got {item!r})")
        out.append(BackgroundFlow(a, b, dscp, rate_mbps))
    return out


@dataclass(frozen=True)
class Segment:
    """``iterations`` iterations, each running the ops ``[(name, schedule key), ...]`` after its compute phase; an op
    may carry a third element, the compute (ms) between the previous op and it (an imported trace's compute gaps)."""

    ops: tuple[tuple, ...]
    iterations: int


@dataclass(frozen=True)
class JobSpec:
    ranks: int
    segments: tuple[Segment, ...]
    compute_ms: float = 0.0
    jitter: float = 0.0  # fraction: compute time uniform in [1 - jitter, 1 + jitter] x compute_ms
    stragglers: tuple[int, ...] = ()
    straggler_factor: float = 1.0
    straggler_prob: float = 1.0
    warmup: int = 0
    seed: int = 0
    background: tuple[BackgroundFlow, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise JobError(f"ranks: must be >= 1 (got {self.ranks})")
        if not self.segments or any(s.iterations < 1 or not s.ops for s in self.segments):
            raise JobError("a job needs at least one segment with >= 1 iteration and >= 1 op")
        if not (self.compute_ms >= 0 and math.isfinite(self.compute_ms)):
            raise JobError(f"compute_ms: must be >= 0 (got {self.compute_ms})")
        if not 0 <= self.jitter < 1:
            raise JobError(f"jitter: must be in [0, 1) (got {self.jitter})")
        for r in self.stragglers:
            if not 0 <= r < self.ranks:
                raise JobError(f"straggler rank {r} out of range (ranks 0..{self.ranks - 1})")
        if len(set(self.stragglers)) != len(self.stragglers):
            raise JobError("straggler ranks listed twice")
        if not self.straggler_factor >= 1:
            raise JobError(f"straggler_factor: must be >= 1 (got {self.straggler_factor})")
        if not 0 <= self.straggler_prob <= 1:
            raise JobError(f"straggler_prob: must be in [0, 1] (got {self.straggler_prob})")
        if self.warmup < 0:
            raise JobError(f"warmup: must be >= 0 (got {self.warmup})")

    @property
    def iterations(self) -> int:
        return sum(s.iterations for s in self.segments)


def compute_plan(job: JobSpec) -> tuple[list[list[float]], list[list[bool]]]:
    """(seconds[iteration][rank], straggling[iteration][rank]) for the measured iterations.

    Draw order (fixed, so plans are reproducible): per iteration, per rank, one jitter draw, then per straggler
    rank (in the given order) one straggle draw when straggler_prob < 1.
    """
    rng = random.Random(job.seed)
    base = job.compute_ms / 1000.0
    secs: list[list[float]] = []
    slow: list[list[bool]] = []
    for _ in range(job.iterations):
        row = []
        for _r in range(job.ranks):
            u = rng.random()
            row.append(base * (1.0 + job.jitter * (2.0 * u - 1.0)))
        flags = [False] * job.ranks
        for r in job.stragglers:
            hit = True if job.straggler_prob >= 1 else rng.random() < job.straggler_prob
            if hit and job.straggler_factor > 1:
                flags[r] = True
                row[r] *= job.straggler_factor
        secs.append(row)
        slow.append(flags)
    return secs, slow


def iteration_plan(job: JobSpec) -> list[dict]:
    """What every agent runs, in order: warm-up iterations (``record`` false, iteration -warmup..-1, plain
    compute_ms, ops of the first segment), then the measured ones (iteration 0..)."""
    secs, slow = compute_plan(job)
    out = []
    first = job.segments[0]
    for w in range(job.warmup):
        out.append({"iteration": w - job.warmup, "record": False, "compute_s": [job.compute_ms / 1000.0] * job.ranks,
                    "straggling": [], "ops": [list(o) for o in first.ops]})
    i = 0
    for seg in job.segments:
        for _ in range(seg.iterations):
            out.append({"iteration": i, "record": True, "compute_s": secs[i],
                        "straggling": [r for r, f in enumerate(slow[i]) if f], "ops": [list(o) for o in seg.ops]})
            i += 1
    return out


# ---- what the metrics need from the job -------------------------------------------------------------------------


def iteration_starts(rows: Sequence[dict], origin_by_rank: dict[int, float]) -> dict[tuple[int, int], float]:
    """(rank, iteration) -> when the rank began that measured iteration: its compute phase follows its previous
    iteration's last op at once, so that op's end; for the rank's first measured iteration its origin (when it
    finished its warm-up, or the agreed start instant without warm-up). ``rows`` are ops.csv rows (dicts with
    rank, iteration, end_s)."""
    ends: dict[int, dict[int, float]] = {}
    for r in rows:
        d = ends.setdefault(int(r["rank"]), {})
        it = int(r["iteration"])
        d[it] = max(d.get(it, -math.inf), float(r["end_s"]))
    out = {}
    for rank, d in ends.items():
        prev = float(origin_by_rank[rank])
        for it in sorted(d):
            out[(rank, it)] = prev
            prev = d[it]
    return out


def format_nccl_table(rows: Sequence[dict], dtype: str = "float", itemsize: int = 4) -> str:
    """The nccl-tests layout: size, count, type, time (us), algbw, busbw (GB/s as nccl-tests prints; we add
    Gbit/s because emulated links are slow). ``rows``: :func:`analysis.summary.nccl_table` rows as dicts."""
    head = (f"{'size':>12} {'count':>12} {'type':>7} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} "
            f"{'busbw(Gb/s)':>12} {'p99(us)':>12} {'n':>5}  op")
    lines = [f"#{head[1:]}"]
    for r in rows:
        size = int(r["size"])
        lines.append(f"{size:>12} {size // itemsize:>12} {dtype:>7} {r['time_us']:>12.1f} "
                     f"{r['algbw_gbps'] / 8:>12.4f} {r['busbw_gbps'] / 8:>12.4f} {r['busbw_gbps']:>12.4f} "
                     f"{r['cct_us_p99']:>12.1f} {r['n']:>5}  {r['op']}")
    return "\n".join(lines)
