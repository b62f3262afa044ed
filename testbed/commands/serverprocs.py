"""Processes a server's agent starts for the lab (its ``spawn``, ``proc_poll`` and ``proc_kill`` operations,
docs/servers.md): a collective rank's ``traffic.agent`` inside one of the project's namespaces on this server.

What it stands for: a cluster launcher's per-node daemon (Slurm's slurmd, MPI's orted) starting a job's processes on
its node with the job's files and a connection back to the launcher. Here:

* **the job files** come in the request (their contents: a far machine cannot read the reference's run directory)
  and are written to a private folder (``tb-<run>-job-*`` under the temporary directory), the process's working
  directory; it is removed once the process is reaped, and with everything else at the agent's teardown; it is in
  the agent's RunState (``folders``) meanwhile, so ``testbed clean`` removes it after an agent that was SIGKILLed;
* **the control connection** is a TCP connection the agent opens to the controller *from its own namespace* (the
  server's NIC: a host's namespace sees only the emulated fabric, and control traffic must not ride it), handed to
  the process as an inherited descriptor: its ``--control`` argument becomes ``fd:N`` (traffic.channel.connect);
* **the agent is not held**: ``spawn`` returns the pid at once (a long ``run`` would block every other request,
  the lease's renewals included); ``proc_poll`` reaps an ended process and returns its status and log,
  ``proc_kill`` signals its process group. Every process still running is killed and reaped at the agent's
  teardown (end of input, SIGTERM, the lease running out), and its pid is in the agent's RunState meanwhile, so
  ``testbed clean`` on this server finds it too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

from testbed.kernel import netns
from testbed.kernel.state import RunState

LOG_NAME = "process.log"
#: how much of a process's log a reply carries (its end: where a traceback or the last error is)
LOG_TAIL_BYTES = 64_000


def _safe_relative(name: str) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"file name {name!r} must be relative, without '..'")
    return p


class Processes:
    """The processes this agent started and their folders (pid -> Popen, pid -> folder); ended ones' replies kept so
    that a second poll answers the same."""

    def __init__(self, state: RunState):
        self.state = state
        self.running: dict[int, subprocess.Popen] = {}
        self.folders: dict[int, str] = {}
        self.ended: dict[int, dict] = {}

    def spawn(self, ns: str, argv: list[str], files: dict[str, str] | None = None,
              control: list | None = None, control_arg: str = "--control", connect_timeout_s: float = 10.0) -> dict:
        """Start ``argv`` in the project's namespace ``ns`` with ``files`` (relative name -> text) written to a new
        private folder, its working directory; with ``control`` ([address, port]), first connect to it from this
        agent's namespace and give the process the connection as ``control_arg fd:N``. Returns the pid."""
        if not netns.ours(ns) or not (netns.NETNS_DIR / ns).exists():
            raise ValueError(f"namespace {ns!r} is not one of the project's here")
        names = {name: _safe_relative(name) for name in (files or {})}
        if control is not None and control_arg not in argv[:-1]:
            raise ValueError(f"argv has no {control_arg} to hand the connection to")
        folder = tempfile.mkdtemp(prefix=f"tb-{self.state.run_id}-job-")
        sock = None
        try:
            self.state.add("folders", folder)     # from here on a SIGKILL of this agent leaves it to `testbed clean`
            for name, rel in names.items():
                path = Path(folder, *rel.parts)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(files[name])
            argv = list(argv)
            if control is not None:
                sock = socket.create_connection((str(control[0]), int(control[1])), timeout=connect_timeout_s)
                sock.setblocking(True)        # the process gets a plain blocking descriptor
                argv[argv.index(control_arg) + 1] = f"fd:{sock.fileno()}"
            with open(Path(folder, LOG_NAME), "wb") as log:
                proc = subprocess.Popen(netns.in_namespace(ns, argv), cwd=folder, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=log, pass_fds=(sock.fileno(),) if sock else (),
                                        start_new_session=True)
                # registered at once, so a signal from here on leaves it to teardown (not an orphan); a pid the
                # kernel reuses is this process now, not the one that ended with it
                self.running[proc.pid], self.folders[proc.pid] = proc, folder
                self.ended.pop(proc.pid, None)
                self.state.add("pids", proc.pid)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            self.state.discard("folders", folder)
            raise
        finally:
            if sock is not None:
                sock.close()                  # the process holds its own copy
        return {"pid": proc.pid, "folder": folder}

    def poll(self, pid: int) -> dict:
        """``rc`` None while it runs; once it ended: its status and its log's end (the folder is removed then)."""
        if pid in self.ended:
            return self.ended[pid]
        proc = self._proc(pid)
        rc = proc.poll()
        if rc is None:
            return {"rc": None}
        self.ended[pid] = done = {"rc": rc, "log": self._log(pid)}
        self._forget(pid)
        return done

    def kill(self, pid: int, sig: int = signal.SIGKILL) -> dict:
        """Signal the process's group (it was started in a session of its own); reap it with :meth:`poll`."""
        if pid in self.ended:
            return {"signalled": False}
        self._proc(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, int(sig))
        return {"signalled": True}

    def teardown(self) -> None:
        """Kill and reap every process still running, remove every folder. One that cannot be killed or does not
        end keeps its pid and folder in the run's state (for `testbed clean`) and the others are still ended;
        RuntimeError naming them at the end."""
        failed = []
        for pid, proc in list(self.running.items()):
            try:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired) as e:
                failed.append(f"{pid} ({type(e).__name__}: {e})")
                continue
            self._forget(pid)
        if failed:
            raise RuntimeError(f"process {', '.join(failed)} not ended")

    def _proc(self, pid: int) -> subprocess.Popen:
        proc = self.running.get(int(pid))
        if proc is None:
            raise LookupError(f"no process {pid} started by this agent")
        return proc

    def _log(self, pid: int) -> str:
        try:
            with open(Path(self.folders[pid], LOG_NAME), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _forget(self, pid: int) -> None:
        self.running.pop(pid, None)
        self.state.discard("pids", pid)
        folder = self.folders.pop(pid, None)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
            if not os.path.exists(folder):          # one that could not be removed stays for `testbed clean`
                self.state.discard("folders", folder)
