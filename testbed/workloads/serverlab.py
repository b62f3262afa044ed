"""A Lab over servers that are machines: ``Lab(topo, servers="servers.txt")`` and `testbed run SCENARIO --set
servers=FILE` (docs/servers.md, issue 29).

    with Lab(topo, servers="servers.txt", out="results/x") as lab:     # file, placement, NIC MTUs checked first
        job = lab.collective("allreduce", size="256K", ranks=2)
    # ops.csv on the reference clock, clocks.csv (each rank's offset and bound), servers.json (the clock passes)

What it stands for: Mininet's cluster edition and MaxiNet run one experiment over several machines from one
frontend; here the lab process is on the servers file's first server (the reference), each server's agent
(testbed.network.serverlink, over ssh; the local one a subprocess) builds its share of the fabric
(testbed.network.serverfabric), and a collective job's ranks are started by the agent of the server their host is
on, the controller listening on TCP on the reference's address (testbed.workloads.serverjobs). Every rank stamps
its ops with its machine's clock; they come back moved onto the reference's by clock passes before and after the
job, each rank with its bound (clocks.csv).

**The clock rule** (:func:`clock_need_s`): a job's op completion time is its first rank's start to its last rank's
end, two clocks on two servers, so an offset error ``u`` moves it by up to ``2u``. A run is refused (RunFailed, one
line, before its ranks start) when a server's bound exceeds :data:`CLOCK_FRACTION` (5%) of the job's smallest
op's alpha-beta bound, i.e. when the clocks alone could move the fastest possible op by more than 10%;
``max_clock_uncertainty_ms`` (> 0) replaces the rule by a fixed bound.

Queue sampling (``sample_interval_ms``) runs on every server, each on its own share, its rows brought back on the
reference clock (testbed.measure.serversamples). What a servers run cannot do yet (refused with one line,
:func:`refusals`): RDMA and UET, faults, background flows, programs, PFC, DCQCN, trimming, loss, captures,
scale-up domains, spraying and flowlet balancing, and everything the Lab does with Mininet's node objects.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from testbed.errors import RunFailed, UsageError
from testbed.network import serversfile, share as shares
from testbed.network.fabric import Fabric
from testbed.network.serverfabric import ServerFabric
from testbed.network.serverlink import AgentError, AgentLink
from testbed.workloads.serverjobs import ServerLaunch

#: a server's clock bound may be at most this fraction of the job's smallest op's alpha-beta bound
CLOCK_FRACTION = 0.05
#: the need when no op has a bound (custom schedules): the servers check's default limit
NO_BOUND_NEED_S = 1e-3
#: clocks.csv: per rank, its server's clock against the reference's over the job (analysis.summary)
CLOCK_COLUMNS = ["rank", "host", "server", "offset_s", "uncertainty_s", "drift_ppm", "drift_bound_ppm"]
#: the controller's TCP port on the reference's address (0: any free one)
CONTROL_PORT = 0
#: a job starting within this long of the lab's clock pass uses that pass for its start (else it takes its own)
CLOCK_PASS_FRESH_S = 60.0

#: (parameter, its value a servers run needs, what it is): what a servers run refuses otherwise
_NEEDS = (("transport", "tcp", "RDMA and UET transports"), ("background", "", "background flows"),
          ("gpus_per_host", 1, "scale-up domains"), ("pfc", "off", "PFC"), ("dcqcn", "off", "DCQCN"),
          ("trim", ("auto", "off"), "packet trimming"), ("loss_percent", 0, "loss"), ("capture", "", "captures"),
          ("load_balancing", "ecmp", "spraying and flowlet balancing"), ("cmd", "", "programs"))


def servers_value(value: Any) -> int | Path:
    """``--set servers=`` / ``Lab(servers=)``: an integer (or its digits) is the in-kernel split into that many
    servers (testbed.network.cluster); any other text names a servers file (testbed.network.serversfile)."""
    if isinstance(value, bool) or value is None:
        raise UsageError(f"servers: a number of servers or a servers file (got {value!r})")
    if isinstance(value, int):
        return value
    if isinstance(value, Path):   # a path is a file, whatever its name
        return value
    text = str(value).strip()
    if not text:
        raise UsageError("servers: a number of servers or a servers file (got an empty value)")
    return int(text) if text.isdigit() else Path(text)


def _differs(value: Any, ok: Any) -> bool:
    if isinstance(ok, tuple):
        return value not in ok
    return bool(value) if ok in ("", 0) else value != ok


def refusals(params: Mapping[str, Any], faults: Iterable = ()) -> list[str]:
    """What of ``params`` (a scenario's or a job's, by name) and ``faults`` a servers run cannot do yet, one
    phrase each (empty: it can run)."""
    out = [f"{name}={params[name]} ({what})" for name, ok, what in _NEEDS
           if name in params and _differs(params[name], ok)]
    if list(faults):
        out.append("--fault (faults)")
    return out


def check(params: Mapping[str, Any], faults: Iterable = ()) -> None:
    """UsageError (one line) naming what a servers run cannot do yet, before anything is created."""
    bad = refusals(params, faults)
    if bad:
        raise UsageError(f"servers=FILE: not built over servers yet: {'; '.join(bad)} (docs/servers.md)")


def clock_need_s(op_bounds_s: Iterable[float], override_ms: float = 0.0) -> tuple[float, str]:
    """The largest clock bound a job's analysis accepts, and why: ``override_ms`` when > 0, else
    :data:`CLOCK_FRACTION` of the smallest finite positive op bound (seconds), else :data:`NO_BOUND_NEED_S`."""
    if override_ms > 0:
        return override_ms / 1e3, f"max_clock_uncertainty_ms={override_ms:g}"
    bounds = [b for b in op_bounds_s if b > 0 and math.isfinite(b)]
    if not bounds:
        return NO_BOUND_NEED_S, "no op has an alpha-beta bound: the servers check's 1 ms"
    return CLOCK_FRACTION * min(bounds), (f"{CLOCK_FRACTION:.0%} of the smallest op's alpha-beta bound, "
                                          f"{min(bounds) * 1e3:.3g} ms")


def clock_problem(clock: Mapping[str, Mapping], need_s: float, why: str) -> str | None:
    """One line when a server's bound in ``clock`` (a clock pass: server -> offset, uncertainty_s) exceeds
    ``need_s``; None when every server's is within it."""
    worst = max(clock.items(), key=lambda kv: float(kv[1].get("uncertainty_s", 0.0)))
    got = float(worst[1].get("uncertainty_s", 0.0))
    if got <= need_s:
        return None
    return (f"server {worst[0]}'s clock is known to +-{got * 1e3:.3g} ms, coarser than this run's analysis needs "
            f"(+-{need_s * 1e3:.3g} ms: {why}); set max_clock_uncertainty_ms to accept it")


def local_only(method):
    """A Lab method that works on this machine's namespaces only: on a lab over servers it is refused (one line)."""
    @functools.wraps(method)
    def wrapper(lab, *args, **kw):
        if getattr(lab, "server_run", None) is not None:
            raise UsageError(f"lab.{method.__name__}: not built on a lab over servers yet (docs/servers.md)")
        return method(lab, *args, **kw)
    return wrapper


class ServersNet:
    """What a lab over servers has where a one-machine lab has its Mininet net: ``spec``, ``fabric`` (the fabric as
    planned, built nowhere here: names, addresses, ports), ``servers`` (the ServerFabric) and ``stop()``."""

    def __init__(self, spec, run_id: str, servers: ServerFabric, stop):
        self.spec, self.servers, self.stop = spec, servers, stop
        self.fabric = Fabric(spec, run_id)

    def ns(self, node: str) -> str:
        return self.servers.ns(node)

    @property
    def hosts(self):
        raise UsageError("lab.hosts: Mininet's node objects are not built on a lab over servers (docs/servers.md)")

    def __getitem__(self, name: str):
        raise UsageError(f"lab.net[{name!r}]: Mininet's node objects are not built on a lab over servers "
                         f"(docs/servers.md)")


class ServersRun:
    """A lab's servers file (``path``) for ``spec``: loaded and its placement checked (addresses, NIC MTUs against
    the crossing links) when made, before anything exists; :meth:`start` starts one agent per server and builds
    every share; :meth:`stop` records servers.json and tears every share down."""

    def __init__(self, spec, path: str | Path, max_clock_uncertainty_ms: float = 0.0):
        self.spec, self.path = spec, Path(path)
        self.servers = serversfile.load(self.path)
        if getattr(spec, "load_balancing", "ecmp") != "ecmp":
            check({"load_balancing": spec.load_balancing})
        self.placement = shares.plan(spec, [(s.name, s.address, s.mtu) for s in self.servers])
        self.max_clock_uncertainty_ms = max_clock_uncertainty_ms
        self.fab: ServerFabric | None = None
        self.links: list[AgentLink] = []
        self.rundir = None
        self.launch: ServerLaunch | None = None
        self.host_of: dict[int, str] = {}
        self.clock_at = -math.inf   # when the last clock pass of start() was taken

    def start(self, run_id: str, rundir, progress) -> ServersNet:
        """One agent per server, every share built (the NICs checked first: UsageError), a clock pass, and
        servers.json in ``rundir``; on any failure everything started is stopped. AgentError becomes RunFailed."""
        self.rundir = rundir
        try:
            for s in self.servers:
                progress(f"server {s.name}: starting its agent ({s.target})")
                self.links.append(AgentLink.start(s))
            self.fab = ServerFabric(self.spec, run_id, self.links)
            self.fab.build()
            progress("shares built on " + ", ".join(f"{n} ({self.fab.built[n].get('kernel')})" for n in self.fab.links))
            clock = self.fab.clock()
            self.clock_at = time.monotonic()
            progress("clock: " + ", ".join(f"{n} +-{c['uncertainty_s'] * 1e6:.0f} us" for n, c in clock.items()))
            self.fab.record(rundir.path / "servers.json")
            rundir.manifest["servers"] = {"file": str(self.path), **self.fab.describe()}
        except BaseException as e:
            self.stop()
            if isinstance(e, AgentError):
                raise RunFailed(f"servers: {e}") from None
            raise
        return ServersNet(self.spec, run_id, self.fab, self.stop)

    def stop(self) -> None:
        """servers.json again (every clock pass, the tunnels' counters), every share torn down, the agents ended."""
        if self.fab is not None:
            with contextlib.suppress(AgentError, OSError):
                if self.fab.built:
                    self.fab.record(self.rundir.path / "servers.json")
            self.fab.teardown()
            self.fab = None
        for lk in self.links:
            lk.close()
        self.links = []

    # ---- a collective job's ranks (testbed.workloads.collective.CollectiveJob) ----

    def controller_args(self, job, members) -> dict:
        try:
            return self._controller_args(job, members)
        except AgentError as e:   # a server's agent failed the clock pass: one line
            raise RunFailed(f"servers: {e}") from None

    def _controller_args(self, job, members) -> dict:
        """The Controller's keywords for ``job``'s ranks on the servers, after a clock pass that must meet the job's
        need (:func:`clock_need_s`; RunFailed before any rank starts)."""
        from testbed.workloads.collective import op_bound_s
        from traffic.jobplan import payload_efficiency

        pl, link = job.plan, self.spec.host_link
        eff = payload_efficiency(job.transport, link.mtu, 0)
        ops = {o[0]: pl.schedules[o[1]].collective for seg in pl.job.segments for o in seg.ops}
        need_s, why = clock_need_s((op_bound_s(pl, link, op, c, eff) for op, c in ops.items()),
                                   self.max_clock_uncertainty_ms)
        if self.launch is not None and self.launch.models == {}:
            raise RunFailed("servers: one collective job at a time on a lab over servers (the last one has not "
                            "finished)")
        address = self.servers[0].address
        self.launch = ServerLaunch(self.fab, (address, CONTROL_PORT))
        fresh = time.monotonic() - self.clock_at < CLOCK_PASS_FRESH_S
        kw = self.launch.controller_args(members, self.fab.clocks[-1] if fresh else None)
        self.clock_at = -math.inf  # a second job takes a pass of its own
        self.host_of = {m.rank: m.host for m in members}
        job.rundir.manifest["clock_need_s"] = need_s
        if problem := clock_problem(self.launch.start, need_s, why):
            raise RunFailed(f"servers: {problem}")
        return kw

    def sampler(self, every_ms: float):
        """A collective job's queue sampler over the servers (each samples its share; the rows go on the reference
        clock with the job's clock models when written)."""
        from testbed.measure.serversamples import ServersSampler

        return ServersSampler(self.fab, every_ms, lambda: self.launch.models)

    def finish_job(self, res, rundir):
        """``res`` on the reference clock (a clock pass after the job) and clocks.csv: per rank its server's offset
        at the job's start, the bound and the drift of its clock model (0 for the reference's ranks)."""
        try:
            out = self.launch.finish(res)
        except AgentError as e:   # the clock pass after the job: without it the far ranks' times cannot be placed
            raise RunFailed(f"servers: the clock pass after the job failed, its results cannot be put on one clock: "
                            f"{e}") from None
        # the controller's go and its receipt of the last result, on the reference clock: every op lies between
        rundir.manifest["control_window_s"] = [res.t_ready, res.t_end]
        need_s = rundir.manifest.get("clock_need_s")
        if need_s is not None and out.clock_uncertainty_s > need_s:   # the pass after the job was the coarser one
            rundir.manifest["clock_need_met"] = False
            print(f"testbed: servers: the clocks are known to +-{out.clock_uncertainty_s * 1e3:.3g} ms after the "
                  f"job, coarser than its analysis needs (+-{need_s * 1e3:.3g} ms): its cross-server times are "
                  f"that uncertain", file=sys.stderr)
        rows = []
        for r, v in sorted(out.per_rank.items()):
            c = v["clock"]
            rows.append([r, self.host_of[r], self.launch.server_of[r], c.get("offset_s", 0.0),
                         c.get("uncertainty_s", 0.0), c.get("drift_ppm", 0.0), c.get("drift_bound_ppm", 0.0)])
        rundir.write_csv("clocks.csv", CLOCK_COLUMNS, rows)
        return out
