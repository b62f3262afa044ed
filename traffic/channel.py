"""The agent's end of the control connection: JSON lines over the controller's path-based AF_UNIX socket in the run
directory (it works across network namespaces and puts no packet on the emulated network). :class:`AgentError` is
every failure an agent reports in one line: a silent or closed controller, an abort."""

from __future__ import annotations

import json
import socket
import time


class AgentError(RuntimeError):
    pass


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
