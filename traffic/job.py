"""The training-job model the collective agents replay, and the metric math over what they measure.

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

Metric definitions (the same as analysis/metrics.py, which this module must not import):

* CCT of an op = last rank's end - first rank's start (over the ranks of that (iteration, op_index));
* step time of iteration i = end(i) - end(i-1), end = when the slowest rank finished the iteration's last op,
  end(-1) = the job's start instant (the agents all start at one agreed monotonic time);
* comm-wait fraction = sum of wait_s / sum of each rank's own step times;
* percentiles are nearest-rank (an observed value); CV is sample std (ddof=1) / mean;
* algbw = nccl-tests size / mean CCT, busbw = algbw x busbw_factor (traffic.schedule).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from traffic.schedule import busbw_factor, nccl_size_bytes

__all__ = ["JobError", "BackgroundFlow", "JobSpec", "parse_size", "parse_sizes", "parse_int_list", "parse_flows",
           "compute_plan", "iteration_plan", "nearest_rank", "percentiles", "cv", "op_cct", "step_times",
           "rank_step_times", "comm_wait_fraction", "nccl_rows", "format_nccl_table"]


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
    """``iterations`` iterations, each running the ops ``[(name, schedule key), ...]`` after its compute phase."""

    ops: tuple[tuple[str, str], ...]
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


# ---- metric math ---------------------------------------------------------------------------------------------


def nearest_rank(values: Iterable[float], q: float) -> float:
    """The q-quantile (0 < q <= 1) by nearest rank: the ceil(q n)-th smallest value; nan when empty."""
    v = sorted(x for x in values if x == x)
    if not v:
        return math.nan
    k = max(1, math.ceil(q * len(v) - 1e-9))
    return v[min(k, len(v)) - 1]


def percentiles(values: Iterable[float]) -> dict[str, float]:
    v = [x for x in values if x == x]
    return {"p50": nearest_rank(v, 0.50), "p95": nearest_rank(v, 0.95), "p99": nearest_rank(v, 0.99),
            "p999": nearest_rank(v, 0.999), "max": max(v) if v else math.nan,
            "mean": sum(v) / len(v) if v else math.nan, "n": len(v)}


def cv(values: Sequence[float]) -> float:
    v = [x for x in values if x == x]
    if len(v) < 2:
        return math.nan
    m = sum(v) / len(v)
    if m == 0:
        return math.nan
    var = sum((x - m) ** 2 for x in v) / (len(v) - 1)
    return math.sqrt(var) / m


# an op row: dict with iteration, op_index, op, collective, rank, start_s, end_s, wait_s (ops.csv columns)

def op_cct(rows: Sequence[dict]) -> list[dict]:
    """One dict per (iteration, op_index): iteration, op_index, op, collective, ranks, start_s, end_s, cct_s."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((int(r["iteration"]), int(r["op_index"])), []).append(r)
    out = []
    for (it, k), g in sorted(groups.items()):
        s = min(float(r["start_s"]) for r in g)
        e = max(float(r["end_s"]) for r in g)
        out.append({"iteration": it, "op_index": k, "op": g[0]["op"], "collective": g[0]["collective"],
                    "ranks": len(g), "start_s": s, "end_s": e, "cct_s": e - s})
    return out


def step_times(rows: Sequence[dict], t_start: float) -> list[float]:
    """Step time per iteration (in iteration order): end(i) - end(i-1), end(-1) = t_start."""
    ends: dict[int, float] = {}
    for r in rows:
        it = int(r["iteration"])
        ends[it] = max(ends.get(it, -math.inf), float(r["end_s"]))
    out, prev = [], t_start
    for it in sorted(ends):
        out.append(ends[it] - prev)
        prev = ends[it]
    return out


def rank_step_times(rows: Sequence[dict], t_start: float | dict[int, float]) -> dict[int, list[tuple[float, float]]]:
    """rank -> [(own step time, summed wait_s)] per iteration, the rank's own ends as boundaries; ``t_start`` is
    the common origin or {rank: that rank's own origin} (e.g. when it finished its warm-up)."""
    per: dict[int, dict[int, list[float]]] = {}
    for r in rows:
        d = per.setdefault(int(r["rank"]), {})
        e = d.setdefault(int(r["iteration"]), [-math.inf, 0.0])
        e[0] = max(e[0], float(r["end_s"]))
        e[1] += float(r["wait_s"])
    out = {}
    for rank, d in per.items():
        prev = t_start[rank] if isinstance(t_start, dict) else t_start
        lst = []
        for it in sorted(d):
            end, wait = d[it]
            lst.append((end - prev, wait))
            prev = end
        out[rank] = lst
    return out


def comm_wait_fraction(rows: Sequence[dict], t_start: float | dict[int, float]) -> float:
    """Sum of wait_s / sum of per-rank step times (nan without data)."""
    per = rank_step_times(rows, t_start)
    step = sum(s for lst in per.values() for s, _ in lst)
    wait = sum(w for lst in per.values() for _, w in lst)
    return wait / step if step > 0 else math.nan


def nccl_rows(ccts: Sequence[dict], ranks: int, sizes: dict[str, int]) -> list[dict]:
    """nccl-tests-style rows per op name (in first-seen order): size (nccl-tests size), count (elements are
    filled in by the caller), time_us (mean CCT), algbw_gbps, busbw_gbps, cct_us_p50/p99, n."""
    by: dict[str, list[dict]] = {}
    for c in ccts:
        by.setdefault(c["op"], []).append(c)
    out = []
    for name, g in by.items():
        coll = g[0]["collective"]
        m = sizes[name]
        size = nccl_size_bytes(coll, ranks, m)
        t = [c["cct_s"] for c in g]
        mean = sum(t) / len(t)
        alg = size / mean / 1e9 * 8 if mean > 0 else math.nan
        out.append({"op": name, "collective": coll, "message_bytes": m, "size": size, "time_us": mean * 1e6,
                    "algbw_gbps": alg, "busbw_gbps": alg * busbw_factor(coll, ranks),
                    "cct_us_p50": nearest_rank(t, 0.5) * 1e6, "cct_us_p99": nearest_rank(t, 0.99) * 1e6,
                    "n": len(t)})
    return out


def format_nccl_table(rows: Sequence[dict], dtype: str = "float", itemsize: int = 4) -> str:
    """The nccl-tests layout: size, count, type, time (us), algbw, busbw (GB/s as nccl-tests prints; we add
    Gbit/s because emulated links are slow)."""
    head = (f"{'size':>12} {'count':>12} {'type':>7} {'time(us)':>12} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} "
            f"{'busbw(Gb/s)':>12} {'p99(us)':>12} {'n':>5}  op")
    lines = [f"#{head[1:]}"]
    for r in rows:
        lines.append(f"{r['size']:>12} {r['size'] // itemsize:>12} {dtype:>7} {r['time_us']:>12.1f} "
                     f"{r['algbw_gbps'] / 8:>12.4f} {r['busbw_gbps'] / 8:>12.4f} {r['busbw_gbps']:>12.4f} "
                     f"{r['cct_us_p99']:>12.1f} {r['n']:>5}  {r['op']}")
    return "\n".join(lines)
