"""A real distributed program on the emulated fabric: one OS process per rank inside its host's namespace, started
the way ``torchrun`` or ``mpirun`` starts it on a cluster, its output and events kept in the run directory.

    prog = lab.launch("python3 train.py", hosts=["h1", "h2", "h3", "h4"], ranks_per_host=1)   # torchrun-style
    prog = lab.launch("python3 allreduce.py", hosts=hosts, launcher="mpi")                     # mpirun
    result = prog.wait()          # RunFailed, one line naming the rank, when one fails or the timeout passes

``launcher="torch"``: the testbed is torchrun. Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR (rank 0's host address on the fabric), MASTER_PORT, GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME (its host's fabric interface), OMP_NUM_THREADS=1 (as torchrun sets with several ranks per node).
``launcher="mpi"``: a real Open MPI ``mpirun`` in the first host's namespace with a hostfile of the hosts' fabric
addresses (testbed.workloads.mpirun); it starts its daemons on the other hosts through an rsh agent
(``program/rsh``: what ssh is on a cluster, here ``nsenter`` into the host that owns the address), and its TCP
transport and out-of-band channel are held to the fabric's addresses. A launch that starts no rank within
``start_timeout_s`` ends the run with one line saying which hosts' daemons came up. Both add TESTBED_EVENTS
(traffic.progevents: the program's steps and ops), TESTBED_RUN_DIR and the project root on PYTHONPATH (so ``from
traffic.progevents import Events`` imports).

Every process of the program runs under its host's own hostname (testbed.kernel.uts: ``hostname`` on h2 says h2),
and a ``python``/``python3`` command or a ``.py`` file runs under the interpreter testbed runs on, as torchrun starts
its ranks (testbed.workloads.interpreter): the ranks see the packages testbed sees, whatever ``python3`` PATH finds.

Files: ``program/rank-<r>.stdout|stderr`` (torch; under mpirun ``program/mpirun.stdout|stderr`` and mpirun's own
per-rank ``program/mpi/1/rank.<r>/stdout|stderr``), ``program/events/rank-<r>.jsonl``, ``program.csv`` (rank,
host, local_rank, exit_status, end_s), ``ops.csv`` from the events (traffic.progevents.ops_rows).
Every process of the program carries TESTBED_PROGRAM=<token> in its environment: :meth:`Program.stop` ends them all
(mpirun's daemons and their ranks included) by that mark, on success, failure, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import RunFailed, UsageError
from testbed.kernel import uts
from testbed.workloads import mpirun
from testbed.workloads.interpreter import rank_command
from testbed.kernel import netns
from traffic import progevents
from traffic.jobplan import OPS_COLUMNS
from traffic.progevents import parse

LAUNCHERS = ("torch", "mpi")
ROOT = Path(__file__).resolve().parents[2]
PROGRAM_COLUMNS = ["rank", "host", "local_rank", "exit_status", "end_s"]


@dataclass
class ProgramResult:
    """How the program ended: per rank its exit status (None: killed at the timeout) and when it ended."""
    exit_status: dict[int, int | None]
    end_s: dict[int, float]
    t_start: float
    t_end: float
    events_malformed: int = 0
    ops_rows: list[dict] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return self.t_end - self.t_start


def placement(hosts: list[str], ranks: int, ranks_per_host: int) -> list[tuple[str, int]]:
    """Packed placement: rank r runs on hosts[r // ranks_per_host] as local rank r % ranks_per_host."""
    if ranks_per_host < 1:
        raise UsageError(f"ranks_per_host must be >= 1 (got {ranks_per_host})")
    if ranks < 1:
        raise UsageError(f"ranks must be >= 1 (got {ranks})")
    need = -(-ranks // ranks_per_host)
    if need > len(hosts):
        raise UsageError(f"ranks: {ranks} ranks at {ranks_per_host} per host need {need} hosts; the fabric has "
                         f"{len(hosts)}")
    return [(hosts[r // ranks_per_host], r % ranks_per_host) for r in range(ranks)]


class Program:
    """One launch of ``cmd`` (a shell command line, run by ``sh -c`` in each rank's host) on ``lab``; see the
    module docstring. ``hosts``: the hosts in rank order (default: all, in the fabric's order); ``ranks``: default
    one per host slot; ``timeout_s``: the whole program must end within it; ``env``: added to every rank's
    environment; ``warmup_steps``: steps of each rank left out of ops.csv; ``cwd``: where ranks start (default: this
    process's directory); ``start_timeout_s`` (mpi): mpirun must start a rank within it (bounded by timeout_s)."""

    def __init__(self, lab, cmd: str, hosts=None, ranks: int | None = None, ranks_per_host: int = 1,
                 launcher: str = "torch", master_port: int = 29500, timeout_s: float = 600.0,
                 env: dict | None = None, warmup_steps: int = 0, cwd: str | None = None,
                 start_timeout_s: float = 60.0):
        if launcher not in LAUNCHERS:
            raise UsageError(f"launcher: {launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if not str(cmd).strip():
            raise UsageError("cmd: empty command (e.g. cmd='python3 train.py')")
        self.lab, self.cmd, self.launcher = lab, str(cmd), launcher
        self.python = sys.executable  # the ranks' Python (testbed.workloads.interpreter), as torchrun's ranks get
        self.run_cmd = rank_command(self.cmd, self.python)
        names = [getattr(h, "name", h) for h in (hosts if hosts is not None else lab.net.hosts)]
        self.ranks = ranks if ranks is not None else len(names) * ranks_per_host
        self.ranks_per_host = ranks_per_host
        self.where = placement(names, self.ranks, ranks_per_host)
        self.hosts = list(dict.fromkeys(h for h, _ in self.where))
        self.master_port, self.timeout_s, self.warmup_steps = master_port, timeout_s, warmup_steps
        self.start_timeout_s = min(float(start_timeout_s), float(timeout_s))
        self.extra_env = {str(k): str(v) for k, v in (env or {}).items()}
        self.cwd = cwd or os.getcwd()
        self.dir = lab.rundir.path / "program"
        self.token = uuid.uuid4().hex[:16]
        self.procs: dict[int, subprocess.Popen] = {}  # rank -> process (mpi: rank 0 -> mpirun)
        self._files: list = []
        self._events_read = 0  # bytes of rank 0's event file read for step-triggered faults
        self.t_start = 0.0

    # ---- start ----

    def _base_env(self) -> dict:
        fabric = self.lab.net.fabric
        env = {**os.environ, **self.extra_env,
               "TESTBED_PROGRAM": self.token, "TESTBED_RUN_DIR": str(self.lab.rundir.path),
               "TESTBED_EVENTS": str(self.dir / "events" / "rank-{rank}.jsonl"),
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
               "MASTER_ADDR": fabric.host_ip(self.hosts[0]), "MASTER_PORT": str(self.master_port),
               "WORLD_SIZE": str(self.ranks), "OMP_NUM_THREADS": self.extra_env.get("OMP_NUM_THREADS", "1")}
        return env

    def _out(self, name: str):
        f = open(self.dir / name, "wb")
        self._files.append(f)
        return f

    def start(self) -> "Program":

        (self.dir / "events").mkdir(parents=True, exist_ok=True)
        self.lab.on_teardown(self.stop)
        self.lab.rundir.manifest["program"] = {"cmd": self.cmd, "cmd_run": self.run_cmd, "python": self.python,
                                               "launcher": self.launcher, "ranks": self.ranks,
                                               "ranks_per_host": self.ranks_per_host,
                                               "placement": {str(r): h for r, (h, _) in enumerate(self.where)},
                                               "versions": program_versions(self.launcher)}
        self.lab.rundir.write_manifest()
        base = self._base_env()
        self.t_start = time.monotonic()
        self.lab.start_workload()
        if self.launcher == "mpi":
            argv = uts.named(self.hosts[0], self._mpirun_argv())
            self.procs[0] = netns.popen(self.lab.net.ns(self.hosts[0]), argv, env=base, cwd=self.cwd,
                                        stdout=self._out("mpirun.stdout"), stderr=self._out("mpirun.stderr"),
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        else:
            for rank, (host, local) in enumerate(self.where):
                env = {**base, "RANK": str(rank), "LOCAL_RANK": str(local),
                       "LOCAL_WORLD_SIZE": str(sum(1 for h, _ in self.where if h == host)),
                       "GROUP_RANK": str(self.hosts.index(host)),
                       "GLOO_SOCKET_IFNAME": self._ifname(host), "NCCL_SOCKET_IFNAME": self._ifname(host)}
                argv = uts.named(host, ["sh", "-c", self.run_cmd])
                self.procs[rank] = netns.popen(self.lab.net.ns(host), argv, env=env, cwd=self.cwd,
                                               stdout=self._out(f"rank-{rank}.stdout"),
                                               stderr=self._out(f"rank-{rank}.stderr"),
                                               stdin=subprocess.DEVNULL, start_new_session=True)
        for p in self.procs.values():
            self.lab.state.add("pids", p.pid)
        self.lab.progress(f"program ({self.launcher}): {self.ranks} rank(s) on {', '.join(self.hosts)}: {self.run_cmd}")
        return self

    def _ifname(self, host: str) -> str:
        return self.lab.net[host].defaultIntf().name

    def _mpirun_argv(self) -> list[str]:
        """mpirun with a hostfile of the fabric addresses and the rsh agent that enters each address's host."""
        fabric = self.lab.net.fabric
        nodes = [mpirun.Node(fabric.host_ip(h), self.lab.net.ns(h), h) for h in self.hosts]
        slots = {h: sum(1 for x, _ in self.where if x == h) for h in self.hosts}
        (self.dir / "hostfile").write_text(mpirun.hostfile(nodes, slots))
        agent = self.dir / "rsh"
        agent.write_text(mpirun.rsh_agent(nodes))
        agent.chmod(0o755)
        exports = ["TESTBED_PROGRAM", "TESTBED_RUN_DIR", "TESTBED_EVENTS", "PYTHONPATH", "OMP_NUM_THREADS",
                   *self.extra_env]
        return mpirun.argv(self.dir / "hostfile", agent, self.ranks, self.dir / "mpi", exports, self.cwd,
                           self.run_cmd)

    # ---- end ----

    def wait(self) -> ProgramResult:
        """Until every rank has exited (or mpirun has), the timeout passed, or a rank failed; then the program's
        files. RunFailed, one line naming the rank and its exit status, or the ranks still running at the
        timeout; every process of the program is ended first."""
        deadline = self.t_start + self.timeout_s
        status: dict[int, int | None] = {}
        end_s: dict[int, float] = {}
        failed, no_rank = None, None
        watch = mpirun.StartWatch(self.token, {h: self.lab.net.ns(h) for h in self.hosts}, self.start_timeout_s) \
            if self.launcher == "mpi" else None
        while len(status) < len(self.procs):
            self._watch_steps()
            for rank, p in self.procs.items():
                if rank not in status and p.poll() is not None:
                    status[rank], end_s[rank] = p.returncode, time.monotonic()
                    if p.returncode != 0 and failed is None:
                        failed = rank
            if watch is not None and len(status) < len(self.procs):
                no_rank = watch.check(time.monotonic() - self.t_start,
                                      lambda: _last_line(self.dir / "mpirun.stderr"))
            if failed is not None or no_rank is not None or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        t_end = time.monotonic()
        running = [r for r in self.procs if r not in status]
        self.stop()
        result = self._collect(status, end_s, t_end)
        if failed is not None:
            raise RunFailed(self._failure(failed, status[failed]))
        if no_rank is not None:
            raise RunFailed(f"{no_rank}; killed (output: {self.dir})")
        if running:
            raise RunFailed(f"program: {self._who(running)} still running after timeout_s={self.timeout_s:g}; "
                            f"killed (output: {self.dir})")
        return result

    def _watch_steps(self) -> None:
        """Rank 0's new step_begin events start the faults scheduled at that step (``lab.at_iteration(k, ...)``: k is
        the program's own step number), as a collective job's rank 0 reports its iterations."""
        faults = getattr(self.lab, "faults", None)
        if faults is None or not faults.by_iteration:
            return
        f = self.dir / "events" / "rank-0.jsonl"
        try:
            with open(f, "rb") as fh:
                fh.seek(self._events_read)
                chunk = fh.read()
        except OSError:
            return
        done = chunk.rfind(b"\n") + 1  # whole lines only
        self._events_read += done

        for e in parse(chunk[:done].decode("utf-8", "replace").splitlines())[0]:
            if e["event"] == "step_begin" and isinstance(e.get("step"), int):
                faults.iteration(e["step"])

    def _who(self, ranks: list[int]) -> str:
        if self.launcher == "mpi":
            return "mpirun"
        return ", ".join(f"rank {r} ({self.where[r][0]})" for r in ranks)

    def _failure(self, rank: int, code: int) -> str:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        if self.launcher == "mpi":
            return f"program: mpirun {how} (a rank failed or never connected: {self.dir}/mpirun.stderr)"
        last = _last_line(self.dir / f"rank-{rank}.stderr")
        return (f"program: rank {rank} ({self.where[rank][0]}) {how}" + (f": {last}" if last else "")
                + f" ({self.dir}/rank-{rank}.stderr)")

    def _collect(self, status: dict, end_s: dict, t_end: float) -> ProgramResult:
        """program.csv, and ops.csv from the events (when there are any)."""

        rundir, t0 = self.lab.rundir, self.t_start
        rows = [(r, h, lr, "" if status.get(r) is None else status[r], f"{end_s.get(r, t_end):.6f}")
                for r, (h, lr) in enumerate(self.where)] if self.launcher == "torch" else \
               [(r, h, lr, "" if status.get(0) is None else status[0], f"{end_s.get(0, t_end):.6f}")
                for r, (h, lr) in enumerate(self.where)]
        rundir.write_csv("program.csv", PROGRAM_COLUMNS, rows)
        by_rank, bad = {}, 0
        for r in range(self.ranks):
            f = self.dir / "events" / f"rank-{r}.jsonl"
            if f.exists():
                events, skipped = progevents.parse(f.read_text(errors="replace").splitlines())
                by_rank[r], bad = events, bad + skipped
        ops = progevents.ops_rows(by_rank, {r: h for r, (h, _) in enumerate(self.where)}, self.warmup_steps)
        if ops:
            rundir.write_csv("ops.csv", OPS_COLUMNS, ([o[c] for c in OPS_COLUMNS] for o in ops))
        return ProgramResult(dict(status), dict(end_s), t0, t_end, bad, ops)

    def stop(self) -> None:
        """End every process of the program (SIGTERM, then SIGKILL after 2 s): the launched ones' process groups
        and anything carrying its TESTBED_PROGRAM mark (mpirun's daemons and their ranks)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = set(marked_pids(self.token))
            for p in self.procs.values():
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and (any(p.poll() is None for p in self.procs.values())
                                                  or marked_pids(self.token)):
                time.sleep(0.05)
            if not marked_pids(self.token) and all(p.poll() is not None for p in self.procs.values()):
                break
        if self.launcher == "mpi" and 0 in self.procs:  # a killed mpirun leaves its session directory behind
            mpirun.remove_session_dir(uts.hostname_for(self.hosts[0]), self.procs[0].pid)
        for f in self._files:
            f.close()
        self._files.clear()


def marked_pids(token: str) -> list[int]:
    """Processes whose environment carries TESTBED_PROGRAM=token."""
    return [p.pid for p in mpirun.program_processes(token)]


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:200] if lines else ""


def program_versions(launcher: str) -> dict[str, str]:
    """The versions the manifest records: torch (Debian's python3-torch, without importing it) and, under mpirun,
    Open MPI's and mpi4py's."""
    from importlib import metadata

    out = {}
    for dist in ("torch", "mpi4py"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if launcher == "mpi":
        try:
            r = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=10)
            out["mpirun"] = (r.stdout.splitlines() or [""])[0].strip()
        except (OSError, subprocess.TimeoutExpired):
            out["mpirun"] = "missing"
    return out
