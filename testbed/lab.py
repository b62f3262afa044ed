"""The Lab API: an experiment is a short script.

    from testbed.lab import Lab
    from topologies.mininet_topo import LeafSpineTopo

    with Lab(LeafSpineTopo(spines=2, leaves=2, hosts_per_leaf=2), out="results/look", seed=1) as lab:
        lab.sample_queues(every_ms=1)
        print(lab.net["h1"].cmd("ping -c3", lab.net["h4"].IP()))
        flows = lab.flows([("h1", "h4")], duration_s=5)     # long-lived TCP flows, in the background
        burst = lab.burst(["h2", "h3"], "h4", 4000, rounds=10, at_s=2)  # synchronized rounds (blocks)
        print(flows.wait(), burst.percentiles_ms())          # per-flow goodput; round completion p50/p99
        job = lab.collective("allreduce", size="256K", ranks=4, iterations=5)   # real data, blocks until done
        print(job.percentiles_ms(), job.summary()["busbw_gbps"])               # CCT p50/p99; nccl-tests busbw
        lab.cli()                       # Mininet's CLI on the live fabric; the samplers keep running
    # leaving the block stops the samplers and flows, writes the run directory and tears everything down

A :class:`Lab` is one run: it checks the output folder and root before creating anything (one line, exit status 2
from the CLI), records what it creates in the run's state (so ``testbed clean`` finds a killed run's leftovers),
builds the network as a :class:`~testbed.network.net.TestbedNet` (``lab.net`` is the Mininet object: ``lab.net['h1']``,
``pingAll``, ``iperf``), writes ``manifest.json`` (resolved parameters, seed, topology, kernel, versions), and tears
down on success, failure, Ctrl-C and SIGTERM. The manifest says ``complete: true`` only when the block ended
normally.

Traffic writes the run directory's files as it ends: ``flows.csv`` (one row per long-lived flow: ``flow, src, dst,
src_port, dst_port, dscp, start_s, end_s, bytes, seconds, goodput_mbps``) and ``rounds.csv`` (the incast scenario's
``round, sender, start_s, end_s, bytes``, so ``testbed report`` shows the bursts' round times). Times are monotonic
seconds, the clock of every CSV. A collective job (:meth:`Lab.collective`) writes ops.csv, sweep.csv, tcp.csv and
tcp_info.csv (testbed.workloads.collective).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from analysis.faults import fault_summary
from analysis.load import load_csv
from analysis.summary import balancing_metrics, server_metrics
from testbed.errors import CapabilityMissing, UsageError, require_root
from testbed.faults import plan as faultplan
from testbed.faults.timeline import EVENT_COLUMNS, FaultTimeline
from testbed.kernel import doctor
from testbed.kernel.state import RunState
from testbed.measure.portrecord import PortCounters
from testbed.measure.tcprecord import TcpCounters
from testbed.measure.telemetry import QueueSampler, port_totals
from testbed.measure.verdict import judge_run
from testbed.network.cluster import SERVER_COLUMNS, place, server_rows
from testbed.network.net import TestbedCLI, TestbedNet
from testbed.params import SEED_HELP, SEED_MAX
from testbed.rundir import RunDir, check_out_dir, default_out
from testbed.workloads.collective import agent_forks
from testbed.workloads.dcqcn import DcqcnRun, DcqcnSettings, start_dcqcn
from testbed.workloads.handles import Burst, Collective, Flows, TrafficFiles, host_name, run_burst, start_flows
from testbed.workloads.program import Program
from testbed.workloads.serverlab import ServersRun, local_only, servers_value
from testbed.workloads.settings import CollectiveSettings, Form, settings_for
from testbed.workloads.trimming import TrimRun, start_trimming
from topologies.mininet_topo import spec_from_topo

#: the first TCP port lab traffic listens on; every flows()/burst() call takes the next free ones
FIRST_PORT = 5300


class Lab:
    """One experiment on one emulated fabric (see the module docstring).

    ``topo``: a Mininet ``Topo`` (``topologies.mininet_topo``'s or any user-written one); ``out``: the run directory
    (default ``results/<name>-<time>``); ``seed``: fixes the fabric's ECMP hash seed and every schedule drawn from
    :attr:`rng`; ``name``/``params``: what the manifest records as scenario and parameters; ``rxe``: a SoftRoCE device
    on every host; ``servers``: split the fabric over that many servers joined by tunnels (testbed.network.cluster),
    or over the machines a servers file names (its path: testbed.workloads.serverlab; ``params``'
    ``max_clock_uncertainty_ms`` overrides its clock rule); ``agents``: collective jobs will run (their agents' fork
    server starts before the build)."""

    def __init__(self, topo, out: str | Path | None = None, seed: int = 1, name: str = "lab",
                 params: dict[str, Any] | None = None, rxe: bool = False, quiet: bool = False,
                 servers: int | str | Path = 1, agents: bool = False):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
            raise UsageError(f"seed: {SEED_HELP} (got {seed!r})")
        self.seed = seed
        self.topo = topo
        self.name = name
        self.params = dict(params or {})
        self.rxe = rxe
        self.agents = agents  # collective jobs will run: their agents' fork server starts before the build
        self.agent_forks = None  # that fork server (testbed.workloads.collective.agent_forks)
        servers = servers_value(servers)
        self.servers = servers if isinstance(servers, int) else 1
        # the split, or the servers file and its placement, checked before anything exists
        self.server_run = (ServersRun(spec_from_topo(topo), servers, self.params.get("max_clock_uncertainty_ms", 0))
                           if isinstance(servers, Path) else None)
        if self.servers != 1:
            place(spec_from_topo(topo), servers)
        if rxe and self.server_run:
            raise UsageError("rxe: SoftRoCE is not built on a lab over servers yet (docs/servers.md)")
        self.quiet = quiet
        self.out = check_out_dir(out) if out is not None else default_out(name)
        if rxe:  # before anything exists: SoftRoCE across namespaces is a kernel capability (the lab VM has it)
            if doctor.missing(["rxe:netns"]):
                raise CapabilityMissing("rxe:netns", "rxe=True needs SoftRoCE across namespaces: run it in the lab "
                                        "VM (testbed vm -- ...)")
        self.net = None
        self.rundir = None
        self.state = None
        self.summary: dict[str, Any] = {}
        self._teardown: list[Callable[[], None]] = []
        self._old_sigterm = None
        self.t_up = 0.0  # monotonic time the network was up (the origin of burst(at_s=...))
        self._next_port = FIRST_PORT
        self.files = TrafficFiles()  # flows.csv and rounds.csv, appended by every flows() and burst()
        self.faults = None  # the FaultTimeline, once a fault was scheduled with at()

    # ---- progress ----

    def progress(self, msg: str) -> None:
        if not self.quiet:
            t0 = self.rundir.manifest["t0_monotonic"] if self.rundir else time.monotonic()
            print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    # ---- lifetime ----

    def __enter__(self) -> "Lab":
        require_root(f"a lab ({self.name})")
        self._install_sigterm()
        try:
            self.state = RunState()
            self.state.save()
            self.rundir = RunDir(self.out, self.name, self.params, self.seed)
            t_build = time.monotonic()
            if self.server_run is not None:  # each server's agent builds its share
                self.net = self.server_run.start(self.state.run_id, self.rundir, self.progress)
            else:
                if self.agents and os.environ.get("TESTBED_AGENT_SPAWN") != "exec":
                    agent_forks(self)
                self.net = TestbedNet(self.topo, state=self.state, rxe=self.rxe, progress=self.progress, build=False,
                                      servers=self.servers)
                self.net.build()
                self.net.start()
            self.rundir.manifest["fabric_build_s"] = round(time.monotonic() - t_build, 3)
            self.rundir.manifest["topology"] = self.net.fabric.describe()
            self.rundir.write_manifest()
            self.rundir.write_csv("ports.csv", ["node", "port", "peer", "tier", "rate_mbps"],
                                  ((p.node, p.ifname, p.peer, p.tier, p.rate_mbps) for p in self.net.fabric.port_plans))
            # registered before any workload's: runs after them, when every raw file is written
            self.on_teardown(self._judge_fidelity)
            if self.net.fabric.balancing is not None:
                self.on_teardown(self._record_balancing)
            if self.net.fabric.server_ns:
                self.on_teardown(self._record_servers)
        except BaseException:
            self._close()
            raise
        self.t_up = time.monotonic()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._close()
        finally:
            if exc_type is None and self.rundir is not None:
                self.rundir.finish(self.summary)

    def on_teardown(self, fn: Callable[[], None]) -> None:
        """Register an undo step; they run in reverse order before the network goes, whatever happens."""
        self._teardown.append(fn)

    def _close(self) -> None:
        self.progress("tearing down")
        for fn in reversed(self._teardown):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - keep undoing the rest
                print(f"testbed: teardown step failed: {e}", file=sys.stderr)
        self._teardown.clear()
        if self.net is not None:
            self.net.stop()
        if self.state is not None:
            self.state.drop()
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def _record_balancing(self) -> None:
        """The flowlet balancer's counters (flowlets started, packets moved), read from its maps before it goes."""
        path = self.rundir.write_csv("balancing.csv", ["node", "flowlets", "moved_packets", "packets"],
                                     self.net.fabric.balancing.stats())
        self.summary.update(balancing_metrics(load_csv(path, "balancing")))

    def _record_servers(self) -> None:
        """A fabric split over servers: what each server's tunnels carried (servers.csv, testbed.network.cluster)."""
        path = self.rundir.write_csv("servers.csv", SERVER_COLUMNS, server_rows(self.net.fabric))
        self.summary.update(server_metrics(load_csv(path, "servers")))

    def _judge_fidelity(self) -> None:
        """Did the machine keep up? testbed.measure.verdict.judge_run on the raw files, into the summary."""
        judge_run(self.rundir, self.summary)

    def _install_sigterm(self) -> None:
        main_pid = os.getpid()

        def on_sigterm(signum, frame):
            if os.getpid() != main_pid:  # a forked helper (pyroute2) inherited this handler: it just dies
                os._exit(128 + signum)
            raise KeyboardInterrupt

        self._old_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    # ---- the network ----

    @property
    def path(self) -> Path:
        return Path(self.out)

    @property
    def hosts(self) -> list:
        """The Mininet host objects, in topology order."""
        return list(self.net.hosts)

    def node(self, name: str):
        return self.net[name]

    def ports(self) -> list[tuple[str, str, str]]:
        """(node, namespace, ifname) of every shaped egress port."""
        return self.net.fabric.ports()

    # ---- measurement ----

    def sample_queues(self, every_ms: float = 1.0, ports: list[tuple[str, str]] | None = None):
        """Sample the backlog, drops and marks of ``ports`` ((node, ifname); default: every shaped port) every
        ``every_ms`` until the lab ends; ``queues.csv`` (and ``cpu.csv``) are written then, or at
        ``sampler.stop(lab.rundir)`` if the experiment reads them first. Returns the sampler."""
        sampler = QueueSampler(self.net.fabric, interval_s=every_ms / 1000.0, ports=ports).start()
        self.on_teardown(lambda: sampler.stop(self.rundir))
        return sampler

    def port_counters(self) -> dict[tuple[str, str], dict[str, int]]:
        """Sent/dropped/marked totals of every shaped port now (one netlink dump per namespace)."""
        return port_totals(self.ports())

    def port_deltas(self, ports: Iterable[tuple[str, str]] | None = None):
        """The counters of ``ports`` ((node, ifname); default: every shaped port) now; ``.stop()`` reads them again
        and returns what the traffic in between added. Returns the :class:`testbed.measure.portrecord.PortCounters`."""
        wanted = set(ports) if ports is not None else None
        return PortCounters(p for p in self.ports() if wanted is None or (p[0], p[2]) in wanted)

    # ---- traffic ----

    def tcp_counters(self, hosts: Iterable | None = None):
        """The hosts' (default: all) kernel TCP counters now; ``.stop()`` reads them again and writes tcp.csv (also
        done at teardown). Returns the :class:`testbed.measure.tcprecord.TcpCounters`."""
        names = [host_name(h) for h in (hosts if hosts is not None else self.net.hosts)]
        rec = TcpCounters({h: self.net.ns(h) for h in names})
        self.on_teardown(lambda: rec.stop(self.rundir))
        return rec

    def endpoints(self, hosts: Iterable) -> dict[str, tuple[str, str]]:
        """host name -> (namespace, IP), what the traffic generators in ``traffic/`` take."""
        return {h: (self.net.ns(h), self.net.fabric.host_ip(h)) for h in map(host_name, hosts)}

    def next_ports(self, n: int) -> int:
        """The first of ``n`` TCP ports no other traffic of this lab listens on."""
        port, self._next_port = self._next_port, self._next_port + n
        return port

    def flows(self, pairs: Sequence[tuple], duration_s: float | None = None, cc: str | None = None,
              src_ports: Sequence[int] | None = None, dscp: int = 0, ack_dscp: int | None = None,
              rate_mbps: float = 0.0) -> "Flows":
        """Start one long-lived bulk TCP flow per (src, dst) pair (names or host objects) and return at once with
        a :class:`Flows` handle. ``duration_s``: the flows stop by themselves then (else at ``stop()`` or when the
        lab ends); ``cc``: congestion control; ``src_ports``: each sender's source port (0: the kernel picks);
        ``dscp``/``ack_dscp``: the DSCP of the data and of the receivers' ACKs (default: the data's); ``rate_mbps``:
        pace each sender's socket (SO_MAX_PACING_RATE; 0: as fast as TCP goes).
        ``flows.csv`` gets their rows when they stop."""
        return start_flows(self, pairs, duration_s, cc, src_ports, dscp, ack_dscp, rate_mbps)

    def burst(self, senders: Sequence, receiver, size_bytes: int, rounds: int = 1, at_s: float | None = None,
              cc: str | None = None, transport: str = "tcp", uet: dict | None = None) -> "Burst":
        """Synchronized incast: in each of ``rounds`` rounds every sender writes ``size_bytes`` to ``receiver`` at
        the same instant (one persistent TCP connection each, opened first); a round ends when the receiver holds
        every block, and the next starts then. ``at_s``: the first round starts that many seconds after the
        network came up (else now). Blocks until the last round; appends to ``rounds.csv``. ``transport="uet"``:
        the blocks go over the UET transport (traffic.uet_incast; ``uet``: its options, e.g. rto_min_ms) instead
        of kernel TCP, and each host's transport counters are appended to ``uet.csv``."""
        return run_burst(self, senders, receiver, size_bytes, rounds, at_s, cc, transport, uet)

    def launch(self, cmd: str, hosts: Iterable | None = None, ranks: int | None = None, ranks_per_host: int = 1,
               launcher: str = "torch", **kw) -> "Program":
        """Start a real distributed program, one process per rank in its host's namespace, as torchrun
        (``launcher="torch"``) or Open MPI's mpirun (``"mpi"``) starts it; ``.wait()`` for its end. See
        :mod:`testbed.workloads.program` (timeout_s, start_timeout_s, env, warmup_steps, master_port, cwd)."""
        return Program(self, cmd, hosts, ranks, ranks_per_host, launcher, **kw).start()

    def collective(self, what: "str | CollectiveSettings | Form" = "allreduce", run: bool = True,
                   **fields: Any) -> "Collective":
        """A collective job with real data: one agent process per rank in its host's namespace, each iteration's
        collectives as per-rank DAGs over kernel TCP (or RDMA with ``rxe=True`` and ``transport="rdma"``), every
        result checked. ``what``: a collective's name with :class:`~testbed.workloads.settings.CollectiveSettings`'
        fields as keywords (``lab.collective("allreduce", size="1M", ranks=4, iterations=10)``), one of its forms
        (``Parallel(tp=2)``, ``Trace("x.et")``, ``Program("schedule.json")``) or whole settings (the keywords go on
        top). Needs a leaf-spine fabric; what it cannot take is a UsageError (one line). Blocks until the job ends
        and returns a :class:`~testbed.workloads.handles.Collective` (``summary()``, ``verified``, ``cct_ms``,
        ``percentiles_ms()``, ``port_deltas``); ``run=False`` returns it planned, its fork server started, for
        ``.run()`` after the script adds to the fabric. Files: ops.csv, tcp_info.csv, tcp.csv, queues.csv, sweep.csv
        (at ``summary()``; testbed.workloads.collective)."""
        job = Collective(self, settings_for(what, **fields))
        return job.run() if run else job

    def dcqcn(self, settings: DcqcnSettings | None = None, react: bool = True, **fields: Any) -> DcqcnRun:
        """DCQCN (RoCEv2's NIC congestion control, docs/dcqcn.md) on every host's rxe device (``rxe=True``): CNPs
        for CE-marked packets, per-QP rate cuts and recovery, fq pacing on the host NICs. ``fields``:
        :class:`~testbed.workloads.dcqcn.DcqcnSettings`' (``time_scale``, ``cnp_interval_ms``, ... ; 0 = scaled
        from the paper). The switch ports must mark ECN (RED with ecn, or step). Returns the running
        :class:`~testbed.workloads.dcqcn.DcqcnRun`; when the lab ends (or at its ``finish()``) dcqcn_rates.csv and
        dcqcn.csv are written, the dcqcn_* numbers go into the summary, the programs go and the hosts' queues come
        back. Start PFC (testbed.pfc.run.start_pfc, with ``pause_hosts=False``) first: this starts a thread.
        ``react=False``: marking only, the baseline of a comparison (ECN-capable packets, CNPs, no rate change)."""
        try:
            settings = dataclasses.replace(settings or DcqcnSettings(), **fields)
        except TypeError as e:
            raise UsageError(f"dcqcn: {e}") from None
        run = start_dcqcn(self.net.fabric, self.rundir, self.on_teardown, settings, self.progress, react=react)
        self.on_teardown(lambda: self.summary.update(run.finish()))
        return run

    def trim(self, threshold_bytes: int = 0) -> TrimRun:
        """Packet trimming (UEC's switch-side answer to a full queue, docs/uet.md) on every switch port: above
        ``threshold_bytes`` of its queue (0: half of each port's buffer) a port cuts a UET data packet to its
        headers, flagged, and the receiving UET transport NACKs it at once (``transport="uet"``). Returns the
        :class:`~testbed.workloads.trimming.TrimRun`; at the lab's end (or its ``finish()``) trim.csv is written,
        the uet_trim* numbers go into the summary and the programs are detached."""
        run = start_trimming(self.net.fabric, self.rundir, self.on_teardown, threshold_bytes, self.progress)
        self.on_teardown(lambda: self.summary.update(run.finish()))
        if self.faults is not None:  # started during a slow-port fault: its trim_rate rows
            self.faults.trimming_started()
        return run

    # ---- faults ----

    def at(self, at_s: float, fault) -> Any:
        """Schedule a fault ``at_s`` seconds after the workload starts: a :class:`testbed.faults.plan.Fault` or its
        text, e.g. ``lab.at(2.0, "link-down leaf1-spine1 for_s=0.5 detect_ms=300")`` or ``lab.at(1.0,
        "slow-port spine1:leaf2 fraction=0.25")`` (kinds and parameters: testbed.faults.plan). Checked against the
        topology at once (UsageError, one line). The workload starts with the first :meth:`flows`, :meth:`burst`
        or collective job, or when the script calls :meth:`start_workload`. Each change, and routing's reaction,
        is written to ``events.csv``; the fabric is put back as built when the lab ends."""
        if self.faults is None:
            self.faults = FaultTimeline(self.net.fabric, self.progress)
            self.on_teardown(self._close_faults)
        f = self.faults.add(fault, at_s=at_s)
        self.rundir.manifest.setdefault("faults", []).append(str(f))
        self.rundir.write_manifest()
        return f

    def at_iteration(self, iteration: int, fault, after_s: float = 0.0) -> Any:
        """Schedule a fault ``after_s`` seconds after a collective job begins its measured iteration ``iteration``
        (0 = the first), e.g. ``lab.at_iteration(3, "link-down leaf1-spine1 for_s=0.3")``: the job's rank 0
        reports each iteration's start as it begins it. Otherwise as :meth:`at`."""
        f = faultplan.parse(fault) if isinstance(fault, str) else fault
        return self.at(after_s, faultplan.make(f.kind, f.target, **{**dict(f.params), "at_iteration": iteration}))

    def host_cc(self) -> dict[str, str]:
        """Hosts given their own congestion control by a host-config fault (host -> name)."""
        if self.faults is None:
            return {}
        return {h.name: self.faults.hosts.cc_of(h.name) for h in self.net.fabric.topology.hosts
                if self.faults.hosts.cc_of(h.name)}

    def fault_events(self):
        """The fault timeline's events so far (a DataFrame with events.csv's columns: t_s on the monotonic clock,
        kind, target, detail), for a scenario's own checks before the lab ends; None without faults."""
        if self.faults is None:
            return None
        import pandas as pd

        return pd.DataFrame(list(self.faults.events), columns=EVENT_COLUMNS)

    def start_workload(self) -> None:
        """t = 0 of the fault timeline (the first call counts; traffic started by the Lab calls it)."""
        if self.faults is not None:
            self.faults.start()

    def _close_faults(self) -> None:
        """Stop the timeline, put the fabric back, write events.csv (with the frames the dead links swallowed as a
        last ``dead_link_frames`` event) and add analysis' fault numbers to the summary."""
        events = self.faults.close()
        lost = self.faults.lost_frames()
        if self.faults.t0 is not None and self.faults.links_touched():
            events.append((time.monotonic(), "dead_link_frames", "all", f"frames={lost}"))
        self.rundir.write_csv("events.csv", EVENT_COLUMNS, ((f"{t:.6f}", k, tg, d) for t, k, tg, d in events))
        self.summary.update(fault_summary(load_csv(self.rundir.path / "events.csv", "events"), time.monotonic()))
        self.progress(f"fault timeline: {len(events)} event(s), {lost} frame(s) lost in dead links")

    # ---- looking around ----

    def cli(self) -> None:
        """Mininet's CLI on the live fabric (``exit`` or Ctrl-D returns to the script; samplers keep running)."""

        TestbedCLI(self.net)


# on this machine's namespaces only: a lab over servers refuses them with one line (testbed.workloads.serverlab)
for _name in ("sample_queues", "port_counters", "port_deltas", "tcp_counters", "flows", "burst", "launch", "dcqcn",
              "trim", "at", "cli"):
    setattr(Lab, _name, local_only(getattr(Lab, _name)))
