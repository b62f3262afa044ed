"""A collective job as decided before any fabric exists: schedules, the job, the placement, the message sizes.

    pl = plan_job(knobs, hosts=[("h1", "leaf1"), ...], seed=1)   # JobError (one line) on bad input
    pl.schedules, pl.job, pl.placement, pl.sizes, pl.ranks

``knobs`` is a mapping with the collective scenario's parameter names: ``collective``, ``algorithm``, ``size`` (a
size or a comma list: a sweep, one segment per size), ``buckets`` (gradient buckets: one collective each per
iteration, replaces ``size``), ``ranks``, ``iterations``, ``warmup``, ``chunks``, ``dtype``, ``placement``,
``schedule_file`` (a testbed-schedule JSON file instead of a generated schedule), ``trace_file`` (a Chakra or
ASTRA-sim trace: its ops with their compute gaps, :mod:`traffic.traces`; sizes times ``trace_bytes_scale``, compute
times ``trace_compute_scale``), ``compute_ms``, ``jitter``,
``stragglers``, ``straggler_factor``, ``straggler_prob``, ``background``, ``bg_dscp``, ``bg_rate_mbps``, ``health``
(burn-in's health.json: the flagged hosts and links are kept out of the placement, and a job that cannot be had
without them is refused with the admission's one line, traffic.admission).

Also here, pure arithmetic over what a run measured: :func:`payload_efficiency` (the alpha-beta bound's beta is per
payload byte), :func:`ops_rows` (ops.csv's rows with their step-time origin and nccl-tests size) and
:func:`tcpinfo_deltas`. Pure: no kernel, no fabric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from traffic import job as jobm
from traffic import schedule_json
from traffic.collectives import canonical_collective, make_schedule
from traffic.collectives.grouped import grouped
from traffic.job import JobError, JobSpec
from traffic.parallelism import Model, Parallelism, ParallelismError, step_ops
from traffic.admission import FabricView, Needs, admit
from traffic.health import HealthError, load_health
from traffic.placement import Placement, PlacementError, place
from traffic.rxe import rxe_mtu_for_netdev
from traffic.schedule import DTYPES, Schedule, ScheduleError, nccl_size_bytes
from traffic.traces import TraceError, load_trace

__all__ = ["JobError", "JobPlan", "plan_job", "payload_efficiency", "ops_rows", "tcpinfo_deltas", "OPS_COLUMNS",
           "op_groups"]

#: ops.csv's columns; the last two are optional in docs/rundir.md (the rank's iteration start, the nccl-tests size)
OPS_COLUMNS = ["iteration", "op", "op_index", "collective", "rank", "host", "start_s", "end_s", "bytes_sent",
               "bytes_recv", "wait_s", "iter_start_s", "size_bytes"]


@dataclass(frozen=True)
class JobPlan:
    """What every rank will run: ``schedules`` (name -> Schedule), ``job`` (segments of (op, schedule) pairs,
    compute, stragglers, background flows), ``placement`` (rank -> host), ``sizes`` (op -> per-rank message
    bytes), ``seed`` and ``ranks``."""

    schedules: dict[str, Schedule]
    job: JobSpec
    placement: Placement
    sizes: dict[str, int]
    seed: int
    ranks: int

    @property
    def first(self) -> Schedule:
        """The first schedule (algorithm, dtype and itemsize the tables report)."""
        return next(iter(self.schedules.values()))

    @property
    def hosts(self) -> list[str]:
        """Every host the job uses: the ranks' and the background flows' ends, sorted."""
        return sorted(set(self.placement.hosts) | {h for f in self.job.background for h in (f.src, f.dst)})

    def describe(self) -> str:
        return (f"{self.ranks} ranks on {', '.join(self.placement.hosts)} ({self.placement.policy}); "
                f"{self.job.iterations} iterations (+{self.job.warmup} warm-up) of "
                f"{', '.join(f'{k}={v}' for k, v in self.sizes.items())} B")


def _from_file(k: Mapping[str, Any], n_hosts: int, schedules: dict) -> tuple[list, dict, int]:
    try:
        s = schedule_json.load(k["schedule_file"])
    except OSError as e:
        raise JobError(f"schedule_file: {e.strerror}: {k['schedule_file']}") from None
    except ScheduleError as e:
        raise JobError(f"schedule_file: {e}") from None
    if s.ranks > n_hosts:
        raise JobError(f"schedule_file: {s.ranks} ranks but the fabric has only {n_hosts} hosts")
    schedules["file"] = s
    ops = ((s.collective, "file"),)
    return [jobm.Segment(ops, k["iterations"])], {s.collective: s.message_bytes}, s.ranks


def _generated(k: Mapping[str, Any], seed: int, schedules: dict) -> tuple[list, dict]:
    coll = canonical_collective(k["collective"])
    opts = {"dtype": k["dtype"], **({"algorithm": k["algorithm"]} if k["algorithm"] else {})}
    if k["algorithm"] == "hierarchical":  # NCCL's two-level all-reduce: the server is the first level
        opts["local_size"] = k.get("gpus_per_host", 1)

    def sched(m: int) -> str:  # equal sizes share one schedule
        key = f"{coll}-{m}"
        if key not in schedules:
            schedules[key] = make_schedule(coll, k["ranks"], m, chunks=k["chunks"], seed=seed, **opts)
        return key

    if k["buckets"].strip():
        buckets = jobm.parse_sizes(k["buckets"])
        ops = tuple((f"bucket{i}", sched(m)) for i, m in enumerate(buckets))
        return [jobm.Segment(ops, k["iterations"])], {f"bucket{i}": m for i, m in enumerate(buckets)}
    sweep = jobm.parse_sizes(k["size"])
    names = [coll if len(sweep) == 1 else f"{coll}-{m}" for m in sweep]
    return ([jobm.Segment(((name, sched(m)),), k["iterations"]) for name, m in zip(names, sweep)],
            dict(zip(names, sweep)))


def _from_trace(k: Mapping[str, Any], seed: int, schedules: dict) -> tuple[list, dict, float]:
    """The trace's ops as one segment ((name, schedule, compute_before_ms) per op; equal (collective, size) share a
    schedule), their sizes, and the compute after its last op (it runs at the start of the next step)."""
    try:
        trace = load_trace(k["trace_file"])
    except TraceError as e:
        raise JobError(str(e) if str(e).startswith("trace_file") else f"trace_file: {e}") from None
    if k.get("schedule_file") or k["buckets"].strip():
        raise JobError("trace_file: the trace gives the ops; leave schedule_file and buckets unset")
    item = DTYPES[k["dtype"]]
    bscale, cscale = k.get("trace_bytes_scale", 1.0), k.get("trace_compute_scale", 1.0)
    ops, sizes, seen = [], {}, {}
    for o in trace.ops:
        m = max(item, int(round(o.size_bytes * bscale / item)) * item)
        key = f"{o.collective}-{m}"
        if key not in schedules:
            schedules[key] = make_schedule(o.collective, k["ranks"], m, chunks=k["chunks"], seed=seed,
                                           dtype=k["dtype"])
        seen[o.name] = seen.get(o.name, 0) + 1
        name = o.name if seen[o.name] == 1 else f"{o.name}#{seen[o.name]}"
        ops.append((name, key, round(o.compute_before_ms * cscale, 6)))
        sizes[name] = m
    return [jobm.Segment(tuple(ops), k["iterations"])], sizes, trace.compute_after_ms * cscale


def parallel_layout(k: Mapping[str, Any]):
    """The job's Parallelism and Model from its knobs (tp, pp, ep, rank_order, model_*, micro_batches, experts, topk,
    moe_skew, grad_bucket_bytes), or None for a plain collective job (tp = ep = 1)."""
    if k.get("tp", 1) == 1 and k.get("ep", 1) == 1 and k.get("pp", 1) == 1:
        return None
    if k["ranks"] % (k["tp"] * k["pp"]):
        raise JobError(f"tp, pp: ranks ({k['ranks']}) must be a multiple of tp x pp ({k['tp']} x {k['pp']})")
    par = Parallelism(tp=k["tp"], dp=k["ranks"] // (k["tp"] * k["pp"]), ep=k["ep"], order=k["rank_order"],
                      pp=k["pp"])
    model = Model(params=k["model_params"], layers=k["model_layers"], hidden=k["model_hidden"],
                  tokens=k["model_tokens"], micro_batches=k["micro_batches"], experts=k["experts"], topk=k["topk"],
                  bucket_bytes=k["grad_bucket_bytes"], skew=k["moe_skew"])
    return par, model


def _parallel(k: Mapping[str, Any], seed: int, schedules: dict) -> tuple[list, dict]:
    """A parallel training step (traffic.parallelism): one op per grouped collective, sizes per op."""
    if k.get("schedule_file") or k.get("trace_file") or k["buckets"].strip():
        raise JobError("tp/pp/ep: the parallel layout gives the ops; leave schedule_file, trace_file and buckets unset")
    par, model = parallel_layout(k)
    ops, sizes = [], {}
    for o in step_ops(model, par, DTYPES[k["dtype"]]):
        key = f"{o.dim}-{o.collective}-{o.size_bytes}-{'-'.join(map(str, o.groups[0]))}"  # pp: fwd/bwd differ
        if key not in schedules:
            extra = {"skew": o.skew} if o.collective == "alltoall" and o.skew else {}
            sub = make_schedule(o.collective, len(o.groups[0]), o.size_bytes, chunks=k["chunks"], seed=seed,
                                dtype=k["dtype"], **extra)
            schedules[key] = grouped(sub, [list(g) for g in o.groups], par.ranks)
        ops.append((o.name, key))
        sizes[o.name] = o.size_bytes
    return [jobm.Segment(tuple(ops), k["iterations"])], sizes


def plan_job(knobs: Mapping[str, Any], hosts: Sequence[tuple[str, str]], seed: int) -> JobPlan:
    """The job over the fabric's ``hosts`` ((host, leaf), in topology order); see the module docstring.
    :class:`JobError` with a one-line message on bad input (schedule and placement errors included)."""
    k = knobs
    names = [h for h, _ in hosts]
    schedules: dict[str, Schedule] = {}
    try:
        extra_compute_ms = 0.0
        if k["schedule_file"] and not k.get("trace_file"):
            segments, sizes, ranks = _from_file(k, len(names), schedules)
        else:
            ranks, per = k["ranks"], k.get("gpus_per_host", 1)
            if ranks > len(names) * per:
                leaves = len({leaf for _, leaf in hosts})
                raise JobError(f"ranks: {ranks} ranks but the fabric has only {len(names)} hosts "
                               f"({leaves} leaves x {len(names) // max(leaves, 1)} hosts)"
                               + (f" of {per} GPUs" if per > 1 else ""))
            if parallel_layout(k) is not None:
                segments, sizes = _parallel(k, seed, schedules)
            elif k.get("trace_file"):
                segments, sizes, extra_compute_ms = _from_trace(k, seed, schedules)
            else:
                segments, sizes = _generated(k, seed, schedules)
        flows = tuple(jobm.parse_flows(k["background"], k["bg_dscp"], k["bg_rate_mbps"]))
        for f in flows:
            for h in (f.src, f.dst):
                if h not in names:
                    raise JobError(f"background: unknown host {h!r} (hosts: {', '.join(names)})")
        job = JobSpec(ranks=ranks, segments=tuple(segments), compute_ms=k["compute_ms"] + extra_compute_ms,
                      jitter=k["jitter"],
                      stragglers=tuple(jobm.parse_int_list(k["stragglers"], "stragglers")),
                      straggler_factor=k["straggler_factor"], straggler_prob=k["straggler_prob"],
                      warmup=k["warmup"], seed=seed, background=flows)
        if k.get("health"):
            placement = _admitted(k, ranks, hosts, seed)
        else:
            placement = place(ranks, hosts, k["placement"], seed, per_host=k.get("gpus_per_host", 1),
                              group=rank_group(k))
    except (ScheduleError, PlacementError, ParallelismError) as e:
        raise JobError(str(e)) from None
    return JobPlan(schedules, job, placement, sizes, seed, ranks)


def rank_group(k: Mapping[str, Any]) -> int:
    """How many consecutive ranks placement=topo keeps together: with rank_order tp-dp, tp x ep (a TP group is tp
    consecutive ranks, an EP group ep DP indices of one TP index, so both sit in a block of tp x ep); else 1."""
    if k.get("rank_order", "tp-dp") != "tp-dp":
        return 1
    return max(1, k.get("tp", 1)) * max(1, k.get("ep", 1))


def _admitted(k: Mapping[str, Any], ranks: int, hosts: Sequence[tuple[str, str]], seed: int) -> Placement:
    """The placement of a job whose ``health`` file (burn-in's health.json) says what it may not use: the
    admission decision's (traffic.admission), or JobError with its one-line refusal."""
    try:
        health = load_health(k["health"])
        health.check_fabric(h for h, _ in hosts)
    except HealthError as e:
        raise JobError(f"health: {e}") from None
    needs = Needs(ranks, per_host=k.get("gpus_per_host", 1), group=rank_group(k), policy=k["placement"], seed=seed)
    d = admit(needs, FabricView.of(hosts), health)
    if d.placement is None:
        raise JobError(f"health: {d.reason} ({health.source})")
    return d.placement


def payload_efficiency(transport: str, link_mtu: int, rdma_mtu: int = 0) -> float:
    """Payload bytes per byte the link's shaper carries, for full-size packets: what the alpha-beta bound's beta
    (seconds per payload byte) must use. HTB counts the Ethernet frame without preamble/FCS.
    TCP: MSS = MTU - 20 (IP) - 20 (TCP) - 12 (timestamps option), frame = MTU + 14 -> 1448/1514 = 0.956 at 1500.
    RoCEv2: payload = the path MTU, frame = payload + 14 (Eth) + 20 (IP) + 8 (UDP) + 12 (BTH) + 4 (ICRC)
    -> 1024/1082 = 0.946 (rxe's MTU on a 1500-byte link is 1024).
    UET (traffic.uet): payload = MTU - 20 (IP) - 8 (UDP) - 72 (its header) -> 1400/1514 = 0.925 at 1500."""
    if transport == "rdma":
        pm = rdma_mtu or rxe_mtu_for_netdev(link_mtu)
        return pm / (pm + 58)
    if transport == "uet":
        return (link_mtu - 100) / (link_mtu + 14)
    return (link_mtu - 52) / (link_mtu + 14)


def ops_rows(plan: JobPlan, ops: Sequence[Sequence], t_measure_by_rank: dict[int, float]) -> list[dict]:
    """ops.csv's rows (:data:`OPS_COLUMNS`) from the agents' op records (iteration, op, op_index, collective, rank,
    start_s, end_s, bytes_sent, bytes_recv, wait_s): plus the rank's host, when the rank began the iteration (its
    compute phase counts in the step time) and the op's nccl-tests size (a custom schedule has no nccl-tests
    convention: its message size)."""
    rows = [dict(zip(["iteration", "op", "op_index", "collective", "rank", "start_s", "end_s", "bytes_sent",
                      "bytes_recv", "wait_s"], r)) for r in ops]
    starts = jobm.iteration_starts(rows, t_measure_by_rank)
    nsize: dict[str, int] = {}
    for r in rows:
        if r["op"] not in nsize:
            try:
                nsize[r["op"]] = nccl_size_bytes(r["collective"], plan.ranks, plan.sizes[r["op"]])
            except ScheduleError:
                nsize[r["op"]] = plan.sizes[r["op"]]
        r["host"] = plan.placement.host_of(r["rank"])
        r["iter_start_s"] = round(starts[(r["rank"], r["iteration"])], 6)
        r["size_bytes"] = nsize[r["op"]]
    return rows


def tcpinfo_deltas(rows: Sequence[Sequence]) -> dict:
    """Over tcp_info.csv's rows (iteration, op_index, rank, peer, phase, info): the sum over connections of
    total_retrans growth across the recorded ops; the largest RTT and RTO seen."""
    first: dict[tuple[int, int], int] = {}
    last: dict[tuple[int, int], int] = {}
    rtt = rto = 0
    for _it, _k, rank, peer, _phase, info in rows:
        key = (rank, peer)
        first.setdefault(key, info.get("total_retrans", 0))
        last[key] = info.get("total_retrans", 0)
        rtt = max(rtt, info.get("rtt_us", 0))
        rto = max(rto, info.get("rto_us", 0))
    return {"total_retrans": sum(last[k] - first[k] for k in last), "rtt_us_max": rtt, "rto_us_max": rto}


def op_groups(plan) -> dict[str, list[list[int]]]:
    """Each grouped op's communicators (op name -> disjoint rank lists): the ranks its schedule's sends and receives
    join. ops.csv names no communicator, and analysis.correlate measures a grouped op's arrival skew per group."""
    out = {}
    for seg in plan.job.segments:
        for name, key, *_ in seg.ops:
            sched = plan.schedules[key]
            if "group_size" not in dict(sched.params):
                continue
            root = list(range(sched.ranks))

            def find(r: int) -> int:
                while root[r] != r:
                    root[r] = root[root[r]]
                    r = root[r]
                return r
            for prog in sched.programs:
                for st in prog.steps:
                    for x in (*st.sends, *st.recvs):
                        root[find(x.peer)] = find(prog.rank)
            comps: dict[int, list[int]] = {}
            for prog in sched.programs:
                if prog.steps:
                    comps.setdefault(find(prog.rank), []).append(prog.rank)
            out[str(name)] = sorted(comps.values())
    return out
