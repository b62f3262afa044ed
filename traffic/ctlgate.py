"""Who may take a rank's place on the controller's control channel (traffic.controller).

What it stands for: the job credential a cluster launcher gives each process it starts (Slurm's job credential,
torch's rendezvous ``run_id``, MPI's PMIx job key) and checks before the process joins. Over TCP on the servers'
network (docs/servers.md) anything that can reach the controller's port could connect: a stray client, a scanner, a
rank of an earlier run still retrying, a second copy of a rank. So every connection is a candidate until its first
message: a ``hello`` naming a rank of the job that has no connection yet, with the run's secret ``token`` (put into
the job file the rank reads, never its argv: argv shows in ``ps``) when the controller has one. Anything else
(another message, a wrong or missing token, an unknown rank, a rank already connected, bytes that are not JSON, a
line longer than :data:`MAX_HELLO_BYTES`) is closed, and the controller keeps listening for the real rank. The
AF_UNIX socket of a one-machine run has no token (the run directory's permissions guard it): only the ranks are
checked there.
"""

from __future__ import annotations

import hmac
import json
import selectors
import socket
import time
from typing import Callable

#: the longest first line a candidate may send before it is closed (a hello is about a hundred bytes)
MAX_HELLO_BYTES = 64 * 1024


class Peer:
    """One control connection and what was read of it past the last complete line."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""
        self.rank: int | None = None
        self.eof = False

    def send(self, obj: dict) -> None:
        self.sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def fill(self) -> None:
        """Read what has arrived (non-blocking socket); ``eof`` once the far end closed."""
        try:
            part = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            part = b""
        if not part:
            self.eof = True
        self.buf += part

    def lines(self, limit: int | None = None) -> list[dict]:
        """The complete messages buffered (at most ``limit``); ValueError for a line that is not JSON."""
        out = []
        while b"\n" in self.buf and (limit is None or len(out) < limit):
            line, self.buf = self.buf.split(b"\n", 1)
            out.append(json.loads(line))
        return out

    def read(self) -> list[dict]:
        self.fill()
        return self.lines()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def verdict(msg, token: str | None, ranks: set[int], admitted: set[int]) -> str | None:
    """Why a connection whose first message is ``msg`` may not take a rank's place (None: it may). Pure."""
    if not isinstance(msg, dict) or msg.get("type") != "hello":
        return "its first message is not a hello"
    if token is not None:
        got = msg.get("token")
        if not isinstance(got, str) or not hmac.compare_digest(got.encode(), token.encode()):
            return "wrong or missing token"
    rank = msg.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank not in ranks:
        return f"unknown rank {rank!r}"
    if rank in admitted:
        return f"rank {rank} is connected already"
    return None


class Gate:
    """Accept connections on ``listener`` until every rank of ``ranks`` said a valid hello (:func:`verdict`);
    rejected candidates are closed and their reasons kept in ``rejected``."""

    def __init__(self, listener: socket.socket, token: str | None, ranks: set[int],
                 say: Callable[[str], None] | None = None):
        self.listener, self.token, self.ranks = listener, token, set(ranks)
        self.say = say or (lambda m: None)
        self.hellos: dict[int, dict] = {}
        self.peers: list[Peer] = []
        self.rejected: list[str] = []

    def admit(self, deadline: float, failed: Callable[[], list[str]], error: type[Exception]) -> dict[int, dict]:
        """The ranks' hellos (their connections in ``peers``, in the order they came); ``error`` raised with
        ``failed()``'s reasons (ranks that exited) or at ``deadline``. Candidates still silent then are closed."""
        sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ, None)
        try:
            while len(self.hellos) < len(self.ranks):
                if time.monotonic() > deadline:
                    raise error(f"only {len(self.hellos)} of {len(self.ranks)} agents connected{self._refused()}")
                bad = failed()
                if bad:
                    raise error("; ".join(bad) + self._refused())
                for key, _ in sel.select(0.2):
                    if key.data is None:
                        self._accept(sel)
                    else:
                        self._hear(sel, key.data)
        finally:
            for key in list(sel.get_map().values()):
                if key.data is not None:
                    key.data.close()
            sel.close()
            self.listener.setblocking(True)
        return self.hellos

    def _refused(self) -> str:
        return f" (connections refused: {'; '.join(self.rejected)})" if self.rejected else ""

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            s, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        s.setblocking(False)
        p = Peer(s)
        sel.register(s, selectors.EVENT_READ, p)

    def _hear(self, sel: selectors.BaseSelector, p: Peer) -> None:
        p.fill()
        try:
            first = p.lines(limit=1)
        except ValueError:
            return self._reject(sel, p, "its first line is not JSON")
        if not first:
            if p.eof:
                return self._reject(sel, p, "it closed before a hello")
            if len(p.buf) > MAX_HELLO_BYTES:
                return self._reject(sel, p, f"no hello within {MAX_HELLO_BYTES} bytes")
            return None
        why = verdict(first[0], self.token, self.ranks, set(self.hellos))
        if why is not None:
            return self._reject(sel, p, why)
        sel.unregister(p.sock)
        p.rank = first[0]["rank"]
        self.hellos[p.rank] = first[0]
        self.peers.append(p)
        return None

    def _reject(self, sel: selectors.BaseSelector, p: Peer, why: str) -> None:
        sel.unregister(p.sock)
        p.close()
        self.rejected.append(why)
        self.say(f"control connection refused: {why}")
