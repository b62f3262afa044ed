"""A collective job over a fabric whose hosts sit on several servers (docs/servers.md, issue 29): every rank started
by the agent of the server its host is on, the control channel TCP over the servers' own network, and the ranks'
times put on the reference server's clock.

    with ServerFabric(topology, run_id, links) as fab:
        res = run_collective(fab, workdir, job, schedules, members, listen=("198.19.0.1", 0))
        res.verified, res.ops, res.clock_uncertainty_s       # ops on the reference clock, with their bound

What it stands for: a cluster launcher (mpirun over ssh, Slurm's srun) starting one process per rank on each node
through that node's daemon and wiring it back to the launcher, here the Controller of traffic.controller: it
listens on TCP on the reference server's address (not an AF_UNIX socket, which does not cross kernels), each
server's agent connects to it from its own namespace (the server's NIC) and starts the rank's ``traffic.agent`` in
the host's namespace with that connection inherited and the job's files shipped in the request
(testbed.commands.serverprocs). The common start instant goes to each rank on its own clock, and what the ranks
measured (each machine's CLOCK_MONOTONIC) comes back moved onto the reference's by the clock passes taken before
and after the job (analysis.clockoffset.ClockModel), each rank keeping its model's bound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import time
from pathlib import Path
from typing import Callable

from analysis.clockoffset import ClockModel, Offset
from testbed.network.serverlink import AgentError, AgentLink, AgentTimeout
from traffic.controller import Controller, Member, Results, job_files

#: a far rank's status is asked of its agent at most this often (a request each; the controller looks every 0.2 s)
POLL_EVERY_S = 0.5
#: how long one status request may take: a timeout is asked again at the next poll, so a hung (not gone) agent holds
#: the controller's loop this long per far rank and poll, not the 30 s a share's build may take
POLL_TIMEOUT_S = 5.0
#: the status reported for a rank whose server's agent cannot be reached (the agent kills it as it ends)
AGENT_GONE = 255


def poll_outcome(e: AgentError) -> int | None:
    """What a failed ``proc_poll`` says of the rank: None (not known yet: ask again at the next poll) when the call
    timed out, since a slow agent (its machine loaded, a long request before this one) is not a gone one and the
    controller's own deadline bounds the asking; :data:`AGENT_GONE` when its link closed or its process ended (it
    kills its ranks as it ends) and when it refused (it does not know the pid: asking again cannot change that)."""
    return None if isinstance(e, AgentTimeout) else AGENT_GONE


class RemoteProcess:
    """A process a server's agent started (its ``spawn``), standing in for the Popen the Controller's spawn
    returns: ``poll``, ``wait``, ``kill`` and ``returncode``, each a request to that agent. Once it has ended, its
    log (which the agent returns) is written to the file the controller gave as its stdout."""

    def __init__(self, link: AgentLink, pid: int, log=None):
        self.link, self.pid = link, pid
        self.returncode: int | None = None
        self.last_error: str | None = None     # the last proc_poll that failed (a timeout is asked again)
        self._log_fd = os.dup(log.fileno()) if log is not None else None
        self._asked = 0.0

    def poll(self) -> int | None:
        if self.returncode is not None or time.monotonic() - self._asked < POLL_EVERY_S:
            return self.returncode
        self._asked = time.monotonic()
        try:
            r = self.link.call("proc_poll", timeout_s=POLL_TIMEOUT_S, pid=self.pid)
        except AgentError as e:
            r = {"rc": poll_outcome(e), "log": f"{e}\n"}
            self.last_error = str(e)
        if r["rc"] is not None:
            self._ended(int(r["rc"]), r.get("log", ""))
        return self.returncode

    def _ended(self, rc: int, log: str) -> None:
        self.returncode = rc
        if self._log_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._log_fd, log.encode())
            os.close(self._log_fd)
            self._log_fd = None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"process {self.pid} on {self.link.server.name}", timeout)
            time.sleep(0.1)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(AgentError):
                self.link.call("proc_kill", timeout_s=30, pid=self.pid, sig=int(sig))
            self._asked = 0.0        # the next poll asks at once

    def kill(self) -> None:
        self.send_signal(9)

    def terminate(self) -> None:
        self.send_signal(15)


class ServerSpawner:
    """The Controller's ``spawn`` over a ServerFabric: the rank's process is started by the agent of the server
    holding its namespace, with the job's files (traffic.controller.job_files) and, for ``--control tcp:ADDR:PORT``,
    a connection the agent opens to the controller from its own namespace."""

    def __init__(self, fab):
        self.fab = fab
        self.server_of_ns = {fab.ns(node): server for node, server in fab.placement.server_of.items()}
        self.spawn_s: dict[int, float] = {}    # per rank: the spawn request's wall time (files, connect, start)

    def __call__(self, namespace: str, argv: list[str], cwd: str | None = None, stdout=None, **_popen) -> RemoteProcess:
        link = self.fab.links[self.server_of_ns[namespace]]
        spec = argv[argv.index("--control") + 1]
        if not spec.startswith("tcp:"):
            raise ValueError(f"ranks on servers need the controller on TCP (listen=...), not {spec!r}")
        address, _, port = spec[4:].rpartition(":")
        rank = int(argv[argv.index("--rank") + 1])
        t0 = time.monotonic()
        files = job_files(Path(cwd or "."), argv[argv.index("--job") + 1], rank)
        r = link.call("spawn", timeout_s=60, ns=namespace, argv=argv, files=files, control=[address, int(port)])
        self.spawn_s[rank] = time.monotonic() - t0
        return RemoteProcess(link, int(r["pid"]), stdout)


def _offset(d: dict) -> Offset:
    return Offset(**{f.name: d[f.name] for f in dataclasses.fields(Offset)})


def clock_models(start: dict[str, dict], end: dict[str, dict]) -> dict[str, ClockModel | None]:
    """Per server, the straight line through its two clock passes (ServerFabric.clock's replies); None for the
    reference."""
    return {name: None if d.get("reference") else ClockModel(_offset(d), _offset(end[name]))
            for name, d in start.items()}


def on_reference(res: Results, models: dict[int, ClockModel | None]) -> Results:
    """``res`` with each rank's op start/end and t_measure moved onto the reference clock by its model (None: the
    reference's own ranks), and each rank's ``clock``: the offset at the run's start, the model's bound and drift.
    ``res`` itself is not changed."""
    per_rank = {}
    for r, v in res.per_rank.items():
        m, v = models.get(r), dict(v)
        if m is None:
            v["clock"] = {"offset_s": 0.0, "uncertainty_s": 0.0, "reference": True}
        else:
            ref = m.to_reference
            v["ops"] = [[*row[:5], round(ref(row[5]), 6), round(ref(row[6]), 6), *row[7:]] for row in v["ops"]]
            if "t_measure" in v:
                v["t_measure"] = ref(float(v["t_measure"]))
            v["clock"] = {"offset_s": m.offset_at(res.t_start), "uncertainty_s": m.uncertainty_s,
                          "drift_ppm": m.drift_ppm, "drift_bound_ppm": m.drift_bound_ppm}
        per_rank[r] = v
    return Results(res.t_start, res.t_ready, res.t_end, per_rank, res.t_spawned)


class ServerLaunch:
    """What a Controller needs to run a job over ``fab``'s servers, and what is done with its results: the clock
    pass before the job (:meth:`controller_args`: the per-rank start offsets, the spawner, the TCP listener on
    ``listen``, inside ``listen_in``), the pass after it and the results on the reference clock (:meth:`finish`).
    :func:`run_collective` and the Lab's collective job (testbed.workloads.collective) both drive it."""

    def __init__(self, fab, listen: tuple[str, int], listen_in: Callable | None = None, exchanges: int = 100):
        self.fab, self.listen, self.listen_in, self.exchanges = fab, tuple(listen), listen_in, exchanges
        self.start: dict[str, dict] = {}
        self.models: dict = {}     # server -> its clock model over the job, once finish() took the pass after it
        self.server_of: dict[int, str] = {}
        self.spawner = ServerSpawner(fab)

    def controller_args(self, members: list[Member], clock_start: dict | None = None) -> dict:
        """Controller keywords (spawn, listen, listen_in, clock_offsets_s), after a clock pass (``clock_start``:
        one taken already; kept in :attr:`start`)."""
        self.start = clock_start or self.fab.clock(self.exchanges)
        self.server_of = {m.rank: self.fab.server_of(m.host) for m in members}
        offsets = {r: float(self.start[s]["offset_s"]) for r, s in self.server_of.items()}
        return {"spawn": self.spawner, "listen": self.listen, "listen_in": self.listen_in, "clock_offsets_s": offsets}

    def finish(self, res: Results) -> Results:
        """A clock pass after the job, and ``res`` on the reference clock (:func:`on_reference`), each rank with its
        spawn request's time (``spawn_s``)."""
        self.models = models = clock_models(self.start, self.fab.clock(self.exchanges))
        out = on_reference(res, {r: models[s] for r, s in self.server_of.items()})
        for r, v in out.per_rank.items():
            v["spawn_s"] = self.spawner.spawn_s.get(r)
        return out


def run_collective(fab, workdir: Path, job: dict, schedules: dict, members: list[Member], listen: tuple[str, int],
                   listen_in: Callable | None = None, clock_start: dict | None = None, exchanges: int = 100,
                   timeout_s: float = 120.0) -> Results:
    """The job over ``fab``'s servers: the Controller listening on TCP ``listen`` (the reference server's address,
    inside ``listen_in`` when that address is in another namespace than this process's), every rank spawned by its
    server's agent (:class:`ServerSpawner`), the start instant sent on each rank's clock (``clock_start``: a clock
    pass of ``fab``, default a fresh one); after the job a second pass, and the results on the reference clock
    (:func:`on_reference`), each rank with its spawn request's time (``spawn_s``): :class:`ServerLaunch`.
    ControlError when the job fails (the ranks' logs are agent-<rank>.log in ``workdir``)."""
    launch = ServerLaunch(fab, listen, listen_in, exchanges)
    kw = launch.controller_args(members, clock_start)
    ctl = Controller(workdir, job, schedules, members, kw.pop("spawn"), start_delay_s=0.5, **kw)
    try:
        ctl.start()
        res = ctl.run(setup_timeout_s=timeout_s, run_timeout_s=timeout_s)
    finally:
        ctl.stop()
    return launch.finish(res)


def ring_job(ranks: int, message_bytes: int, iterations: int, timeout_s: float = 90.0) -> tuple[dict, dict]:
    """The job document of a ring all-reduce over ``ranks`` ranks (one op of ``message_bytes`` per iteration, no
    compute, data verified, TCP CUBIC) and its schedules, as Controller (and :func:`run_collective`) takes them:
    the smallest whole job a fabric over servers runs, for its tests and the split benchmark."""
    from traffic import job as jobm
    from traffic.collectives import make_schedule

    spec = jobm.JobSpec(ranks=ranks, segments=(jobm.Segment((("allreduce", "op"),), iterations),), seed=5)
    job = {"ranks": ranks, "seed": 5, "verify": True, "timeout_s": timeout_s,
           "transport": {"kind": "tcp", "cc": "cubic", "dscp": 0}, "plan": jobm.iteration_plan(spec)}
    return job, {"op": make_schedule("allreduce", ranks, message_bytes, seed=3)}
