"""The reference server's end of the control channel: one agent process per server, reached through a pipe
(docs/servers.md). A remote server's agent is started over one ssh connection (``ssh -o BatchMode=yes ... PYTHON -m
testbed.commands.serveragent``: the cluster edition's non-interactive ssh, one session per server); the local
server's (``localhost``) is the same program as a local subprocess, so both paths speak the same JSON lines and are
tested the same way.

ssh runs in the caller's network namespace: started from inside a project namespace (``nsenter --net=...``, as the
two-kernel test does), it reaches a lab VM on that namespace's wire and never the host's own network.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from testbed.network.serversfile import Server

PROJECT_ROOT = Path(__file__).resolve().parents[2]
AGENT_MODULE = "testbed.commands.serveragent"
#: the lease AgentLink.start asks its agent for (testbed.commands.serveragent.Lease): renewed by a ping every third
#: of it, so an agent whose lab went silent (the link, not the ssh session, gone) tears down within half a minute
LEASE_S = 30.0


class AgentError(RuntimeError):
    """The agent could not be reached, did not answer in time, or refused a request (one line)."""


class AgentGone(AgentError):
    """The agent's link closed or its process (or its ssh) ended: nothing more will be answered."""


class AgentTimeout(AgentError):
    """No answer in time: the agent may only be slow (its reply, late, is skipped by the next call)."""


def ssh_argv(server: Server, connect_timeout_s: float = 10.0) -> list[str]:
    """ssh's options for ``server``: batch mode (never a prompt), no user or system config, the server's key alone,
    and known_hosts next to that key (new hosts accepted once, a changed host key refused)."""
    opts = {"BatchMode": "yes", "ConnectTimeout": str(int(connect_timeout_s)), "ServerAliveInterval": "5",
            "ServerAliveCountMax": "3", "StrictHostKeyChecking": "accept-new", "LogLevel": "ERROR"}
    if server.key:
        opts["IdentitiesOnly"] = "yes"
        opts["UserKnownHostsFile"] = str(Path(server.key).parent / "known_hosts")
    return ["ssh", "-F", "/dev/null", "-T", *[f"-o{k}={v}" for k, v in opts.items()], *server.ssh_destination()]


def agent_command(python: str = sys.executable, root: Path = PROJECT_ROOT, lease_s: float | None = None) -> list[str]:
    """The agent's command line on a server with this checkout and interpreter at the same paths (the lab VM runs
    this machine's filesystem; other servers are installed by scripts/install.sh at the same path); with
    ``lease_s``, the agent tears down after that long without a request (serveragent.Lease)."""
    return ["env", f"PYTHONPATH={root}", python, "-m", AGENT_MODULE,
            *(["--lease-s", f"{lease_s:g}"] if lease_s else [])]


class AgentLink:
    """A running agent and its pipe: :meth:`call` sends one request and waits for its reply (one at a time: a lock).
    ``heartbeat_s``: a thread pings the agent that often while no call is under way, renewing the lease its command
    line asked for (:func:`agent_command`'s ``lease_s``); :meth:`stop_heartbeat` ends it (a lab gone silent)."""

    def __init__(self, server: Server, argv: list[str], heartbeat_s: float | None = None):
        self.server = server
        self.argv = argv
        self._next_id = 0
        self._lock = threading.Lock()
        self._beat = threading.Event()
        t0 = time.monotonic()
        # stderr into an unlinked file, not a pipe: nobody reads it while the agent runs, and a pipe that fills
        # (64 KiB of warnings or a traceback) would block the agent and time out every call
        self._stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                         start_new_session=True)
        except OSError as e:
            self._stderr.close()
            raise AgentGone(f"{server.name}: cannot start {argv[0]}: {e.strerror}") from None
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._pending = b""      # what was read past the last complete line (replies are read with os.read)
        self.started_s = time.monotonic() - t0
        self._beat_thread = None
        if heartbeat_s:
            self._beat_thread = threading.Thread(target=self._heartbeat, args=(heartbeat_s,),
                                                 name=f"lease-{server.name}", daemon=True)
            self._beat_thread.start()

    @classmethod
    def start(cls, server: Server, connect_timeout_s: float = 10.0, lease_s: float | None = LEASE_S) -> "AgentLink":
        """The server's agent: a local subprocess for ``localhost``, else over ssh; leased for ``lease_s`` and
        renewed every third of it (None: no lease, the agent lives until its stdin closes)."""
        cmd = agent_command(lease_s=lease_s)
        beat = lease_s / 3 if lease_s else None
        if server.local:
            return cls(server, cmd, heartbeat_s=beat)
        return cls(server, ssh_argv(server, connect_timeout_s) + [shlex.join(cmd)], heartbeat_s=beat)

    def _heartbeat(self, every_s: float) -> None:
        """Ping every ``every_s`` while no call holds the link (a call renews the lease itself); ends on
        :meth:`stop_heartbeat` or when the agent's process (or its ssh) has ended. A ping that fails otherwise (a
        slow agent, a late or garbled reply) is tried again next time: giving up would let the lease of a live lab
        run out."""
        while not self._beat.wait(every_s):
            if not self._lock.acquire(blocking=False):
                continue
            try:
                if self._beat.is_set():          # close() began while this waited
                    return
                self._call("ping", timeout_s=max(5.0, every_s))
            except Exception:  # noqa: BLE001 - see above; the next call reports a real failure
                if self.proc.poll() is not None:
                    return
            finally:
                self._lock.release()

    def stop_heartbeat(self) -> None:
        """Stop renewing the agent's lease: it tears down once the lease runs out (what a lab gone silent causes)."""
        self._beat.set()

    def call(self, op: str, timeout_s: float = 60.0, args: dict | None = None, **kw):
        """The result of ``op`` on the server with arguments ``args`` and ``kw`` (``args`` carries one named like
        this method's own, e.g. run's ``timeout_s``); AgentError when it failed, timed out or the agent is gone."""
        with self._lock:
            return self._call(op, timeout_s, args, **kw)

    def _call(self, op: str, timeout_s: float = 60.0, args: dict | None = None, **kw):
        args = {**(args or {}), **kw}
        self._next_id += 1
        rid = self._next_id
        try:
            self.proc.stdin.write((json.dumps({"id": rid, "op": op, "args": args}) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise AgentGone(f"{self.server.name}: the agent is gone ({self._why()})") from None
        deadline = time.monotonic() + timeout_s
        while True:
            reply = json.loads(self._line(op, deadline, timeout_s))
            if reply.get("id") != rid:          # a late reply to a request that timed out
                continue
            if not reply.get("ok"):
                raise AgentError(f"{self.server.name}: {op}: {reply.get('error')}")
            return reply.get("result")

    def _line(self, op: str, deadline: float, timeout_s: float) -> bytes:
        """The agent's next reply line (its own buffer, so a second line read with the first is not lost to
        select)."""
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentTimeout(f"{self.server.name}: no answer to {op} within {timeout_s:.0f} s")
            if not self._sel.select(timeout=left):
                continue
            data = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not data:
                raise AgentGone(f"{self.server.name}: the agent is gone ({self._why()})")
            self._pending += data
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def _why(self) -> str:
        """The agent's (or ssh's) last stderr line and exit status, once it has ended."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        err = ""
        if self.proc.poll() is not None:
            with contextlib.suppress(OSError, ValueError):   # ValueError: read after close()
                self._stderr.seek(0)
                lines = [x for x in self._stderr.read().decode(errors="replace").strip().splitlines() if x.strip()]
                err = lines[-1] if lines else ""
        return f"status {self.proc.returncode}" + (f": {err}" if err else "")

    def close(self, grace_s: float = 10.0) -> None:
        """quit, then end of input (the agent tears down on either), then SIGTERM/SIGKILL to its process group."""
        self.stop_heartbeat()
        if self._beat_thread is not None and self._beat_thread is not threading.current_thread():
            self._beat_thread.join(timeout=grace_s + 10)   # a ping under way ends before the pipes close
        if self.proc.poll() is None:
            with contextlib.suppress(AgentError, ValueError, OSError):
                self.call("quit", timeout_s=grace_s)
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            for sig in (15, 9):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
                    break
        self._sel.close()
        for f in (self.proc.stdout, self._stderr):
            with contextlib.suppress(OSError, ValueError):
                f.close()

    def __enter__(self) -> "AgentLink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def clock_pass(reference: AgentLink, server: AgentLink, address: str, port: int, exchanges: int = 100) -> dict:
    """One clock pass of ``server`` against ``reference`` over ``address`` (the server's own, from the servers
    file): the server's agent starts the UDP clock echo on ``address``:``port`` (it ends on the prober's STOP, after
    60 s idle, or with the agent), the reference's agent ping-pongs it ``exchanges`` times 10 ms apart, each side
    stamping with its own CLOCK_MONOTONIC, and keeps the fastest round trips (the minimum-delay filter:
    testbed.measure.clockprobe, analysis.clockoffset.estimate). The NTP-style offset measurement between two
    machines, done by the agents themselves. Returns the probe's numbers (analysis.clockoffset.Offset's fields with
    ``sent`` and ``delay_median_s``): ``offset_s`` (the server's clock minus the reference's), ``uncertainty_s``
    (its bound), ``n`` valid of ``sent`` exchanges, ``n_kept`` of them the fastest, ``delay_min_s``, ...;
    AgentError when either agent fails."""
    server.call("clock_serve", bind=address, port=port, idle_s=60)
    return reference.call("clock_probe", timeout_s=exchanges * 0.6 + 30, addr=address, port=port, count=exchanges)


#: how long past its own timeout a request of call_each may take before its server is named as not answering
JOIN_GRACE_S = 30.0


def call_each(calls: dict, op: str, wait_s: float, wall_s: dict[str, float] | None = None) -> dict:
    """Run every server's request at once, a thread each (``calls``: server -> a function making its request ``op``),
    as a cluster's frontend asks all its workers: server -> its reply. Each request's wall time goes into ``wall_s``.
    AgentError, one message naming every server whose request failed or had not answered within ``wait_s``."""
    got: dict = {}
    errors: dict[str, str] = {}

    def one(name: str) -> None:
        t0 = time.monotonic()
        try:
            got[name] = calls[name]()
        except Exception as e:  # noqa: BLE001 - a thread's exception is otherwise lost: named below
            errors[name] = str(e) if isinstance(e, AgentError) else f"{name}: {type(e).__name__}: {e}"
        if wall_s is not None:
            wall_s[name] = time.monotonic() - t0

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in calls]
    deadline = time.monotonic() + wait_s
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    failed = [errors.get(n, f"{n}: no answer to {op}") for n in calls if n not in got]
    if failed:
        raise AgentError("; ".join(failed))
    return {n: got[n] for n in calls}
