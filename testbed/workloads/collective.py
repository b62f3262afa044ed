"""A collective job on a live lab: one agent process per rank inside its host's namespace, driven by the controller
(traffic.controller) over a Unix socket in the run directory, with the kernel's counters around it.

    job = CollectiveJob(lab, plan, transport="tcp", cc="cubic")   # plan: CollectiveSettings(...).plan(spec, seed)
    ... loss, a capture, PFC: whatever the experiment adds to the fabric ...
    job.run()                 # agents connect; then counters, queue sampler, background flows; go; results
    summary = job.summary()   # sweep.csv, the nccl-tests table on stdout, the collective's summary.json numbers

Scripts and scenarios reach it through ``lab.collective(...)`` (its settings: testbed.workloads.settings; its
handle: testbed.workloads.handles.Collective); this is the machinery under them.

Agents are forks of one interpreter that imported numpy and the agent code (traffic.forkserver: a fresh interpreter
per agent cost ~6 s of CPU each in the emulated lab VM); :class:`CollectiveJob` starts it at once, so its imports
overlap what the experiment does next. ``TESTBED_AGENT_SPAWN=exec`` starts each agent as its own interpreter
instead (nsenter + python -m traffic.agent).

Files: ``ops.csv`` (one row per rank and op, with ``iter_start_s`` and ``size_bytes``), ``tcp_info.csv`` (TCP_INFO
per connection at op boundaries), ``tcp.csv`` (the hosts' kernel counters before and after), ``rdma.csv`` (the rxe
counters before and after, RDMA only), ``uet.csv`` (each rank's transport counters at
the end, UET only: analysis.uet), ``queues.csv``/``cpu.csv`` (with a sampling interval), ``sweep.csv`` (one
nccl-tests row per op, from :meth:`CollectiveJob.summary`). The numbers of the summary are analysis.summary's, over
those files.
"""

from __future__ import annotations

import math
import os
import sys

from testbed.measure import liveview
from testbed.workloads.settings import JOB_PARAMS, job_plan
from traffic.jobplan import OPS_COLUMNS, JobPlan, op_groups, ops_rows, payload_efficiency, tcpinfo_deltas
from analysis import fidelity, metrics as am, summary as asum
from analysis.load import load_csv
from analysis.uet import uet_metrics
from testbed.errors import RunFailed
from testbed.network.serverlink import AgentError as RemoteError
from testbed.kernel import netns
from testbed.measure.rdmarecord import RdmaCounters
from testbed.measure.serversamples import sampled_port_delta
from testbed.measure.telemetry import QueueSampler
from traffic.background import BackgroundFlows
from traffic.controller import ControlError, Controller, Member
from traffic.forkserver import ForkServer
from traffic.job import format_nccl_table, iteration_plan
from traffic.rdma import RECOVERY_COUNTERS
from traffic.uet_options import loss_rule_for
from traffic.schedule import ScheduleError, alpha_beta_bound_s
from traffic.tcp import INFO_KEYS

# the knobs and their plan: settings.py
__all__ = ["JOB_PARAMS", "CollectiveJob", "RdmaCounters", "job_plan", "op_bound_s", "op_groups"]

SWEEP_COLUMNS = ["op", "collective", "message_bytes", "size", "count", "time_us", "algbw_gbps", "busbw_gbps",
                 "cct_us_p50", "cct_us_p99", "bound_us", "time_vs_bound", "n"]


def _stop_sampler(sampler, failing: bool) -> None:
    """Stop the job's queue sampler; while the job itself is failing, a sampler's own failure is one line on stderr
    rather than the error that hides the job's."""
    try:
        sampler.stop()
    except Exception as e:  # noqa: BLE001 - see above
        if not failing:
            raise RunFailed(f"collective: queue sampler: {e}") from None
        print(f"testbed: collective: queue sampler: {e}", file=sys.stderr)


def _uet_counters(result: dict) -> dict[str, int]:
    """A UET agent's transport counters from its result (traffic.agent: ``transport`` = UetTransport.describe())."""
    tr = result.get("transport")
    return {str(k): int(v) for k, v in (tr.get("counters") or {}).items()} if isinstance(tr, dict) else {}


def op_bound_s(plan, link, op: str, collective: str, efficiency: float) -> float:
    """The alpha-beta bound of ``op`` of ``plan`` (its ``collective``, as ops.csv names it) on hosts' ``link``
    (topologies' LinkSpec: rate, delay), beta per payload byte (``efficiency``: the shaper also carries every packet's
    headers); NaN for a custom schedule (no bound)."""
    keys = {o[0]: o[1] for seg in plan.job.segments for o in seg.ops}
    coll, n = collective, plan.ranks
    prm = dict(plan.schedules[keys[op]].params) if op in keys else {}
    if coll == "custom" and "group_size" in prm:  # grouped (a parallel dimension): one group's bound
        coll, n = str(prm["collective"]), int(prm["group_size"])
    try:
        return alpha_beta_bound_s(coll, n, plan.sizes[op], link.rate_mbps * 1e6 / 8 * efficiency,
                                  link.delay_ms * 1e-3 * 4)
    except ScheduleError:  # a custom schedule: no bound
        return math.nan


def agent_forks(lab) -> ForkServer:
    """The Lab's one fork server for its collective jobs' agents (traffic.forkserver), started on first use (or with
    the Lab, before its fabric is built, with ``Lab(agents=True)``, so its imports overlap the build) and ended with
    the Lab: in the emulated lab VM its imports take ~3 s, once per Lab instead of once per job (a burn-in runs three
    all-reduces)."""
    forks = getattr(lab, "agent_forks", None)
    if forks is None or forks.proc is None or forks.proc.poll() is not None:   # none yet, or it died: a new one
        lab.agent_forks = ForkServer(netns.NETNS_DIR, netns.popen).start()
        lab.on_teardown(lab.agent_forks.close)
        lab.state.add("pids", lab.agent_forks.pid)
    return lab.agent_forks


class CollectiveJob:
    """One collective job on ``lab`` (see the module docstring). ``transport``: ``tcp``, ``rdma`` (the lab must
    have rxe devices) or ``uet``; ``cc`` and ``dscp``: the agents' sockets (and the background flows' congestion
    control); ``rdma``: the RC options (mtu, timeout, retry_cnt, rnr_retry, min_rnr_timer); ``uet``: UET's
    (entropy_values); ``verify``: check every rank's result; ``timeout_s``: agent start-up, and then the job, must
    each end within it; ``sample_interval_ms``: a queue sampler from the moment the agents are connected (0: none)."""

    def __init__(self, lab, plan: JobPlan, transport: str = "tcp", cc: str = "cubic", dscp: int = 0,
                 rdma: dict | None = None, verify: bool = True, timeout_s: float = 600.0,
                 sample_interval_ms: float = 0.0, rundir=None, on_ready=None, uet: dict | None = None):

        self.lab, self.plan, self.transport, self.cc, self.dscp = lab, plan, transport, cc, dscp
        # several jobs on one lab (testbed jobs): each writes its files into its own run directory, and may wait
        # for its neighbours in ``on_ready`` (called once its agents are connected, before anything is counted)
        self.rundir = rundir if rundir is not None else lab.rundir
        self.on_ready = on_ready
        self.rdma_opts = dict(rdma or {})
        self.uet_opts = dict(uet or {})
        self.verify, self.timeout_s, self.sample_interval_ms = verify, timeout_s, sample_interval_ms
        # a lab over servers that are machines (testbed.workloads.serverlab): its agents start the ranks
        self.remote = getattr(lab, "server_run", None)
        self.forks = None if os.environ.get("TESTBED_AGENT_SPAWN") == "exec" or self.remote else agent_forks(lab)
        self.res = None
        self.bg_stats: list[dict] = []
        self.port_delta: dict = {}
        self.rdma_delta: dict[str, int] = {}
        self.queue_stats: dict = {}

    def _job_doc(self, fabric) -> dict:
        pl = self.plan
        transport = {"kind": self.transport, "cc": self.cc, "dscp": self.dscp}
        host_cc = self.lab.host_cc()
        own_cc = {str(r): host_cc[h] for r, h in enumerate(pl.placement.hosts) if h in host_cc}
        if own_cc:  # host-config faults: those hosts' ranks use their own congestion control
            transport["cc_by_rank"] = own_cc
        if self.transport == "rdma":
            devices = {str(r): fabric.rxe[h][0] for r, h in enumerate(pl.placement.hosts)}
            transport["rdma"] = {"devices": devices, **self.rdma_opts}
        if self.transport == "uet":  # the per-EV loss rule only where an EV keeps one path (traffic.uet_options)
            balancing = getattr(self.lab.net.spec, "load_balancing", "ecmp")
            transport["uet"] = {**self.uet_opts, "loss_rule": loss_rule_for("auto", balancing)}

        faults = getattr(self.lab, "faults", None)
        return {"ranks": pl.ranks, "seed": pl.seed, "verify": self.verify, "timeout_s": self.timeout_s,
                "transport": transport, "plan": iteration_plan(pl.job),
                "report_iterations": bool(faults is not None and faults.by_iteration) or liveview.enabled()}

    def run(self) -> "CollectiveJob":
        """Start the agents, run the job to its end, read the counters again and write the run's files.
        RunFailed (naming the agent logs) when an agent or the control plane fails."""

        lab, fabric, pl = self.lab, self.lab.net.fabric, self.plan
        rundir = self.rundir
        rundir.manifest["topology"] = fabric.describe()  # with what the experiment added (loss)
        rundir.manifest["placement"] = pl.placement.as_dict()
        if groups := op_groups(pl):
            rundir.manifest["op_groups"] = groups
        rundir.write_manifest()
        ctl = self._controller(fabric)
        lab.on_teardown(ctl.stop)
        bg = None
        if pl.job.background:
            bg = BackgroundFlows(pl.job.background, lab.endpoints(pl.hosts), netns.entered, cc=self.cc,
                                 cc_by_host=lab.host_cc())
            lab.on_teardown(bg.stop)
        sampler = None if not self.sample_interval_ms else self.remote.sampler(self.sample_interval_ms) \
            if self.remote is not None else QueueSampler(fabric, interval_s=self.sample_interval_ms / 1000.0)
        lab.progress(pl.describe())
        started, counters = [], {}

        def before_go() -> None:  # every agent connected and ready: counters, sampler and background from here
            if self.on_ready is not None:
                self.on_ready()
            if self.remote is None:  # a far server's counters are not read (docs/servers.md)
                counters["tcp"] = lab.tcp_counters(pl.hosts)
                counters["ports"] = lab.port_deltas()
            if self.transport == "rdma":
                counters["rdma"] = RdmaCounters(fabric, pl.hosts)
            for what in (sampler, bg):
                if what is not None:
                    what.start()
                    started.append(what)
            if bg:
                lab.progress(f"{len(pl.job.background)} background flow(s) running")
            lab.start_workload()  # t = 0 of the fault timeline

        try:
            ctl.start()
            self.res = ctl.run(setup_timeout_s=self.timeout_s, run_timeout_s=self.timeout_s, before_go=before_go)
        except (ControlError, RemoteError) as e:   # RemoteError: a server's agent failed a request (serverlab)
            raise RunFailed(f"collective: run failed: {e} (agent logs: {rundir.path}/agent-*.log)") from None
        finally:
            self.bg_stats = bg.stop() if bg in started else []
            if sampler in started:
                _stop_sampler(sampler, failing=sys.exc_info()[0] is not None)
        if self.remote is not None:  # the ranks' times on the reference clock, and clocks.csv
            self.res = self.remote.finish_job(self.res, rundir)
        else:
            counters["tcp"].stop(rundir)
            self.port_delta = counters["ports"].stop()
        self.rdma_delta = counters["rdma"].stop(rundir) if "rdma" in counters else {}
        ctl.stop()
        self._record_ranks(ctl)
        self._write(sampler)
        if self.remote is not None and sampler is not None:   # over servers: the ports' counters from the samples
            self.port_delta = sampled_port_delta(load_csv(rundir.path / "queues.csv", "queues")) or {}
        return self

    def _record_ranks(self, ctl) -> None:
        """What each rank's sockets report, into the manifest: TCP_CONGESTION after connect (a host-config fault's
        own cc shows here) and, for UET, the entropy values its transport sprays over."""
        ready = sorted((getattr(ctl, "ready", None) or {}).items())
        self.rundir.manifest["cc_by_rank"] = {str(r): ",".join(m.get("cc", [])) for r, m in ready}
        if self.transport == "uet":
            self.rundir.manifest["uet_entropy_values_by_rank"] = {str(r): m.get("entropy_values") for r, m in ready}
        self.rundir.write_manifest()

    def _controller(self, fabric):
        """The control plane of the job's agents (traffic.controller), reporting each iteration's start to the fault
        timeline (faults at an iteration) and the live view when either wants it."""

        lab, pl = self.lab, self.plan
        members = [Member(r, h, fabric.ns(h), fabric.host_ip(h)) for r, h in enumerate(pl.placement.hosts)]
        faults = getattr(lab, "faults", None)
        at_fault = faults.iteration if faults is not None and faults.by_iteration else None
        total = pl.job.warmup + pl.job.iterations

        def on_iteration(k: int) -> None:
            liveview.progress(f"iteration {k + 1} of {total}")
            if at_fault is not None:
                at_fault(k)

        kw = self.remote.controller_args(self, members) if self.remote is not None else {
            "spawn": self.forks.popen if self.forks else netns.popen}
        return Controller(self.rundir.path, self._job_doc(fabric), pl.schedules, members, kw.pop("spawn"),
                          progress=lab.progress, **kw,
                          on_iteration=on_iteration if at_fault is not None or liveview.enabled() else None)

    def _write(self, sampler) -> None:

        rundir, res = self.rundir, self.res
        rows = ops_rows(self.plan, res.ops, res.t_measure_by_rank)
        rundir.write_csv("ops.csv", OPS_COLUMNS, ([r[c] for c in OPS_COLUMNS] for r in rows))
        rundir.write_csv("tcp_info.csv", ["iteration", "op_index", "rank", "peer", "phase", *INFO_KEYS],
                         ([it, k, rk, peer, ph, *[info.get(x, 0) for x in INFO_KEYS]]
                          for it, k, rk, peer, ph, info in res.tcp_info))
        if self.transport == "uet":  # each rank's transport counters (traffic.uet.UetTransport.totals())
            hosts, per_host = self.plan.placement.hosts, {}
            for r, res_r in sorted(res.per_rank.items()):  # ranks on one host: their counters add up
                mine = per_host.setdefault(hosts[r], {})
                for k, v in _uet_counters(res_r).items():
                    mine[k] = mine.get(k, 0) + v
            self.lab.files.add_uet(rundir, per_host)  # appended beside any burst's rows, keyed by host
        if sampler is not None:
            sampler.write(rundir)
            self.queue_stats = sampler.stats()

    # ---- numbers ----

    def _sweep(self, run, efficiency: float) -> list[dict]:
        """analysis.summary.nccl_table's rows plus the alpha-beta bound of each op (beta per payload byte: the
        shaper also carries every packet's headers), written as sweep.csv and printed as nccl-tests does."""

        pl, link = self.plan, self.lab.net.spec.host_link
        nrows = asum.nccl_table(run.ops).to_dict("records")
        for r in nrows:
            r["message_bytes"] = pl.sizes[r["op"]]
            r["bound_us"] = op_bound_s(pl, link, r["op"], r["collective"], efficiency) * 1e6
            r["time_vs_bound"] = r["time_us"] / r["bound_us"] if r["bound_us"] > 0 else math.nan
        itemsize = pl.first.itemsize
        self.rundir.write_csv("sweep.csv", SWEEP_COLUMNS, (
            [r["op"], r["collective"], r["message_bytes"], int(r["size"]), int(r["size"]) // itemsize,
             round(r["time_us"], 3), r["algbw_gbps"], r["busbw_gbps"], round(r["cct_us_p50"], 3),
             round(r["cct_us_p99"], 3), round(r["bound_us"], 3), r["time_vs_bound"], r["n"]] for r in nrows))
        print(f"# collective {nrows[0]['collective']} ({pl.first.algorithm}): {pl.ranks} ranks, {self.cc}, hosts "
              f"{link.rate_mbps:g} Mbit/s, {pl.job.iterations} iterations", file=sys.stdout)
        print(format_nccl_table(nrows, pl.first.dtype, itemsize), file=sys.stdout, flush=True)
        return nrows

    def summary(self) -> dict:
        """summary.json's numbers of the job (see docs/collective.md): analysis.summary's collective metrics over
        ops.csv and tcp.csv, the alpha-beta bound, data verification (:meth:`_job_numbers`), port and rxe counter
        increases, background goodput, fidelity (:meth:`_network_numbers`)."""

        pl, spec = self.plan, self.lab.net.spec
        run = asum.load_quietly(self.rundir.path)
        efficiency = payload_efficiency(self.transport, spec.host_link.mtu, self.rdma_opts.get("mtu", 0))
        nrows = self._sweep(run, efficiency)
        bound_of = {r["op"]: r["bound_us"] / 1e6 for r in nrows}
        out = {**self._job_numbers(run, nrows, bound_of, efficiency), **self._network_numbers(run)}
        seg_ops = pl.job.segments[0].ops
        if any(len(o) > 2 for o in seg_ops):  # an imported trace: its step against the no-congestion prediction
            comp = pl.job.compute_ms + sum(o[2] for o in seg_ops if len(o) > 2)
            out["trace_compute_ms"] = comp
            out["step_bound_ms"] = comp + sum(bound_of[o[0]] for o in seg_ops) * 1e3
            out["step_vs_bound"] = (out["step_ms_p50"] / out["step_bound_ms"] if out.get("step_ms_p50")
                                    and out["step_bound_ms"] > 0 else None)
        out.update(asum.clock_metrics(run.clocks))  # ranks on servers that are machines: clocks.csv
        if self.transport == "rdma":
            out.update(self._rdma_summary())
        if self.transport == "uet":
            out.update(uet_metrics(load_csv(self.rundir.path / "uet.csv", "uet")))
        return out

    def _job_numbers(self, run, nrows: list[dict], bound_of: dict[str, float], efficiency: float) -> dict:
        """What the job is and how its ops went: the headline ops' CCTs and steps against the bound, verification."""

        pl, res = self.plan, self.res
        # the headline ops (analysis.summary.headline_ops): a sweep reports its largest size, buckets every op
        head = am.op_table(asum.headline_ops(run.ops))
        ratios = [c / bound_of[o] for o, c in zip(head["op"], head["cct_s"]) if bound_of[o] > 0]
        mism = [m for r in res.per_rank.values() for m in r.get("mismatches", [])]
        return {
            "collective": str(head["collective"].iloc[0]),
            "algorithm": pl.first.algorithm,
            "ranks": pl.ranks,
            "message_bytes": sum(pl.sizes[o] for o in dict.fromkeys(head["op"])),
            "sizes": ",".join(str(r["message_bytes"]) for r in nrows),
            "ops_per_iteration": len(pl.job.segments[0].ops),
            "iterations": pl.job.iterations,
            "warmup": pl.job.warmup,
            "hosts": ",".join(pl.placement.hosts),
            "cc": self.cc,
            # cct_ms_*, cct_samples, ops_n, step_ms_*, step_n, step_cv, comm_wait_fraction, nccl_size_bytes,
            # algbw_gbps, busbw_gbps: analysis.summary.collective_metrics over ops.csv
            **asum.collective_metrics(run.ops),
            "bound_ms": sum(bound_of[o] for o in head["op"]) / len(head) * 1e3,  # per op (buckets: their mean)
            "bound_payload_efficiency": efficiency,
            "cct_vs_bound": sum(ratios) / len(ratios) if ratios else None,
            # cct_vs_bound = arrival_skew_vs_bound (a rank joining late) + transfer_vs_bound (the network's share)
            **am.cct_split_vs_bound(asum.headline_ops(run.ops), bound_of),
            "data_verified": bool(res.verified),
            "mismatches": "; ".join(mism[:5]),
            "job_s": res.t_end - res.t_start,
            "agent_cpu_s_max": max((r.get("cpu_s") or 0.0 for r in res.per_rank.values()), default=0.0),
        }

    def _network_numbers(self, run) -> dict:
        """What the fabric and the hosts did meanwhile: retransmissions, the ports' drops and marks, background
        goodput, queue sampling, and whether this machine kept up (fidelity)."""

        spec, q = self.lab.net.spec, self.queue_stats
        ti = tcpinfo_deltas(self.res.tcp_info)
        tm = asum.tcp_metrics(run.tcp)

        def pdelta(key: str, switch: bool) -> dict[str, int]:
            return {f"{n}:{i}": v[key] for (n, i), v in self.port_delta.items()
                    if (spec.node(n).role != "host") == switch}

        switch_drops = pdelta("drops", True)
        # agents and switching lag? judged on the CPU while the ops ran, the whole run's figure without samples then
        busy_ops = (fidelity.busy_during(run.cpu, float(run.ops["start_s"].min()), float(run.ops["end_s"].max()))
                    if len(run.ops) else None)
        reasons = fidelity.reasons(fidelity.cpu_busy(q.get("cpu_busy_fraction")) if busy_ops is None
                                   else fidelity.cpu_busy(busy_ops, during="while the ops ran"))
        unread = self.remote is not None   # over servers the hosts' TCP counters are not read: None, not 0
        unread_ports = unread and not self.port_delta   # nor the ports' without samples
        return {
            "tcp_retrans_segs": None if unread else tm.get("tcp_retrans_segs", 0),
            "tcp_timeouts": None if unread else tm.get("tcp_timeouts", 0),
            # every class of every port, collective and background alike (drop-tail overflow, RED drops)
            "switch_drops": None if unread_ports else sum(switch_drops.values()),
            "switch_drops_by_port": "; ".join(f"{k}={v}" for k, v in switch_drops.items() if v),
            "host_nic_drops": None if unread_ports else sum(pdelta("drops", False).values()),
            "ecn_marks": None if unread_ports else sum(pdelta("marks", True).values()),
            "tcpinfo_total_retrans": ti["total_retrans"],
            "tcpinfo_rtt_ms_max": ti["rtt_us_max"] / 1e3,
            "tcpinfo_rto_ms_max": ti["rto_us_max"] / 1e3,
            "background_flows": len(self.bg_stats),
            "bg_goodput_mbps": sum(b["goodput_mbps"] for b in self.bg_stats),
            "queue_sample_interval_ms": (q["queue_sample_interval_s"] * 1e3
                                         if q and q["queue_sample_interval_s"] == q["queue_sample_interval_s"]
                                         else None),
            "cpu_busy_fraction": q.get("cpu_busy_fraction"),
            "cpu_busy_ops_fraction": busy_ops,
            "fidelity_ok": not reasons,
            "fidelity_reasons": "; ".join(reasons),
            "transport": self.transport,
        }

    def _rdma_summary(self) -> dict:

        d = self.rdma_delta
        out = {f"rdma_{k}": v for k, v in d.items()}
        # completer_retry_err: rxe's requester starting a go-back-N retransmission from the oldest unacknowledged
        # PSN (after a NAK-sequence-error or a local ACK timeout) -- retransmission rounds, not packets
        out["rdma_retransmit_events"] = d.get("completer_retry_err", 0)
        out["rdma_recovery_counters"] = sum(d.get(k, 0) for k in RECOVERY_COUNTERS)
        # the two causes apart: a PSN gap a responder saw (a packet lost or reordered on the way: NAK-sequence-error
        # and go-back-N) versus a requester's ACK timer firing with nothing lost (a stalled host: rxe replays the
        # unacknowledged packets, the responder counts them as duplicate_request)
        out["rdma_sequence_gaps"] = d.get("out_of_seq_request", 0)
        out["rdma_timeout_retries"] = max(0, d.get("completer_retry_err", 0) - d.get("rcvd_seq_err", 0))
        out["rdma_path_mtu"] = next((r.get("transport", {}).get("path_mtu") for r in self.res.per_rank.values()
                                     if isinstance(r.get("transport"), dict)), None)
        return out
