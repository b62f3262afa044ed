"""A packet capture at one port of the fabric: tcpdump inside the port's namespace, writing a pcap into the run
directory (``capture-<node>-<ifname>.pcap``), so a run can be read packet by packet (analysis.capture decodes it).

The capture is the packets the kernel's packet taps see on that interface: everything it sends, and everything
arriving at it *before* the port's ingress hook (so packets an ingress impairment -- testbed.network.fabric's
``add_loss`` IFB -- drops are still in the capture). Only the first ``snaplen`` bytes of each frame are kept
(headers: Ethernet, IP, UDP/TCP, RoCE's BTH/AETH), which keeps the file and the CPU cost small.

Lifecycle: :meth:`PortCapture.start` returns once tcpdump reports that it is listening (so nothing sent after
that is missed); :meth:`PortCapture.stop` ends it with SIGTERM (tcpdump flushes and closes the file), waits, and
returns tcpdump's own packet counts (``dropped by kernel`` says whether the capture is complete). ``stop`` is
idempotent: register it as a teardown step and call it again at the end of the run.

For a run: :func:`start_capture` (a ``NODE:IFNAME`` parameter -> a started capture, stopped at teardown, or None)
and, once it stopped, :func:`wire_summary` (the ``wire_*`` numbers of summary.json).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from testbed.errors import UsageError
from testbed.kernel import netns

SNAPLEN = 128
#: tcpdump's kernel buffer (KiB): large enough that a slow (emulated) CPU does not drop packets in bursts
BUFFER_KIB = 8192
#: pause before SIGTERM so packets already in the capture buffer are written
DRAIN_S = 0.3


def parse_spec(spec: str, ports: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """``"NODE:IFNAME"`` (or empty: no capture) checked against the fabric's ports; UsageError on bad input."""
    spec = (spec or "").strip()
    if not spec:
        return None
    node, sep, ifname = spec.partition(":")
    node, ifname = node.strip(), ifname.strip()
    known = sorted(set(ports))
    if not sep or not node or not ifname:
        raise UsageError(f"capture: expected NODE:IFNAME, e.g. {known[0][0]}:{known[0][1]} (got {spec!r})"
                         if known else f"capture: expected NODE:IFNAME (got {spec!r})")
    if (node, ifname) not in known:
        nodes = sorted({n for n, _ in known})
        if node not in nodes:
            raise UsageError(f"capture: unknown node {node!r} (nodes: {', '.join(nodes)})")
        raise UsageError(f"capture: {node} has no port {ifname!r} (ports: "
                         f"{', '.join(i for n, i in known if n == node)})")
    if not shutil.which("tcpdump"):
        raise UsageError("capture: tcpdump not found (Debian package tcpdump; scripts/install.sh installs it)")
    return node, ifname


def file_name(node: str, ifname: str) -> str:
    return f"capture-{node}-{ifname}.pcap"


class PortCapture:
    """tcpdump on ``ifname`` inside namespace ``ns``, writing ``path``."""

    def __init__(self, ns: str, node: str, ifname: str, path: Path, popen: Callable[..., subprocess.Popen],
                 snaplen: int = SNAPLEN):
        self.ns, self.node, self.ifname, self.path = ns, node, ifname, Path(path)
        self.popen = popen
        self.snaplen = snaplen
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None
        self.stats: dict = {}

    def argv(self) -> list[str]:
        # -Z root: Debian's tcpdump otherwise drops to the tcpdump user and may not write into the run directory.
        # --immediate-mode: without it packets wait in a TPACKET_V3 block for up to a second and those still
        # waiting when SIGTERM arrives are never written (measured: 0 of 6 packets of a short ping kept).
        return ["tcpdump", "-i", self.ifname, "-s", str(self.snaplen), "-n", "-B", str(BUFFER_KIB), "-Z", "root",
                "--immediate-mode", "-w", str(self.path)]

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip()
            self.lines.append(line)
            if "listening on" in line:
                self._listening.set()

    def start(self, timeout_s: float = 60.0) -> None:
        """Start tcpdump; return once it is listening. RuntimeError (with tcpdump's last line) if it fails."""
        self.proc = self.popen(self.ns, self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read_stderr, name="tcpdump-stderr", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while not self._listening.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                last = self.lines[-1] if self.lines else "no output"
                raise RuntimeError(f"tcpdump on {self.node}:{self.ifname} did not start: {last}")

    def stop(self, timeout_s: float = 30.0) -> dict:
        """SIGTERM, wait (SIGKILL after ``timeout_s``); tcpdump's counts: ``captured``, ``received``,
        ``dropped`` (by the kernel: the capture missed packets), ``file_bytes``."""
        p = self.proc
        if p is None:
            return self.stats
        self.proc = None
        if p.poll() is None:
            time.sleep(DRAIN_S)  # let tcpdump take what the kernel already queued for it
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.stats = parse_stats(self.lines)
        self.stats["file_bytes"] = self.path.stat().st_size if self.path.exists() else 0
        self.stats["exit_status"] = p.returncode
        return self.stats


def parse_stats(lines: Iterable[str]) -> dict:
    """tcpdump's closing lines (``N packets captured``, ``N packets received by filter``, ``N packets dropped by
    kernel``) as ``{captured, received, dropped}``; missing lines are absent keys."""
    out = {}
    for line in lines:
        m = re.match(r"\s*(\d+) packets? (captured|received by filter|dropped by kernel)", line)
        if m:
            out[{"captured": "captured", "received by filter": "received",
                 "dropped by kernel": "dropped"}[m.group(2)]] = int(m.group(1))
    return out


def start_capture(spec: str, fabric, rundir_path: Path, on_teardown: Callable[[Callable[[], object]], None],
                  progress: Callable[[str], None]) -> PortCapture | None:
    """A capture at ``spec`` (``NODE:IFNAME`` of ``fabric``, checked as :func:`parse_spec` does; empty: None) into
    the run directory, started (listening) and registered to stop at teardown."""
    where = parse_spec(spec, fabric.topology.addresses)
    if not where:
        return None
    cap = PortCapture(fabric.ns(where[0]), where[0], where[1], Path(rundir_path) / file_name(*where), netns.popen)
    on_teardown(cap.stop)
    cap.start()
    progress(f"capturing {where[0]}:{where[1]} into {cap.path.name} (tcpdump -s {cap.snaplen})")
    return cap


def wire_summary(cap: PortCapture, stats: dict, progress: Callable[[str], None], scenario: str) -> dict:
    """A stopped capture (``stats``: what :meth:`PortCapture.stop` returned) as summary.json's ``wire_*`` keys:
    ``wire_capture_port/file/kernel_drops`` plus analysis.capture's decoded numbers (an undecodable file is one
    line on stderr and leaves only the capture's own keys)."""
    from analysis.capture import CaptureError, decode

    t = time.monotonic()
    out = {"wire_capture_port": f"{cap.node}:{cap.ifname}", "wire_capture_file": cap.path.name,
           "wire_capture_kernel_drops": stats.get("dropped")}
    try:
        decoded = decode(cap.path)
    except CaptureError as e:
        print(f"testbed: {scenario}: capture not decoded: {e}", file=sys.stderr)
        return out
    out.update(decoded.summary())
    if decoded.notes:
        out["wire_capture_notes"] = "; ".join(decoded.notes)
    progress(f"decoded {decoded.packets} captured packets in {time.monotonic() - t:.1f} s: "
             f"{out['wire_roce_retransmitted_packets']} RoCE packets retransmitted, {out['wire_roce_naks']} NAKs, "
             f"{out['wire_tcp_retransmitted_segments']} TCP segments retransmitted, {out['wire_pfc_frames']} PFC "
             f"frames")
    return out
