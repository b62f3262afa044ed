"""What the Lab hands back for traffic it started: :class:`Flows` (long-lived bulk TCP flows, ``lab.flows``),
:class:`Burst` (the rounds of a synchronized incast, ``lab.burst``) and :class:`Collective` (a collective job,
``lab.collective``); with what starts the first two (:func:`start_flows`, :func:`run_burst`) and the run directory's
``flows.csv`` and ``rounds.csv`` that every call appends to (:class:`TrafficFiles`)."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence
from analysis.load import load_csv
from analysis.metrics import op_table, percentiles, round_times
from analysis.summary import headline_ops
from testbed.errors import RunFailed, UsageError
from testbed.kernel import netns
from testbed.kernel.qdisc import shape_loopback
from testbed.workloads import serverlab
from testbed.workloads.collective import CollectiveJob
from traffic.background import BackgroundFlows
from traffic.incast import IncastRounds, ROUNDS_COLUMNS
from traffic.job import BackgroundFlow
from traffic.uet_incast import UetIncastRounds

if TYPE_CHECKING:
    from testbed.workloads.settings import CollectiveSettings

FLOW_COLUMNS = ["flow", "src", "dst", "src_port", "dst_port", "dscp", "start_s", "end_s", "bytes", "seconds",
                "goodput_mbps"]
UET_COLUMNS = ["rank", "host", "counter", "value"]  # uet.csv (analysis.uet), as the collective job writes it


def host_name(host) -> str:
    """A host given by name or as a Mininet node."""
    return host if isinstance(host, str) else host.name


class TrafficFiles:
    """``flows.csv`` and ``rounds.csv`` of one lab: each :func:`start_flows` and :func:`run_burst` adds its rows and
    the file is written again whole, under one lock (flows stop from timer threads; bursts may run in threads)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.flow_rows: list[tuple] = []
        self.round_rows: list[tuple] = []
        self.uet_rows: dict[str, list[tuple]] = {}  # per run directory (a collective job may have its own)
        self.host_ids: dict[str, int] = {}  # uet.csv's rank column: one number per host for the whole lab

    def add_flows(self, rundir, stats: list[dict]) -> None:
        with self.lock:
            first = len(self.flow_rows)
            self.flow_rows += [(first + i, s["src"], s["dst"], s["src_port"], s["dst_port"], s["dscp"],
                                f"{s['start_s']:.6f}", f"{s['end_s']:.6f}", s["bytes"], f"{s['seconds']:.6f}",
                                f"{s['goodput_mbps']:.6f}") for i, s in enumerate(stats)]
            rundir.write_csv("flows.csv", FLOW_COLUMNS, self.flow_rows)

    def next_round(self) -> int:
        with self.lock:
            return 1 + max((r[0] for r in self.round_rows), default=-1)

    def add_rounds(self, rundir, rows: list[tuple]) -> None:

        with self.lock:
            self.round_rows += rows
            rundir.write_csv("rounds.csv", ROUNDS_COLUMNS, ((r, h, f"{s:.6f}", f"{e:.6f}", b)
                                                            for r, h, s, e, b in self.round_rows))

    def add_uet(self, rundir, per_host: dict[str, dict[str, int]]) -> None:
        """UET transport counters per host (each burst and collective job appends its rows; analysis.uet sums them
        by host). The rank column is the host's number in this lab, the same in every burst and job."""
        with self.lock:
            rows = self.uet_rows.setdefault(str(rundir.path), [])
            for h in per_host:
                self.host_ids.setdefault(h, len(self.host_ids))
            rows += [(self.host_ids[h], h, k, v) for h, c in per_host.items() for k, v in sorted(c.items())]
            rundir.write_csv("uet.csv", UET_COLUMNS, rows)


def start_flows(lab, pairs: Sequence[tuple], duration_s: float | None, cc: str | None, src_ports, dscp: int,
                ack_dscp: int | None, rate_mbps: float) -> "Flows":
    """What :meth:`testbed.lab.Lab.flows` does (its docstring): the senders started, a :class:`Flows` back."""

    pairs = [(host_name(a), host_name(b)) for a, b in pairs]
    sports = list(src_ports) if src_ports is not None else [0] * len(pairs)
    if len(sports) != len(pairs):
        raise ValueError(f"flows: {len(pairs)} pairs but {len(sports)} source ports")
    records = [BackgroundFlow(a, b, dscp=dscp, rate_mbps=rate_mbps, src_port=sp, ack_dscp=ack_dscp)
               for (a, b), sp in zip(pairs, sports)]
    bg = BackgroundFlows(records, lab.endpoints({h for p in pairs for h in p}), netns.entered, cc=cc,
                         base_port=lab.next_ports(len(records)), cc_by_host=lab.host_cc())
    handle = Flows(bg, lambda stats: lab.files.add_flows(lab.rundir, stats))
    lab.on_teardown(handle.stop)
    bg.start()
    lab.start_workload()
    if duration_s is not None:
        handle.stop_after(duration_s)
    lab.progress(f"{len(records)} flow(s) running: " + ", ".join(f"{a}>{b}" for a, b in pairs))
    return handle


def run_burst(lab, senders: Sequence, receiver, size_bytes: int, rounds: int, at_s: float | None,
              cc: str | None, transport: str = "tcp", uet: dict | None = None) -> "Burst":
    """What :meth:`testbed.lab.Lab.burst` does (its docstring): the rounds run, a :class:`Burst` back."""

    names = [host_name(h) for h in senders]
    rname = host_name(receiver)
    ends = lab.endpoints([rname, *names])
    if transport == "uet":
        inc = UetIncastRounds(names, rname, ends, netns.entered, size_bytes, uet=uet)
    elif transport == "tcp":
        inc = IncastRounds(names, rname, ends, netns.entered, size_bytes, port=lab.next_ports(1), cc=cc,
                           cc_by_host=lab.host_cc())
    else:
        raise UsageError(f"burst: transport must be tcp or uet (got {transport!r})")
    try:
        inc.connect()
        if at_s is not None:
            time.sleep(max(0.0, lab.t_up + at_s - time.monotonic()))
        lab.progress(f"burst: {rounds} round(s) of {len(names)} x {size_bytes} B -> {rname}")
        lab.start_workload()
        rows = inc.run(rounds, first_round=lab.files.next_round())
        mismatches = getattr(inc, "mismatches", 0)  # UET checks each block it received against what was sent
        if transport == "uet":
            per_host = inc.per_host()
            per_host[rname] = {**per_host.get(rname, {}), "block_mismatches": mismatches}
            lab.files.add_uet(lab.rundir, per_host)
    finally:
        inc.close()
    lab.files.add_rounds(lab.rundir, rows)
    if mismatches:
        raise RunFailed(f"burst: {mismatches} block(s) arrived at {rname} different from what was sent "
                        f"(uet.csv: block_mismatches)")
    return Burst(rows)


class Flows:
    """Long-lived TCP flows started by :meth:`Lab.flows`: ``snapshot()`` while they run, ``stop()`` (or
    ``wait()`` when a duration was given) for their stats, one dict per flow: src, dst, src_port, dst_port, dscp,
    start_s, end_s, bytes, seconds, goodput_mbps."""

    def __init__(self, bg, on_stop: Callable[[list[dict]], None]):
        self.bg = bg
        self._on_stop = on_stop
        self._lock = threading.Lock()
        self._stats: list[dict] | None = None
        self._timer: threading.Timer | None = None
        self.stop_at = None

    @property
    def ports(self) -> list[tuple[int, int]]:
        """(source, destination) port of each flow."""
        return list(self.bg.ports)

    def snapshot(self) -> tuple[float, list[int]]:
        """(monotonic time, bytes received so far per flow)."""
        return self.bg.snapshot()

    @staticmethod
    def goodput_mbps(before: tuple[float, list[int]], after: tuple[float, list[int]]) -> list[float]:
        """Each flow's goodput between two snapshots."""
        dt = after[0] - before[0]
        return [(b - a) * 8 / dt / 1e6 if dt > 0 else 0.0 for a, b in zip(before[1], after[1])]

    def stop_after(self, seconds: float) -> None:
        self.stop_at = time.monotonic() + seconds
        self._timer = threading.Timer(seconds, self.stop)
        self._timer.daemon = True
        self._timer.start()

    def wait(self) -> list[dict]:
        """Until the duration given to :meth:`Lab.flows` has passed, then :meth:`stop`."""
        if self.stop_at is not None:
            time.sleep(max(0.0, self.stop_at - time.monotonic()))
        return self.stop()

    def stop(self) -> list[dict]:
        """Stop the senders (idempotent); returns the per-flow stats and writes them to ``flows.csv``."""
        with self._lock:
            if self._stats is None:
                if self._timer is not None:
                    self._timer.cancel()
                stats = self.bg.stop()
                for i, s in enumerate(stats):
                    s["start_s"] = self.bg.t_start
                    s["end_s"] = self.bg.t_last[i] or self.bg.t_start
                self._stats = stats
                if self.bg.errors:
                    print(f"testbed: flows: {'; '.join(self.bg.errors)}", file=sys.stderr)
                self._on_stop(stats)
            return self._stats


class Burst:
    """The rounds of one :meth:`Lab.burst`: ``rows`` (round, sender, start_s, end_s, bytes), ``round_ms`` (each
    round's completion time: its first sender's start to the receiver reading its last byte), ``start_s``/``end_s``
    (the burst's span) and :meth:`percentiles_ms` (analysis.metrics' nearest-rank p50/p95/p99/max)."""

    def __init__(self, rows: list[tuple]):
        import pandas as pd


        self.rows = rows
        self.rounds = round_times(pd.DataFrame(rows, columns=["round", "sender", "start_s", "end_s", "bytes"]))
        self.round_ms = [float(x) * 1e3 for x in self.rounds["round_s"]]
        self.start_s = float(self.rounds["start_s"].min())
        self.end_s = float(self.rounds["end_s"].max())

    def percentiles_ms(self):

        return percentiles(self.round_ms)


class Collective:
    """A collective job on a lab (:meth:`testbed.lab.Lab.collective`), made from :class:`CollectiveSettings`: the job
    is planned on the lab's fabric and its agents' fork server started when this is made; with ``gpus_per_host`` > 1
    each host's scale-up domain (its loopback) is shaped then too. :meth:`run` runs the job to its end
    (testbed.workloads.collective.CollectiveJob: ops.csv, tcp_info.csv, tcp.csv, queues.csv, ...); then
    :meth:`summary` (summary.json's numbers; it writes sweep.csv and prints the nccl-tests table, once),
    :attr:`verified` (every rank's result checked equal to the expected one), :attr:`cct_ms` (the measured
    completion time of each headline op: a sweep's largest size, or every bucket), :meth:`percentiles_ms` and
    :attr:`port_deltas` (the ports' kernel counters over the job)."""

    def __init__(self, lab, settings: "CollectiveSettings"):

        s, spec = settings, lab.net.spec
        self.lab, self.settings = lab, s
        if getattr(lab, "server_run", None) is not None:  # what a lab over servers cannot run yet: one line
            serverlab.check(dataclasses.asdict(s))
        plan = s.plan(spec, lab.seed)
        self.job = CollectiveJob(lab, plan, s.transport, s.cc or spec.tcp.congestion_control, s.dscp,
                                 dataclasses.asdict(s.rdma), s.verify, s.timeout_s, s.sample_interval_ms,
                                 uet={"entropy_values": s.entropy_values})
        if s.gpus_per_host > 1:
            self._scale_up()
        self._summary: dict | None = None
        self._cct_ms: list[float] | None = None

    @property
    def plan(self):
        """The job as planned (traffic.jobplan.JobPlan: schedules, placement, sizes)."""
        return self.job.plan

    def _scale_up(self) -> None:
        """Each host's ranks share its loopback, shaped as the server's scale-up domain (NVLink-class)."""

        s, lab = self.settings, self.lab
        for host in dict.fromkeys(self.plan.placement.hosts):
            shape_loopback(lab.net.ns(host), s.scaleup_rate_mbps, s.scaleup_buffer_bytes)
        lab.rundir.manifest["scale_up"] = {"gpus_per_host": s.gpus_per_host, "rate_mbps": s.scaleup_rate_mbps}
        lab.progress(f"{s.gpus_per_host} GPUs per host; scale-up domain (loopback) at {s.scaleup_rate_mbps:g} Mbit/s")

    def run(self) -> "Collective":
        """Run the job to its end (once). RunFailed (naming the agent logs) when an agent or the control plane
        fails."""
        if self.job.res is None:
            self.job.run()
        return self

    @property
    def port_deltas(self) -> dict[tuple[str, str], dict[str, int]]:
        """What the kernel counted on every shaped port while the job ran: (node, ifname) -> the increases of drops,
        marks, sent_packets and sent_bytes from the agents being connected to the job's end
        (testbed.measure.portrecord)."""
        return dict(self.job.port_delta)

    @property
    def verified(self) -> bool:
        return bool(self.job.res is not None and self.job.res.verified)

    def summary(self) -> dict:
        """The job's summary.json numbers (testbed.workloads.collective.CollectiveJob.summary) with the knobs a
        report groups runs by (chunks, placement, compute_ms, stragglers, straggler_factor, gpus_per_host, and the
        scale-up rate with gpus_per_host > 1). Made once: the first call writes sweep.csv and prints the table."""
        if self._summary is None:
            s = self.settings
            out = {**self.job.summary(), **{k: getattr(s, k) for k in ("chunks", "placement", "compute_ms",
                                                                     "stragglers", "straggler_factor",
                                                                     "gpus_per_host")}}
            if s.gpus_per_host > 1:
                out["scaleup_rate_mbps"] = s.scaleup_rate_mbps
            self._summary = out
        return self._summary

    @property
    def cct_ms(self) -> list[float]:
        """Each measured headline op's completion time (first rank's start to last rank's end), from ops.csv."""
        if self._cct_ms is None:

            ops = load_csv(self.lab.rundir.path / "ops.csv", "ops")
            self._cct_ms = [float(c) * 1e3 for c in op_table(headline_ops(ops))["cct_s"]]
        return self._cct_ms

    def percentiles_ms(self):
        """analysis.metrics' nearest-rank p50/p95/p99/max of :attr:`cct_ms` (the summary's cct_ms_* numbers)."""

        return percentiles(self.cct_ms)
