"""A collective job's settings as one typed object: what :meth:`testbed.lab.Lab.collective` takes.

    from testbed.workloads.settings import CollectiveSettings, Parallel, Program, Trace

    CollectiveSettings("allreduce", size="1M", ranks=4)          # a generated schedule (ring, tree, ... by name)
    CollectiveSettings(parallel=Parallel(tp=2), ranks=8)         # a training step's ops from a parallel layout
    CollectiveSettings(trace=Trace("examples/traces/small-dp.0.et"), ranks=2)   # a Chakra/ASTRA-sim trace's ops
    CollectiveSettings(program=Program("my-schedule.json"))      # a testbed-schedule file's per-rank programs
    CollectiveSettings.from_params(p)                            # the collective scenario's resolved parameters

Each field is checked when the object is made, against the declarations the collective scenario's ``--set`` uses
(:data:`JOB_PARAMS`: type, range, choices): a bad value is a UsageError of one line naming the parameter, as on the
command line. What needs the fabric (ranks against its hosts, the background flows' hosts, a schedule file's ranks,
rdma_mtu against the link MTU) is :meth:`CollectiveSettings.plan`'s check, which ``lab.collective`` makes and a
script can make first against its topology (:meth:`CollectiveSettings.check`), before anything is built.
The knobs themselves are traffic.jobplan's (it plans the job from :meth:`CollectiveSettings.knobs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

from testbed.errors import UsageError
from testbed.params import Param
from topologies import LeafSpineSpec, Topology
from topologies.mininet_topo import spec_from_topo
from traffic.jobplan import JobError, plan_job
from traffic.rdma import check_path_mtu
from traffic.uet_options import ENTROPY_VALUES, entropy_values_problem

P, MBPS, B = Param, "Mbit/s", "bytes"
#: the knobs of a collective job, declared once: what traffic.jobplan.plan_job reads (collective .. bg_rate_mbps,
#: seed) and what :class:`CollectiveJob` takes (verify, timeout_s, transport, the rdma_* RC options)
JOB_PARAMS = [
    P("collective", str, "allreduce", "", "allreduce|allgather|reducescatter|alltoall|broadcast|reduce|gather|"
      "pipeline (aliases all_reduce, incast, ...)"),
    P("algorithm", str, "", "", "schedule algorithm (empty: the collective's default, e.g. ring)"),
    P("size", str, "1M", B, "per-rank message size, or a comma list (1K,64K,1M) for a sweep in one run"),
    P("buckets", str, "", B, "gradient buckets: comma list of sizes, one collective each per iteration "
      "(replaces size)"),
    P("ranks", int, 4, "", "ranks (gpus_per_host per host, packed)", min=2, max=1024),
    P("gpus_per_host", int, 1, "", "ranks (GPUs) per host: a server's ranks are consecutive and talk over its "
      "scale-up domain (the host's shaped loopback, scaleup_rate_mbps); algorithm=hierarchical uses it as NCCL's "
      "first level", min=1, max=16),
    P("iterations", int, 5, "", "measured iterations (per size of a sweep)", min=1, max=100_000),
    P("warmup", int, 1, "", "unreported warm-up iterations before the measured ones", min=0, max=1000),
    P("chunks", int, 1, "", "pieces per transfer (pipelining)", min=1, max=4096),
    P("dtype", str, "float32", "", "element type", choices=("float32", "float16", "float64", "int32", "int64")),
    P("placement", str, "packed", "", "rank -> host placement: packed (leaf by leaf), spread (round-robin over "
      "leaves), random (seeded), topo (fewest leaves, TP/EP groups inside a server or leaf: traffic.placement)",
      choices=("packed", "spread", "random", "topo")),
    P("health", str, "", "", "burn-in's health.json (testbed burnin): the hosts and links it flagged are left out "
      "of the placement; a job that cannot be had without them is refused before anything is built"),
    P("schedule_file", str, "", "", "a testbed-schedule JSON file to run instead of a generated schedule"),
    P("trace_file", str, "", "", "a Chakra execution trace (.et) or ASTRA-sim text workload to run instead: its "
      "collectives in order with its compute between them (docs/programs.md#traces); replaces collective, size"),
    P("trace_bytes_scale", float, 1.0, "", "trace_file: every comm size times this (a 400 Gbit/s trace on a "
      "20 Mbit/s fabric: 5e-5 keeps its ratios)", min=1e-9, max=1e6),
    P("trace_compute_scale", float, 1.0, "", "trace_file: every compute time times this", min=0, max=1e6),
    P("tp", int, 1, "", "tensor-parallel size: with tp (or ep) > 1 the step's ops come from the parallel layout and "
      "the model (traffic.parallelism): TP all-reduces per layer, EP all-to-alls, DP gradient buckets; dp = ranks / "
      "tp", min=1, max=64),
    P("pp", int, 1, "", "pipeline-parallel stages (divides model_layers): activations stage to stage per micro-batch; "
      "dp = ranks / (tp x pp)", min=1, max=64),
    P("ep", int, 1, "", "expert-parallel size (divides dp; needs experts > 0)", min=1, max=64),
    P("rank_order", str, "tp-dp", "", "tp-dp: a TP group is consecutive ranks (inside a server with gpus_per_host = "
      "tp); dp-tp: TP groups strided across servers and leaves", choices=("tp-dp", "dp-tp")),
    P("model_params", int, 1_000_000, "", "model parameters (the DP gradient all-reduce moves params / tp elements)",
      min=1, max=10**12),
    P("model_layers", int, 2, "", "transformer layers", min=1, max=1000),
    P("model_hidden", int, 256, "", "hidden size (a TP all-reduce moves tokens x hidden elements)", min=1,
      max=1 << 20),
    P("model_tokens", int, 64, "", "tokens per micro-batch per DP rank", min=1, max=1 << 24),
    P("micro_batches", int, 2, "", "micro-batches per step", min=1, max=1000),
    P("experts", int, 0, "", "MoE experts per layer (0: dense); with ep > 1 every layer all-to-alls its tokens",
      min=0, max=4096),
    P("topk", int, 1, "", "experts each token goes to", min=1, max=64),
    P("moe_skew", float, 0.0, "", "MoE all-to-all skew: hot experts get more tokens (0: even)", min=0, max=10),
    P("grad_bucket_bytes", int, 1 << 20, B, "DP gradient bucket size", min=4, max=1 << 34),
    P("compute_ms", float, 0.0, "ms", "compute phase per iteration", min=0, max=600_000),
    P("jitter", float, 0.0, "", "compute time uniform in [1-jitter, 1+jitter] x compute_ms", min=0, max=0.99),
    P("stragglers", str, "", "", "straggler ranks, comma list (e.g. 1,3)"),
    P("straggler_factor", float, 1.0, "", "a straggler's compute time multiplier", min=1, max=1000),
    P("straggler_prob", float, 1.0, "", "probability a straggler straggles in an iteration", min=0, max=1),
    P("background", str, "", "", "background bulk flows SRC>DST host pairs, e.g. h1>h3,h2>h4"),
    P("bg_dscp", int, 0, "", "DSCP of background flows", min=0, max=63),
    P("bg_rate_mbps", float, 0.0, MBPS, "pace each background flow (0: unpaced bulk)", min=0, max=100_000),
    P("seed", int, 0, "", "inputs, placement, jitter and stragglers (0: the run's --seed)", min=0, max=2**31 - 1),
    P("verify", bool, True, "", "check every rank's result against expected_outputs"),
    P("timeout_s", float, 600.0, "s", "agent start-up, and then the whole job, must each finish within this", min=1,
      max=86_400),
    P("transport", str, "tcp", "", "data plane of the agents: kernel TCP, RDMA (RC verbs over an rxe SoftRoCE "
      "device per host; needs rxe:netns), or uet (Ultra Ethernet-style reliable unordered delivery over UDP, "
      "sprayed by entropy value: docs/uet.md)", choices=("tcp", "rdma", "uet")),
    P("entropy_values", int, ENTROPY_VALUES, "", "transport=uet: UDP source ports each rank sprays a peer's packets "
      "over in turn (UEC's entropy values; the fabric's L4 ECMP hash maps each to a path)", min=1, max=256),
    P("rdma_mtu", int, 0, B, "RDMA path MTU (256|512|1024|2048|4096; 0: the rxe port's active MTU, set by the link "
      "MTU)", min=0, max=4096),
    P("rdma_timeout", int, 16, "", "RC local ACK timeout exponent: 4.096 us x 2^value", min=1, max=31),
    P("rdma_retry_cnt", int, 7, "", "RC transport retries before the QP fails", min=0, max=7),
    P("rdma_rnr_retry", int, 7, "", "RC receiver-not-ready retries (7: forever)", min=0, max=7),
    P("rdma_min_rnr_timer", int, 12, "", "RC minimum RNR NAK timer, IB encoding (12: 0.64 ms; rdma_cm's default 0 "
      "means 655 ms)", min=0, max=31),
]

_BY_NAME = {q.name: q for q in JOB_PARAMS}
#: how a job meets the fabric, beyond its knobs (ranges only; the scenario declares its own help for them)
_RUN_CHECKS = {q.name: q for q in (
    P("dscp", int, 0, "", "", min=0, max=63),
    P("cc", str, "", "", "", choices=("", "cubic", "reno", "dctcp", "bbr")),
    P("sample_interval_ms", float, 10.0, "ms", "", min=0, max=1000),
    P("scaleup_rate_mbps", float, 200.0, MBPS, "", min=0.1, max=1_000_000),
    P("scaleup_buffer_bytes", int, 256 * 1024, B, "", min=3000, max=1 << 30))}


def _checked(obj, prefix: str = "") -> None:
    """Check each field of the dataclass ``obj`` against its Param (named ``prefix + field``): type, then range and
    choices (Param.check); an int given for a float becomes a float."""
    for f in dataclasses.fields(obj):
        q = _BY_NAME.get(prefix + f.name) or _RUN_CHECKS.get(prefix + f.name)
        if q is None:
            continue
        v = getattr(obj, f.name)
        if q.kind is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
            object.__setattr__(obj, f.name, v)
        ok = isinstance(v, q.kind) and not (q.kind is not bool and isinstance(v, bool))
        if not ok:
            raise UsageError(f"{q.name}: not a valid {q.kind.__name__} ({v!r})")
        q.check(v)


def _text(v: Any, what: str) -> str:
    """A size list, rank list or host-pair list as the comma text the knobs use ('1K,64K', '1,3', 'h1>h3')."""
    if isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, Sequence):
        return ",".join(f"{x[0]}>{x[1]}" if isinstance(x, (tuple, list)) else str(x) for x in v)
    raise UsageError(f"{what}: expected text or a list (got {v!r})")


@dataclass(frozen=True)
class Parallel:
    """A training step from a parallel layout and a model (traffic.parallelism): TP all-reduces per layer, EP
    all-to-alls, PP activations stage to stage, DP gradient buckets; dp = ranks / (tp x pp). The fields are the
    scenario's parameters of the same names."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    rank_order: str = "tp-dp"
    model_params: int = 1_000_000
    model_layers: int = 2
    model_hidden: int = 256
    model_tokens: int = 64
    micro_batches: int = 2
    experts: int = 0
    topk: int = 1
    moe_skew: float = 0.0
    grad_bucket_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        _checked(self)


@dataclass(frozen=True)
class Trace:
    """A Chakra execution trace (.et) or ASTRA-sim text workload (traffic.traces): its collectives in order with its
    compute between them; every size times ``bytes_scale``, every compute time times ``compute_scale``
    (the parameters trace_file, trace_bytes_scale, trace_compute_scale)."""

    file: str
    bytes_scale: float = 1.0
    compute_scale: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.file, str) or not self.file:
            raise UsageError(f"trace_file: a file name (got {self.file!r})")
        _checked(self, "trace_")


@dataclass(frozen=True)
class Program:
    """A testbed-schedule JSON file (docs/schedules.md): one program of steps per rank, run as written (the parameter
    schedule_file); the file gives the ranks."""

    file: str

    def __post_init__(self) -> None:
        if not isinstance(self.file, str) or not self.file:
            raise UsageError(f"schedule_file: a file name (got {self.file!r})")


@dataclass(frozen=True)
class Rdma:
    """RC queue-pair options of transport=rdma (the parameters rdma_mtu, rdma_timeout, ...): path MTU (0: the rxe
    port's), local ACK timeout exponent, retries, RNR retries, minimum RNR NAK timer."""

    mtu: int = 0
    timeout: int = 16
    retry_cnt: int = 7
    rnr_retry: int = 7
    min_rnr_timer: int = 12

    def __post_init__(self) -> None:
        _checked(self, "rdma_")


#: the forms of a job besides a generated collective (its name and sizes)
Form = Union[Parallel, Trace, Program]


@dataclass(frozen=True)
class CollectiveSettings:
    """One collective job (see the module docstring). The job's knobs carry the collective scenario's parameter
    names and defaults (:data:`JOB_PARAMS`); ``size``, ``buckets`` and ``stragglers`` also take lists, ``background``
    a list of (src, dst) pairs. Beyond them, how the job meets the fabric: ``dscp`` of its packets, ``cc`` (empty:
    the fabric's [tcp] congestion control), ``sample_interval_ms`` (a queue sampler from the moment the agents are
    connected, queues.csv; 0: none), and with ``gpus_per_host`` > 1 the scale-up domain each host's ranks share (its
    loopback shaped at ``scaleup_rate_mbps`` with ``scaleup_buffer_bytes``)."""

    collective: str = "allreduce"
    algorithm: str = ""
    size: str = "1M"
    buckets: str = ""
    ranks: int = 4
    gpus_per_host: int = 1
    iterations: int = 5
    warmup: int = 1
    chunks: int = 1
    dtype: str = "float32"
    placement: str = "packed"
    health: str = ""
    parallel: Parallel | None = None
    trace: Trace | None = None
    program: Program | None = None
    compute_ms: float = 0.0
    jitter: float = 0.0
    stragglers: str = ""
    straggler_factor: float = 1.0
    straggler_prob: float = 1.0
    background: str = ""
    bg_dscp: int = 0
    bg_rate_mbps: float = 0.0
    seed: int = 0
    verify: bool = True
    timeout_s: float = 600.0
    transport: str = "tcp"
    entropy_values: int = ENTROPY_VALUES
    rdma: Rdma = field(default_factory=Rdma)
    dscp: int = 0
    cc: str = ""
    sample_interval_ms: float = 10.0
    scaleup_rate_mbps: float = 200.0
    scaleup_buffer_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        for name in ("size", "buckets", "stragglers", "background"):
            object.__setattr__(self, name, _text(getattr(self, name), name))
        for name, kind in (("parallel", Parallel), ("trace", Trace), ("program", Program), ("rdma", Rdma)):
            v = getattr(self, name)
            if not isinstance(v, kind) and not (v is None and name != "rdma"):
                raise UsageError(f"{name}: expected a {kind.__name__} (got {v!r})")
        _checked(self)
        problem = entropy_values_problem(self.transport, self.entropy_values)
        if problem:
            raise UsageError(problem)

    @classmethod
    def from_params(cls, p: Mapping[str, Any], **more: Any) -> "CollectiveSettings":
        """From a mapping with :data:`JOB_PARAMS`' names (the collective scenario's resolved parameters): the
        parallel form when tp, pp or ep is above 1, the trace form with a trace_file, the program form with a
        schedule_file. ``more``: the other fields (dscp, cc, sample_interval_ms, scaleup_*)."""
        par = {f.name: p[f.name] for f in dataclasses.fields(Parallel)}
        flat = {f.name: p[f.name] for f in dataclasses.fields(cls) if f.name in _BY_NAME}
        return cls(**flat,
                   parallel=Parallel(**par) if max(p["tp"], p["pp"], p["ep"]) > 1 else None,
                   trace=(Trace(p["trace_file"], p["trace_bytes_scale"], p["trace_compute_scale"])
                          if p["trace_file"] else None),
                   program=Program(p["schedule_file"]) if p["schedule_file"] else None,
                   rdma=Rdma(**{f.name: p[f"rdma_{f.name}"] for f in dataclasses.fields(Rdma)}), **more)

    def knobs(self) -> dict[str, Any]:
        """Every :data:`JOB_PARAMS` name with its value: what traffic.jobplan.plan_job reads."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in _BY_NAME}
        out.update(dataclasses.asdict(self.parallel or Parallel()))
        tr = self.trace
        out.update(trace_file=tr.file if tr else "", trace_bytes_scale=tr.bytes_scale if tr else 1.0,
                   trace_compute_scale=tr.compute_scale if tr else 1.0,
                   schedule_file=self.program.file if self.program else "",
                   **{f"rdma_{k}": v for k, v in dataclasses.asdict(self.rdma).items()})
        return out

    def plan(self, spec, seed: int):
        """The job on the leaf-spine ``spec`` (a topologies spec) with ``seed`` (this one's ``seed`` unless 0): a
        traffic.jobplan.JobPlan, or UsageError (one line) on what the fabric cannot take."""
        if not isinstance(spec, LeafSpineSpec):
            raise UsageError(f"collective: the job runs on a leaf-spine fabric (LeafSpineTopo, or a topology file of "
                             f"kind \"leafspine\"), not a {getattr(spec, 'kind', type(spec).__name__)}")
        return job_plan(self.knobs(), spec, self.seed or seed)

    def check(self, topo, seed: int = 1) -> None:
        """Plan the job against ``topo`` (a Mininet Topo of topologies.mininet_topo, or a spec) without building
        anything: what ``lab.collective`` would refuse is refused here, before the Lab exists."""

        self.plan(topo if isinstance(topo, Topology) else spec_from_topo(topo), seed)


def settings_for(what: "str | CollectiveSettings | Form" = "allreduce", **fields: Any) -> CollectiveSettings:
    """What ``lab.collective(what, **fields)`` runs: a collective's name, a form (Parallel, Trace, Program) or whole
    settings, with ``fields`` (CollectiveSettings' fields) on top."""
    if isinstance(what, CollectiveSettings):
        return dataclasses.replace(what, **fields)
    form = {Parallel: "parallel", Trace: "trace", Program: "program"}.get(type(what))
    if form is not None:
        return CollectiveSettings(**{form: what}, **fields)
    if isinstance(what, str):
        return CollectiveSettings(collective=what, **fields)
    raise UsageError(f"collective: a collective's name, Parallel, Trace, Program or CollectiveSettings (got {what!r})")


def job_plan(p: Mapping[str, Any], spec, seed: int):
    """The plan of a job whose knobs are :data:`JOB_PARAMS`' values ``p``, on the fabric ``spec`` (its hosts and
    leaves; rdma_mtu is checked against its host links): UsageError, one line, on bad input."""

    try:
        check_path_mtu(p["rdma_mtu"], spec.host_link.mtu, on_rdma=p["transport"] == "rdma")
    except ValueError as e:
        raise UsageError(f"rdma_mtu: {e}") from None
    try:
        return plan_job(p, [(h.name, spec.leaf_of(h.name)) for h in spec.hosts], seed)
    except JobError as e:
        raise UsageError(str(e)) from None
