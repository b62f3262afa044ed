"""Background bulk TCP flows (checkpoint traffic) beside a collective job.

    bg = BackgroundFlows(flows, endpoints, enter, cc="cubic")   # endpoints: host -> (namespace, ip)
    bg.start()      # connections up, senders streaming
    ...
    stats = bg.stop()   # [{src, dst, dscp, src_port, dst_port, bytes, seconds, goodput_mbps}]

Each flow is one TCP connection from ``src`` (port ``src_port``, or one the kernel picks) to ``dst`` (ports
``base_port``, ``base_port + 1``, ...; 5300 by default), one sender thread and one
receiver thread in the controller process; sockets are created inside the hosts' namespaces through ``enter(ns)``
(a context manager, testbed.kernel.netns.entered). DSCP via IP_TOS, congestion control per socket, optional
pacing with SO_MAX_PACING_RATE.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable, ContextManager, Sequence

from traffic.job import BackgroundFlow
from traffic.tcp import set_cc

BASE_PORT = 5300
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)


class BackgroundFlows:
    def __init__(self, flows: Sequence[BackgroundFlow], endpoints: dict[str, tuple[str, str]],
                 enter: Callable[[str], ContextManager], cc: str | None = None, chunk: int = 1 << 16,
                 base_port: int = BASE_PORT, cc_by_host: dict[str, str] | None = None):
        self.flows = list(flows)
        self.base_port = base_port
        self.ports: list[tuple[int, int]] = []  # (source, destination) port of each started flow
        self.endpoints = endpoints
        self.enter = enter
        self.cc = cc
        self.cc_by_host = dict(cc_by_host or {})  # hosts that use their own congestion control
        self.chunk = chunk
        self.stop_ev = threading.Event()
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self.received = [0] * len(self.flows)
        self.t_first = [0.0] * len(self.flows)
        self.t_last = [0.0] * len(self.flows)
        self.errors: list[str] = []
        self.t_start = 0.0

    def _sock(self, host: str) -> socket.socket:
        ns, _ = self.endpoints[host]
        with self.enter(ns):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socks.append(s)
        return s

    def start(self, timeout_s: float = 10.0) -> None:
        for i, f in enumerate(self.flows):
            for h in (f.src, f.dst):
                if h not in self.endpoints:
                    raise ValueError(f"background flow {f.src}>{f.dst}: unknown host {h!r}")
            _, dip = self.endpoints[f.dst]
            _, sip = self.endpoints[f.src]
            ls = self._sock(f.dst)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            set_cc(ls, self.cc_by_host.get(f.dst, self.cc))
            ls.bind((dip, self.base_port + i))
            ls.listen(1)
            cs = self._sock(f.src)
            set_cc(cs, self.cc_by_host.get(f.src, self.cc))
            if f.dscp:
                cs.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, f.dscp << 2)
            if f.rate_mbps > 0:
                cs.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, int(f.rate_mbps * 1e6 / 8))
            cs.settimeout(timeout_s)
            if f.src_port:
                cs.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            cs.bind((sip, f.src_port))
            cs.connect((dip, self.base_port + i))
            self.ports.append((cs.getsockname()[1], self.base_port + i))
            ls.settimeout(timeout_s)
            rs, _ = ls.accept()
            self.socks.append(rs)
            ls.close()
            ack_dscp = f.dscp if f.ack_dscp is None else f.ack_dscp
            if ack_dscp:
                rs.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, ack_dscp << 2)  # its ACKs (default: same class)
            self.threads.append(threading.Thread(target=self._send, args=(i, cs), daemon=True, name=f"bg-send-{i}"))
            self.threads.append(threading.Thread(target=self._recv, args=(i, rs), daemon=True, name=f"bg-recv-{i}"))
        self.t_start = time.monotonic()
        for t in self.threads:
            t.start()

    def _send(self, i: int, s: socket.socket) -> None:
        buf = bytes(self.chunk)
        s.settimeout(0.2)
        try:
            while not self.stop_ev.is_set():
                try:
                    s.send(buf)
                except socket.timeout:
                    continue
        except OSError as e:
            if not self.stop_ev.is_set():
                self.errors.append(f"flow {i} send: {e}")
        finally:
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _recv(self, i: int, s: socket.socket) -> None:
        buf = bytearray(1 << 18)
        s.settimeout(0.2)
        deadline = None
        try:
            while True:
                if self.stop_ev.is_set():
                    deadline = deadline or time.monotonic() + 2.0
                    if time.monotonic() > deadline:
                        return
                try:
                    n = s.recv_into(buf)
                except socket.timeout:
                    continue
                if n == 0:
                    return
                now = time.monotonic()
                if not self.t_first[i]:
                    self.t_first[i] = now
                self.t_last[i] = now
                self.received[i] += n
        except OSError as e:
            if not self.stop_ev.is_set():
                self.errors.append(f"flow {i} receive: {e}")

    def snapshot(self) -> tuple[float, list[int]]:
        """(monotonic time, bytes received so far per flow): two snapshots give each flow's goodput in between."""
        return time.monotonic(), list(self.received)

    def stop(self) -> list[dict]:
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout=5)
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        out = []
        for i, f in enumerate(self.flows):
            dur = self.t_last[i] - self.t_start if self.t_last[i] else 0.0
            sport, dport = self.ports[i] if i < len(self.ports) else (f.src_port, self.base_port + i)
            out.append({"src": f.src, "dst": f.dst, "dscp": f.dscp, "src_port": sport, "dst_port": dport,
                        "bytes": self.received[i], "seconds": dur,
                        "goodput_mbps": self.received[i] * 8 / dur / 1e6 if dur > 0 else 0.0})
        return out
