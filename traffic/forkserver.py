"""A fork server for traffic agents: one interpreter imports numpy and the agent code once; every agent is a fork of
it that enters its host's network namespace and runs :func:`traffic.agent.main`.

Why: an agent is a fresh Python interpreter per rank, and in the software-emulated lab VM importing numpy and the
agent code costs ~6 s of CPU per interpreter: four agents on two vCPUs took ~25 s from spawn to "connected". A fork
of an interpreter that has already imported them takes milliseconds. This is what multiprocessing's "forkserver"
start method does, plus the namespace switch (setns) that `nsenter` would otherwise make.

The server is a single-threaded child (``python -m traffic.forkserver``) started before the fabric is built, so its
imports overlap the build; it talks JSON lines on its stdin/stdout:
``{"op": "spawn", "netns": PATH, "argv": [...], "cwd": DIR, "env": {...}, "log": FILE}`` -> ``{"pid": N}`` and
``{"op": "status", "pid": N}`` -> ``{"rc": exit status or null while running}``. :meth:`ForkServer.popen` has
the signature of :func:`testbed.kernel.netns.popen` and returns a Popen-like handle, so the controller does not know
which one started its agents. Only ``python -m traffic.agent`` is forked; anything else goes to `fallback`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

AGENT_MODULE = "traffic.agent"
CLONE_NEWNET = 0x40000000


# ---- the server (child interpreter) ------------------------------------------------------------------------------


def _child(req: dict) -> None:
    """In the forked child: enter the namespace, become the agent, exit with its status. Never returns."""
    rc = 1
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(req["netns"], os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({req['netns']})")
        os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(s, signal.SIG_DFL)
        sys.stdout.reconfigure(line_buffering=True)  # as PYTHONUNBUFFERED-ish as a fresh agent's log
        from traffic import agent

        sys.argv = [AGENT_MODULE, *req["argv"]]
        rc = agent.main(req["argv"]) or 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the log gets the traceback, the parent the status
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


def serve() -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # a BLAS thread pool in a process that forks is trouble
    import numpy  # noqa: F401 - the point: imported once, shared by every fork

    from traffic import agent  # noqa: F401
    try:
        from traffic import rdma  # noqa: F401 - pyverbs, where installed
    except Exception:  # noqa: BLE001
        pass
    status: dict[int, int] = {}

    def reap() -> None:
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status[pid] = os.waitstatus_to_exitcode(st)

    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0
        req = json.loads(line)
        reap()
        if req["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                _child(req)
            status.pop(pid, None)  # a pid the kernel reused: not the earlier agent's exit (the server lives a Lab)
            reply = {"pid": pid}
        elif req["op"] == "status":
            reply = {"rc": status.get(int(req["pid"]))}
        else:
            reply = {"error": f"unknown op {req['op']!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


# ---- the client (the controller's side) --------------------------------------------------------------------------


class ForkedProcess:
    """The subset of subprocess.Popen the controller uses, for an agent forked by the server."""

    def __init__(self, server: "ForkServer", pid: int, args: list[str]):
        self.server, self.pid, self.args = server, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """Start with :meth:`start` (returns at once; the imports run in the background), spawn agents with
    :meth:`popen`, end with :meth:`close` (kills agents still running, then the server)."""

    def __init__(self, netns_dir: Path, fallback: Callable[..., subprocess.Popen], python: str | None = None):
        self.netns_dir = Path(netns_dir)
        self.fallback = fallback
        self.python = python or sys.executable
        self.proc: subprocess.Popen | None = None
        self.children: list[ForkedProcess] = []
        self._lock = threading.Lock()
        self._ready = False

    def start(self) -> "ForkServer":
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=root + (os.pathsep + os.environ["PYTHONPATH"]
                                                  if os.environ.get("PYTHONPATH") else ""))
        self.proc = subprocess.Popen([self.python, "-m", "traffic.forkserver"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _ask(self, req: dict) -> dict:
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError("traffic.forkserver is not running")
            if not self._ready:
                line = self.proc.stdout.readline()
                if "ready" not in line:
                    raise RuntimeError(f"traffic.forkserver did not start: {line.strip() or 'no output'}")
                self._ready = True
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("traffic.forkserver ended")
        return json.loads(line)

    def status(self, pid: int) -> int | None:
        return self._ask({"op": "status", "pid": pid})["rc"]

    def popen(self, namespace: str, argv: list[str], cwd: str | None = None, env: dict | None = None,
              stdout=None, stderr=None, stdin=None, **kw):
        """Like netns.popen(namespace, argv, ...): agents are forked, anything else goes to the fallback."""
        is_agent = len(argv) >= 3 and argv[1:3] == ["-m", AGENT_MODULE]
        log = getattr(stdout, "name", None)
        if not is_agent or kw or not isinstance(log, str) or (stderr is not None and stderr is not stdout):
            return self.fallback(namespace, argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr, stdin=stdin, **kw)
        reply = self._ask({"op": "spawn", "netns": str(self.netns_dir / namespace), "argv": argv[3:],
                           "cwd": cwd or os.getcwd(), "env": dict(env if env is not None else os.environ),
                           "log": log})
        child = ForkedProcess(self, reply["pid"], argv)
        self.children.append(child)
        return child

    def close(self) -> None:
        if self.proc is None:
            return
        for c in self.children:
            try:
                c.kill()  # only if the server has not reaped it (a reaped pid may belong to someone else now)
            except Exception:  # noqa: BLE001 - a server out of step (a signal mid-request) must not stop the close
                pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc = None


if __name__ == "__main__":
    sys.exit(serve())
