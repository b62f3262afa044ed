"""The controller side of a collective run: write the job, start one agent per rank, run the control plane.

    ctl = Controller(workdir, job, schedules, members, spawn)   # members: [Member(rank, host, namespace, ip)]
    ctl.start()                 # job.json + schedule-*.json + ctl.sock in workdir, agents started via spawn()
    res = ctl.run()             # hello -> peers -> ready -> go -> results -> bye; raises ControlError on failure
    ctl.stop()                  # (always) kill agents still running, close the socket

While the job runs, a job with ``report_iterations`` has rank 0 send ``{"type": "iteration", "iteration": K}`` as it
begins each iteration; ``on_iteration(K)`` gets it (the lab's fault timeline starts faults at an iteration).

``spawn(namespace, argv, **popen_kwargs) -> subprocess.Popen`` starts a process inside a host's namespace
(testbed.kernel.netns.popen). This module knows nothing of fabrics, so benchmarks and tests can drive it directly.

Across servers (docs/servers.md) the AF_UNIX socket does not reach another kernel: ``listen=(address, port)`` makes
the controller listen on TCP instead, on the reference server's own address (``listen_in``: a context manager the
socket is made in, e.g. the namespace holding that address), and agents get ``--control tcp:ADDRESS:PORT``, which a
server's spawn turns into a connection of its own (testbed.commands.serverjobs). ``clock_offsets_s`` (per rank: its
machine's CLOCK_MONOTONIC minus this one's) puts the common start instant on each rank's own clock. A TCP
controller makes a per-run secret (``token``, generated unless given), writes it into job.json (0600; a far rank gets
it in its shipped job file, never in argv) and admits a connection only when its hello carries it, names a rank of
the job and that rank has no connection yet (traffic.ctlgate); anything else is closed and the controller keeps
listening for the real rank.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from traffic import schedule_json
from traffic.ctlgate import Gate, Peer
from traffic.schedule import Schedule

SOCK_NAME = "ctl.sock"


class ControlError(RuntimeError):
    pass


@dataclass(frozen=True)
class Member:
    rank: int
    host: str
    namespace: str
    ip: str


@dataclass
class Results:
    t_start: float
    t_ready: float
    t_end: float
    per_rank: dict[int, dict]
    t_spawned: float | None = None   # when the controller began starting the agents (their set-up: t_ready - this)

    @property
    def t_measure_by_rank(self) -> dict[int, float]:
        return {r: float(v.get("t_measure", self.t_start)) for r, v in self.per_rank.items()}

    @property
    def t_measure(self) -> float:
        """When the slowest rank finished its warm-up (= t_start without warm-up): end(-1) of step times."""
        return max((float(r.get("t_measure", self.t_start)) for r in self.per_rank.values()), default=self.t_start)

    @property
    def verified(self) -> bool:
        return all(r.get("verified") for r in self.per_rank.values())

    @property
    def ops(self) -> list[list]:
        return sorted((row for r in self.per_rank.values() for row in r["ops"]), key=lambda x: (x[0], x[2], x[4]))

    @property
    def clock_uncertainty_s(self) -> float:
        """The largest bound on any rank's clock against the controller's (0 when every rank ran on its machine,
        or none was put on it): what to allow when comparing times of ranks on different servers."""
        return max((float(v.get("clock", {}).get("uncertainty_s", 0.0)) for v in self.per_rank.values()),
                   default=0.0)

    @property
    def tcp_info(self) -> list[list]:
        return [row for r in sorted(self.per_rank) for row in self.per_rank[r]["tcp_info"]]


class Controller:
    def __init__(self, workdir: Path, job: dict, schedules: dict[str, Schedule], members: list[Member],
                 spawn: Callable, progress: Callable[[str], None] | None = None, python: str | None = None,
                 start_delay_s: float = 0.3, on_iteration: Callable[[int], None] | None = None,
                 listen: tuple[str, int] | None = None, listen_in: Callable | None = None,
                 clock_offsets_s: dict[int, float] | None = None, token: str | None = None):
        self.workdir = Path(workdir)
        self.listen, self.listen_in = listen, listen_in
        # the run's secret a rank's hello must carry (TCP only: the AF_UNIX socket is guarded by the run directory)
        self.token = token or (secrets.token_hex(16) if listen is not None else None)
        self.rejected: list[str] = []   # why connections were refused a rank's place (traffic.ctlgate)
        self.gate: Gate | None = None   # while the ranks' hellos are gathered
        self.clock_offsets_s = dict(clock_offsets_s or {})
        # rank 0 reports each iteration's start while the job runs when the job asks it to (report_iterations)
        self.on_iteration = on_iteration
        self.job = job
        self.schedules = schedules
        self.members = sorted(members, key=lambda m: m.rank)
        self.spawn = spawn
        self.say = progress or (lambda m: None)
        self.python = python or sys.executable
        self.start_delay_s = start_delay_s
        self.procs: dict[int, object] = {}
        self.t_spawned: float | None = None
        self.listener: socket.socket | None = None
        self.peers: list[Peer] = []
        self._dirfd: int | None = None
        self.sock_path: str = SOCK_NAME  # what agents get as --control (relative to the run directory)
        self._sock_dir: str | None = None  # private folder when the run directory cannot hold a socket

    # ---- files and processes ----

    def _bind_tcp(self) -> None:
        """The TCP listener on ``listen`` (made inside ``listen_in`` when given); agents get tcp:ADDRESS:PORT."""
        import contextlib

        with self.listen_in() if self.listen_in else contextlib.nullcontext():
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(self.listen)
            ls.listen(len(self.members) + 4)
        except OSError:
            ls.close()
            raise
        self.sock_path = f"tcp:{self.listen[0]}:{ls.getsockname()[1]}"
        self.listener = ls

    def _bind(self) -> None:
        if self.listen is not None:
            return self._bind_tcp()
        path = self.workdir / SOCK_NAME
        if path.exists():
            path.unlink()
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = str(path)
        if len(name.encode()) > 100:  # sun_path is 108 bytes: go through a short /proc path to the same place
            self._dirfd = os.open(self.workdir, os.O_RDONLY | os.O_DIRECTORY)
            name = f"/proc/self/fd/{self._dirfd}/{SOCK_NAME}"
        try:
            ls.bind(name)
        except OSError as e:
            # A run directory on a filesystem without Unix sockets (the lab VM shares the host's folders over 9p:
            # ENXIO): bind in a private local folder instead; agents get its absolute path.
            import errno
            import tempfile

            if e.errno not in (errno.ENXIO, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES):
                raise
            self._sock_dir = tempfile.mkdtemp(prefix="tb-ctl-")
            self.sock_path = os.path.join(self._sock_dir, SOCK_NAME)
            ls.bind(self.sock_path)
        ls.listen(len(self.members) + 4)
        self.listener = ls

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        files, per_rank = {}, {}
        for key, s in self.schedules.items():
            fn = f"schedule-{key}.json"
            schedule_json.dump(s, self.workdir / fn)
            files[key] = fn
            if s.collective != "custom":  # an agent checks a custom schedule by simulating all of it
                per_rank[key] = "ranks/" + schedule_json.dump_for_ranks(s, self.workdir / "ranks", f"schedule-{key}")
        job = dict(self.job, schedules=files, rank_schedules=per_rank, format="testbed-collective-job", version=1)
        text = json.dumps(dict(job, control_token=self.token) if self.token else job, indent=1) + "\n"
        if self.token is not None:      # readable by its owner only
            _write_private(self.workdir / "job.json", text)
        else:
            (self.workdir / "job.json").write_text(text)
        self._bind()
        env = dict(os.environ)
        self.t_spawned = time.monotonic()
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for m in self.members:
            argv = [self.python, "-m", "traffic.agent", "--job", "job.json", "--rank", str(m.rank), "--ip", m.ip,
                    "--control", self.sock_path]
            log = open(self.workdir / f"agent-{m.rank}.log", "wb")
            try:
                self.procs[m.rank] = self.spawn(m.namespace, argv, cwd=str(self.workdir), env=env,
                                                stdout=log, stderr=log, stdin=subprocess_devnull())
            finally:
                log.close()
        self.say(f"{len(self.members)} agents started")

    def agent_log(self, rank: int) -> str:
        p = self.workdir / f"agent-{rank}.log"
        try:
            return p.read_text(errors="replace").strip()
        except OSError:
            return ""

    def _failed_agents(self) -> list[str]:
        out = []
        for r, p in self.procs.items():
            rc = p.poll()
            if rc is not None and rc != 0:
                last = (self.agent_log(r).splitlines() or ["(no output)"])[-1]
                out.append(f"rank {r} exited with status {rc}: {last}")
        return out

    # ---- the control plane ----

    def _admit_all(self, deadline: float) -> dict[int, dict]:
        """Every rank's hello over a connection of its own (traffic.ctlgate.Gate: strays, duplicates and wrong
        tokens are closed, and listening goes on)."""
        self.gate = gate = Gate(self.listener, self.token, {m.rank for m in self.members}, self.say)
        try:
            return gate.admit(deadline, self._failed_agents, ControlError)
        finally:
            self.peers, self.rejected = gate.peers, gate.rejected

    def _collect(self, kind: str, deadline: float, by_rank: dict[int, dict]) -> None:
        """Read until every agent sent a message of type ``kind`` (stored by the rank its connection was admitted
        as: a message cannot speak for another rank)."""
        sel = selectors.DefaultSelector()
        for p in self.peers:
            if not p.eof:
                sel.register(p.sock, selectors.EVENT_READ, p)
        try:
            for p in self.peers:                  # lines that came with the hello (or the last message) already
                self._handle(p, p.lines(), kind, by_rank)
            while len(by_rank) < len(self.members):
                if time.monotonic() > deadline:
                    missing = sorted({m.rank for m in self.members} - set(by_rank))
                    raise ControlError(f"ranks {missing} sent no {kind} in time")
                for key, _ in sel.select(0.2):
                    p = key.data
                    self._handle(p, p.read(), kind, by_rank)
                    if p.eof:
                        sel.unregister(p.sock)
                        if p.rank is None or p.rank not in by_rank:
                            time.sleep(0.1)
                            bad = self._failed_agents()
                            raise ControlError("; ".join(bad) or f"agent of rank {p.rank} hung up before its {kind}")
                bad = self._failed_agents()
                if bad:
                    raise ControlError("; ".join(bad))
        finally:
            sel.close()

    def _handle(self, p: Peer, msgs: list[dict], kind: str, by_rank: dict[int, dict]) -> None:
        for msg in msgs:
            if msg.get("type") == "result" and msg.get("error"):
                raise ControlError(msg["error"])
            if msg.get("type") == kind:
                by_rank[p.rank] = msg
            elif msg.get("type") == "iteration" and self.on_iteration is not None:
                self.on_iteration(int(msg["iteration"]))

    def _broadcast(self, obj: dict) -> None:
        for p in self.peers:
            self._send_to(p, obj)

    @staticmethod
    def _send_to(p: Peer, obj: dict) -> None:
        if not p.eof:
            try:
                p.sock.setblocking(True)
                p.send(obj)
            finally:
                p.sock.setblocking(False)

    def run(self, setup_timeout_s: float = 120.0, run_timeout_s: float = 600.0,
            before_go: Callable[[], None] | None = None) -> Results:
        """The whole control plane; ``before_go`` runs once every agent is connected and ready, just before the
        start instant is sent (start samplers and background traffic there)."""
        deadline = time.monotonic() + setup_timeout_s
        hellos = self._admit_all(deadline)
        self._broadcast({"type": "peers", "addrs": {str(r): h["addr"] for r, h in hellos.items()}})
        ready: dict[int, dict] = {}
        self._collect("ready", deadline, ready)
        self.ready = ready
        if before_go is not None:
            before_go()
        t_ready = time.monotonic()
        t_start = t_ready + self.start_delay_s
        for p in self.peers:     # the one instant, on each rank's own clock
            self._send_to(p, {"type": "go", "t_start": t_start + self.clock_offsets_s.get(p.rank, 0.0)})
        ccs = sorted(set(c for r in ready.values() for c in r.get('cc', [])))
        self.say(f"go: {len(self.members)} ranks connected ({', '.join(ccs)})")
        results: dict[int, dict] = {}
        self._collect("result", time.monotonic() + run_timeout_s, results)
        t_end = time.monotonic()
        self._broadcast({"type": "bye"})
        for r, p in self.procs.items():
            try:
                p.wait(timeout=30)
            except Exception:  # noqa: BLE001
                pass
        return Results(t_start, t_ready, t_end, results, self.t_spawned)

    def stop(self, reason: str = "") -> None:
        """Tell agents to stop (if any still listen), end the processes we started, close the socket."""
        for p in self.peers:
            try:
                p.sock.setblocking(True)
                p.sock.settimeout(1)
                p.send({"type": "abort", "reason": reason})
            except OSError:
                pass
        for r, p in self.procs.items():
            if p.poll() is None:
                try:
                    p.wait(timeout=2)
                except Exception:  # noqa: BLE001
                    p.kill()
                    try:
                        p.wait(timeout=5)
                    except Exception:  # noqa: BLE001
                        pass
        for p in self.peers:
            try:
                p.sock.close()
            except OSError:
                pass
        self.peers = []
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            try:
                if self.listen is None:
                    (self.workdir / SOCK_NAME).unlink() if self._sock_dir is None else os.unlink(self.sock_path)
            except OSError:
                pass
        import shutil

        # the agents' per-rank schedule files are read once, at start; the whole schedule stays in the run
        shutil.rmtree(self.workdir / "ranks", ignore_errors=True)
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None
        if self._dirfd is not None:
            os.close(self._dirfd)
            self._dirfd = None


def job_files(workdir: Path, job_name: str, rank: int) -> dict[str, str]:
    """What rank ``rank``'s agent reads of a started job (``job_name`` in ``workdir``): the job, and per schedule its
    per-rank file when there is one (else the whole schedule), by name relative to ``workdir`` -> text. What a
    server that cannot read the run directory is sent (testbed.commands.serverjobs)."""
    workdir = Path(workdir)
    job = json.loads((workdir / job_name).read_text())
    base = Path(job_name).parent
    out = {job_name: (workdir / job_name).read_text()}
    own = job.get("rank_schedules", {})
    for key, fn in job.get("schedules", {}).items():
        mine = base / own[key].format(rank=rank) if key in own else None
        name = str(mine) if mine is not None and (workdir / mine).exists() else str(base / fn)
        out[name] = (workdir / name).read_text()
    return out


def _write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by its owner only (it may hold the run's control token)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def subprocess_devnull():
    import subprocess

    return subprocess.DEVNULL
