"""The agent's end of the control connection: JSON lines over a stream socket to the controller. On one machine it is
the controller's path-based AF_UNIX socket in the run directory (it works across network namespaces and puts no
packet on the emulated network); across machines (docs/servers.md) a TCP connection over the servers' own network,
which the server's agent opens from its own namespace and hands the rank's process as an inherited descriptor
(:func:`connect`'s ``fd:N``), since the host's namespace sees only the emulated fabric. :class:`AgentError` is
every failure an agent reports in one line: a silent or closed controller, an abort."""

from __future__ import annotations

import json
import socket
import time


class AgentError(RuntimeError):
    pass


def connect(spec: str, timeout_s: float = 30.0) -> socket.socket:
    """The control connection ``spec`` names: ``fd:N`` (a connected stream socket this process inherited),
    ``tcp:HOST:PORT`` (connect from this namespace), or a path (the controller's AF_UNIX socket). OSError, or
    ValueError for a malformed spec."""
    if spec.startswith("fd:"):
        fd = int(spec[3:])
        s = socket.socket(fileno=fd)
        if s.type != socket.SOCK_STREAM:
            s.detach()
            raise ValueError(f"descriptor {fd} is not a stream socket")
        return s
    if spec.startswith("tcp:"):
        host, _, port = spec[4:].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"expected tcp:HOST:PORT, got {spec!r}")
        return socket.create_connection((host, int(port)), timeout=timeout_s)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout_s)
        s.connect(spec)
    except OSError:
        s.close()
        raise
    return s


class Channel:
    """JSON lines over a stream socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def send(self, obj: dict) -> None:
        self.sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def recv(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentError(f"no message from the controller in {timeout_s:g} s")
            self.sock.settimeout(left)
            try:
                part = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            if not part:
                raise AgentError("the controller closed the control connection")
            self.buf += part
        line, self.buf = self.buf.split(b"\n", 1)
        msg = json.loads(line)
        if msg.get("type") == "abort":
            raise AgentError(f"aborted by the controller: {msg.get('reason', '')}")
        return msg

    def check(self) -> None:
        """Raise if the controller has gone or sent abort (non-blocking)."""
        self.sock.setblocking(False)
        try:
            part = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        finally:
            self.sock.setblocking(True)
        if not part:
            raise AgentError("the controller closed the control connection")
        self.buf += part
        if b'"abort"' in self.buf:
            raise AgentError("aborted by the controller")
