"""Samplers that run beside an experiment: switch queues (queues.csv) and host CPU (cpu.csv, fidelity).

    with QueueSampler(fabric, interval_s=0.001) as qs:   # or qs.start() ... qs.stop()
        ... traffic ...
    qs.write(rundir)            # queues.csv + cpu.csv
    qs.achieved_interval_s      # what the loop really managed (an emulation on slow CPUs rarely makes 1 ms)

The queue sampler is one thread holding one pyroute2 socket per namespace; each tick dumps the leaf qdisc stats of
every watched port (testbed.kernel.qdisc.leaf_stats) and timestamps the row with time.monotonic() (the clock every
run-directory file uses). Rows are buffered in memory and written at the end, so the sampler never writes to disk
while traffic runs. The CPU sampler reads /proc/stat (whole machine: in the lab VM that is every emulated node).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import subprocess
import threading
import time
from typing import Iterable

from testbed.kernel import netns, qdisc
from testbed.measure import liveview

QUEUE_COLUMNS = ["t_s", "node", "port", "class", "backlog_bytes", "backlog_packets", "drops", "marks", "sent_bytes",
                 "sent_packets", "overlimits"]
CPU_COLUMNS = ["t_s", "busy_fraction"]


def read_cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        parts = f.readline().split()
    vals = [int(x) for x in parts[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


class CpuSampler:
    """Busy fraction of all CPUs over each interval (default 100 ms)."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.rows: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._first: tuple[int, int] | None = None
        self._last: tuple[int, int] | None = None

    def start(self) -> "CpuSampler":
        self._first = self._last = read_cpu_times()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        prev = self._last
        while not self._stop.wait(self.interval_s):
            cur = read_cpu_times()
            db, dt = cur[0] - prev[0], cur[1] - prev[1]
            if dt > 0:
                self.rows.append((time.monotonic(), db / dt))
            prev = cur
        self._last = read_cpu_times()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)

    @property
    def mean_busy(self) -> float:
        """Busy fraction over the whole sampled period."""
        if not self._first or not self._last or self._last[1] <= self._first[1]:
            return sum(r[1] for r in self.rows) / len(self.rows) if self.rows else 0.0
        return (self._last[0] - self._first[0]) / (self._last[1] - self._first[1])

    @property
    def peak_busy(self) -> float:
        return max((r[1] for r in self.rows), default=0.0)


# ---- a lean RTM_GETQDISC dump ----------------------------------------------------------------------------------
# pyroute2 builds a full object tree per message (about 1 ms per dump on a fast host, 100+ ms in the software-
# emulated lab VM), too slow to sample queues every millisecond. This reads the same counters qdisc.leaf_stats reads
# straight from the netlink reply with struct; tests check that both agree on the same port.

_NLMSG_HDR = struct.Struct("=LHHLL")
_TCMSG = struct.Struct("=BxxxiIII")
_RTA = struct.Struct("=HH")
_RTM_NEWQDISC, _RTM_GETQDISC, _NLMSG_DONE, _NLMSG_ERROR = 36, 38, 3, 2
_TCA_KIND, _TCA_XSTATS, _TCA_STATS2 = 1, 4, 7
_TCA_STATS_BASIC, _TCA_STATS_QUEUE, _TCA_STATS_PKT64 = 1, 3, 8
_BASIC = struct.Struct("=QL")
_QUEUE = struct.Struct("=LLLLL")  # qlen backlog drops requeues overlimits
_RED_X = struct.Struct("=LLLL")  # early pdrop other marked


def _attrs(buf, off: int, end: int):
    while off + 4 <= end:
        ln, typ = _RTA.unpack_from(buf, off)
        if ln < 4:
            return
        yield typ & 0x3FFF, off + 4, off + ln
        off += (ln + 3) & ~3


class RawQdiscDump:
    """One NETLINK_ROUTE socket opened inside a namespace; `leaf_stats()` -> {ifindex: [QueueSample, ...]} of every
    qdisc whose parent is an HTB class 1:x (the leaf queues install_port makes), as qdisc.leaf_stats reports them."""

    def __init__(self, ns: str | None):
        self.sock = netns.netlink_socket(ns)
        self.seq = 0
        self.buf = bytearray(1 << 20)

    def close(self) -> None:
        self.sock.close()

    def leaf_stats(self) -> dict[int, list[qdisc.QueueSample]]:
        """{ifindex: [QueueSample of each leaf queue under HTB 1:]}, one dump of the whole namespace."""
        out: dict[int, list[qdisc.QueueSample]] = {}
        for ifindex, parent, q in self.all_stats():
            if parent != 0xFFFFFFFF and (parent >> 16) == 1:
                out.setdefault(ifindex, []).append(q)
        return out

    def root_stats(self, ifindex: int) -> qdisc.QueueSample | None:
        """The root qdisc's own counters on one interface (for HTB: what the shaper sent)."""
        for i, parent, q in self.all_stats():
            if i == ifindex and parent == 0xFFFFFFFF:
                return q
        return None

    def all_stats(self) -> list[tuple[int, int, qdisc.QueueSample]]:
        """(ifindex, parent, QueueSample) of every qdisc in the namespace (minor = handle major of the qdisc)."""
        self.seq += 1
        req = _NLMSG_HDR.pack(_NLMSG_HDR.size + _TCMSG.size, _RTM_GETQDISC, 0x301, self.seq, 0) + \
            _TCMSG.pack(0, 0, 0, 0, 0)
        self.sock.send(req)
        out: list[tuple[int, int, qdisc.QueueSample]] = []
        buf = self.buf
        while True:
            n = self.sock.recv_into(buf)
            off = 0
            while off + 16 <= n:
                ln, typ, _, seq, _ = _NLMSG_HDR.unpack_from(buf, off)
                if ln < 16:
                    break
                if typ == _NLMSG_DONE:
                    return out
                if typ == _NLMSG_ERROR:
                    err = -struct.unpack_from("=i", buf, off + 16)[0]
                    raise OSError(err, f"RTM_GETQDISC: {os.strerror(err)}")
                if typ == _RTM_NEWQDISC and seq == self.seq:
                    out.append(self._one(buf, off + 16, off + ln))
                off += (ln + 3) & ~3

    @staticmethod
    def _one(buf, off: int, end: int) -> tuple[int, int, qdisc.QueueSample]:
        _, ifindex, handle, parent, _ = _TCMSG.unpack_from(buf, off)
        kind = ""
        bbytes = bpk = 0
        pk64 = None
        q = (0, 0, 0, 0, 0)
        marks = 0
        xstats = None
        for typ, a, b in _attrs(buf, off + _TCMSG.size, end):
            if typ == _TCA_KIND:
                kind = bytes(buf[a:b]).split(b"\0", 1)[0].decode()
            elif typ == _TCA_STATS2:
                for t2, c, d in _attrs(buf, a, b):
                    if t2 == _TCA_STATS_BASIC and d - c >= 12:
                        bbytes, bpk = _BASIC.unpack_from(buf, c)
                    elif t2 == _TCA_STATS_QUEUE and d - c >= 20:
                        q = _QUEUE.unpack_from(buf, c)
                    elif t2 == _TCA_STATS_PKT64 and d - c >= 8:
                        pk64 = struct.unpack_from("=Q", buf, c)[0]
            elif typ == _TCA_XSTATS:
                xstats = (a, b)
        if kind == "red" and xstats and xstats[1] - xstats[0] >= 16:
            marks = _RED_X.unpack_from(buf, xstats[0])[3]
        return ifindex, parent, qdisc.QueueSample(
            minor=handle >> 16, kind=kind, backlog_bytes=q[1], backlog_packets=q[0], drops=q[2], marks=marks,
            sent_bytes=bbytes, sent_packets=pk64 if pk64 is not None else bpk, overlimits=q[4])


def port_totals(ports: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], dict[str, int]]:
    """Cumulative drops, ECN marks, sent packets and bytes of every given egress port, summed over the port's leaf
    queues: {(node, ifname): {"drops", "marks", "sent_packets", "sent_bytes"}}. `ports` is Fabric.ports() ((node,
    namespace, ifname)); one netlink dump per namespace. Read before and after a run: the difference is what the
    run's traffic did to the switch queues (a drop here is a packet the emulated switch discarded, as a real one's
    tail drop); :class:`testbed.measure.portrecord.PortCounters` does that."""
    by_ns: dict[str, list[tuple[str, str]]] = {}
    for node, ns, ifn in ports:
        by_ns.setdefault(ns, []).append((node, ifn))
    out: dict[tuple[str, str], dict[str, int]] = {}
    for ns, items in by_ns.items():
        with netns.entered(ns):
            idx_of = {name: i for i, name in socket.if_nameindex()}
        dump = RawQdiscDump(ns)
        try:
            per_if = dump.leaf_stats()
        finally:
            dump.close()
        for node, ifn in items:
            qs = per_if.get(idx_of.get(ifn, -1), ())
            out[(node, ifn)] = {"drops": sum(q.drops for q in qs), "marks": sum(q.marks for q in qs),
                                "sent_packets": sum(q.sent_packets for q in qs),
                                "sent_bytes": sum(q.sent_bytes for q in qs)}
    return out


class _OneDump:
    """Stands in for an IPRoute in qdisc.leaf_stats: one RTM_GETQDISC dump of the whole namespace, filtered per
    port, instead of one dump per port (the kernel dumps every device's qdiscs either way)."""

    def __init__(self, ipr):
        self.msgs = list(ipr.get_qdiscs())

    def get_qdiscs(self, index: int):
        return [m for m in self.msgs if m["index"] == index]


class QueueSampler:
    """Sample every shaped egress port of `fabric` (or only `ports`, a set of (node, ifname)) every `interval_s`.

    Also runs a CpuSampler (cpu_interval_s) so the fidelity of the run can be judged from the same object.
    backend: "raw" (RawQdiscDump, the default: fast enough for ~1 ms on a real machine) or "pyroute2" (one pyroute2
    dump per namespace parsed by qdisc.leaf_stats; the reference, about 10-50x slower).
    """

    def __init__(self, fabric, interval_s: float = 0.001, ports: Iterable[tuple[str, str]] | None = None,
                 cpu_interval_s: float = 0.1, backend: str = "raw", mode: str = "process"):
        if backend not in ("raw", "pyroute2"):
            raise ValueError(f"backend must be raw or pyroute2 (got {backend!r})")
        if mode not in ("process", "thread"):
            raise ValueError(f"mode must be process or thread (got {mode!r})")
        self.backend = backend
        self.mode = "thread" if backend == "pyroute2" else mode
        self._proc: subprocess.Popen | None = None
        self._rows_file: str | None = None
        self._live = None  # testbed.measure.liveview.LiveView while one shows this sampler's rounds
        self.fabric = fabric
        self.interval_s = float(interval_s)
        wanted = set(ports) if ports is not None else None
        self.ports = [(node, ns, ifn) for node, ns, ifn in fabric.ports()
                      if wanted is None or (node, ifn) in wanted]
        if wanted is not None:
            missing = wanted - {(n, i) for n, _, i in self.ports}
            if missing:
                raise KeyError(f"not shaped egress ports of this fabric: {sorted(missing)}")
        self.rows: list[tuple] = []
        self.ticks = 0
        self.t_first = self.t_last = 0.0
        self.cpu = CpuSampler(cpu_interval_s)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._written = False
        self._labels = {}
        for node, _, ifn in self.ports:
            plan = fabric.port_plan(node, ifn)
            self._labels[(node, ifn)] = plan

    # ---- control ----

    def start(self) -> "QueueSampler":
        if self.mode == "process":
            self._start_process()
        else:
            self._thread = threading.Thread(target=self._loop, name="queue-sampler", daemon=True)
            self._thread.start()
            self._ready.wait(timeout=30)
            if self._error:
                raise self._error
        self.cpu.start()
        return self

    def stop(self, rundir=None) -> None:
        """Stop sampling (a second call does nothing more); with ``rundir``, also :meth:`write` queues.csv and
        cpu.csv there, once: what a lab does at its end, or an experiment before it reads queues.csv."""
        self._stop.set()
        if self._proc is not None:
            self._stop_process()
        if self._thread:
            self._thread.join(timeout=10)
        self.cpu.stop()
        if self._error:
            raise self._error
        if rundir is not None and not self._written:
            self._written = True
            self.write(rundir)

    # ---- process mode: the same loop in a child interpreter, away from the experiment's GIL ----
    # In thread mode the sampler competes for the GIL with the traffic threads of the scenario: every netlink
    # syscall releases it and getting it back can take a 5 ms switch interval, so a 1 ms sampler achieved ~100 ms in
    # the emulated VM. The child only needs namespace names, interface names and class labels.

    def _start_process(self) -> None:
        import json
        import sys
        import tempfile
        from pathlib import Path

        fd, self._rows_file = tempfile.mkstemp(prefix="tb-queues-", suffix=".tsv")
        os.close(fd)
        cfg = {"interval_s": self.interval_s, "rows_file": self._rows_file,
               "ports": [[node, ns, ifn, {str(m): lbl for m, lbl, *_ in self._labels[(node, ifn)].classes}]
                         for node, ns, ifn in self.ports]}
        if liveview.enabled():  # the live view reads this sampler's latest round (testbed.measure.liveview)
            self._live = liveview.LiveView(f"busiest ports of {len(self.ports)}").start()
            cfg["live_file"] = self._live.snapshot_path
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self._proc = subprocess.Popen([sys.executable, "-m", "testbed.measure.telemetry"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        self._proc.stdin.write(json.dumps(cfg) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()  # "ready" once every socket is open
        if line.strip() != "ready":
            self._proc.kill()
            self._proc.wait()
            if self._live is not None:
                self._live.stop()
                self._live = None
            raise RuntimeError(f"queue sampler process did not start: {line.strip() or 'no output'}")

    def _stop_process(self) -> None:
        import json

        proc, self._proc = self._proc, None
        if self._live is not None:
            self._live.stop()
            self._live = None
        try:
            proc.stdin.write("stop\n")
            proc.stdin.close()
        except OSError:
            pass
        out = proc.stdout.readline()
        proc.wait(timeout=60)
        try:
            st = json.loads(out)
        except ValueError:
            self._error = RuntimeError(f"queue sampler process failed (exit {proc.returncode}): {out.strip()}")
            return
        if st.get("error"):
            self._error = RuntimeError(f"queue sampler process: {st['error']}")
        self.ticks, self.t_first, self.t_last = st["ticks"], st["t_first"], st["t_last"]
        with open(self._rows_file) as f:
            for ln in f:
                t, node, ifn, lbl, *nums = ln.rstrip("\n").split("\t")
                self.rows.append((float(t), node, ifn, lbl, *map(int, nums)))
        os.unlink(self._rows_file)

    def __enter__(self) -> "QueueSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the loop ----

    def _loop(self) -> None:
        socks: dict[str, object] = {}
        try:
            by_ns: dict[str, list[tuple[str, str, int]]] = {}
            for node, ns, ifn in self.ports:
                if ns not in socks:
                    with netns.entered(ns):
                        idx_of = {ifn: i for i, ifn in socket.if_nameindex()}
                    socks[ns] = (RawQdiscDump(ns) if self.backend == "raw" else netns.ipr(ns), idx_of)
                by_ns.setdefault(ns, []).append((node, ifn, socks[ns][1][ifn]))
            work = [(socks[ns][0], items) for ns, items in by_ns.items()]
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._ready.set()
            for s, _ in socks.values():
                with contextlib.suppress(Exception):
                    s.close()
            return
        self._ready.set()
        rows = self.rows
        raw = self.backend == "raw"
        try:
            next_t = time.monotonic()
            self.t_first = next_t
            while not self._stop.is_set():
                for sock, items in work:
                    t = time.monotonic()
                    # one netlink dump per namespace per round, shared by its ports
                    if raw:
                        per_if = sock.leaf_stats()
                    else:
                        dump = _OneDump(sock)
                        per_if = {idx: qdisc.leaf_stats(dump, idx) for _, _, idx in items}
                    for node, ifn, idx in items:
                        plan = self._labels[(node, ifn)]
                        for q in per_if.get(idx, ()):
                            rows.append((t, node, ifn, plan.class_label(q.minor), q.backlog_bytes,
                                         q.backlog_packets, q.drops, q.marks, q.sent_bytes, q.sent_packets,
                                         q.overlimits))
                self.ticks += 1
                self.t_last = time.monotonic()
                next_t += self.interval_s
                delay = next_t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                else:
                    next_t = time.monotonic()  # late: do not try to catch up with a burst of samples
        except BaseException as e:  # noqa: BLE001
            self._error = e
        finally:
            for s, _ in socks.values():
                with contextlib.suppress(Exception):
                    s.close()

    # ---- results ----

    @property
    def achieved_interval_s(self) -> float:
        """Mean time between the starts of two sampling rounds (every watched port once per round)."""
        if self.ticks < 2:
            return float("nan")
        return (self.t_last - self.t_first) / self.ticks

    def peak_backlog(self, node: str, port: str) -> int:
        return max((r[4] for r in self.rows if r[1] == node and r[2] == port), default=0)

    def mean_backlog(self, node: str, port: str, t0: float | None = None, t1: float | None = None) -> float:
        vals = [r[4] for r in self.rows if r[1] == node and r[2] == port
                and (t0 is None or r[0] >= t0) and (t1 is None or r[0] <= t1)]
        return sum(vals) / len(vals) if vals else 0.0

    def write(self, rundir) -> None:
        """queues.csv and cpu.csv into the run directory (testbed.rundir.RunDir)."""
        rundir.write_csv("queues.csv", QUEUE_COLUMNS,
                         ((f"{r[0]:.6f}", *r[1:]) for r in self.rows))
        rundir.write_csv("cpu.csv", CPU_COLUMNS, ((f"{t:.6f}", f"{b:.4f}") for t, b in self.cpu.rows))

    def stats(self) -> dict:
        return {"queue_sampler_backend": self.backend, "queue_sample_interval_s": self.achieved_interval_s,
                "queue_samples": self.ticks, "queue_ports_sampled": len(self.ports),
                "cpu_busy_fraction": self.cpu.mean_busy, "cpu_busy_peak": self.cpu.peak_busy}


def _open_ports(ports: list) -> dict[str, tuple[RawQdiscDump, list]]:
    """Per namespace of the config's ``ports`` (node, ns, ifname, {minor: class label}): a dump socket and the
    ports to read from it, as (node, ifname, ifindex, labels)."""
    work: dict[str, tuple[RawQdiscDump, list]] = {}
    for node, ns, ifn, labels in ports:
        if ns not in work:
            with netns.entered(ns):
                idx_of = {name: i for i, name in socket.if_nameindex()}
            work[ns] = (RawQdiscDump(ns), [], idx_of)
        work[ns][1].append((node, ifn, work[ns][2][ifn], {int(k): v for k, v in labels.items()}))
    return work


def _sample_round(work: dict, rows: list) -> None:
    """One round: a dump per namespace, a queues.csv row per watched leaf queue (timestamped at its dump)."""
    for sock, items, _ in work.values():
        t = time.monotonic()
        per_if = sock.leaf_stats()
        for node, ifn, idx, labels in items:
            for q in per_if.get(idx, ()):
                rows.append((t, node, ifn, labels.get(q.minor, f"1:{q.minor:x}"), q.backlog_bytes,
                             q.backlog_packets, q.drops, q.marks, q.sent_bytes, q.sent_packets, q.overlimits))


def _child_main() -> int:
    """`python -m testbed.measure.telemetry`: the process-mode sampler. Reads one JSON config line on stdin,
    prints "ready", samples until stdin says stop (or closes), writes rows (tab-separated) to the file named in the
    config and prints {"ticks", "t_first", "t_last"} as JSON."""
    import json
    import sys

    cfg = json.loads(sys.stdin.readline())
    interval = float(cfg["interval_s"])
    try:
        work = _open_ports(cfg["ports"])
    except Exception as e:  # noqa: BLE001
        print(f"error: {e}", flush=True)
        return 1
    print("ready", flush=True)
    live_file = cfg.get("live_file")
    live_due = 0.0
    rows = []
    ticks = 0
    t_first = t_last = next_t = time.monotonic()
    err = None
    stdin = sys.stdin.fileno()
    try:
        while True:
            first = len(rows)
            _sample_round(work, rows)
            ticks += 1
            t_last = time.monotonic()
            if live_file and t_last >= live_due:  # this round, for the live view
                liveview.write_snapshot(live_file, t_last,
                                        [(r[1], r[2], r[3], r[4], r[6], r[7], r[8]) for r in rows[first:]])
                live_due = t_last + liveview.SNAPSHOT_EVERY_S
            next_t += interval
            delay = next_t - time.monotonic()
            if delay < 0:
                next_t = time.monotonic()
                delay = 0
            if select.select([stdin], [], [], delay)[0]:
                break  # "stop" or EOF
    except Exception as e:  # noqa: BLE001
        err = str(e)
    with open(cfg["rows_file"], "w") as f:
        for r in rows:
            f.write(f"{r[0]:.6f}\t" + "\t".join(map(str, r[1:])) + "\n")
    print(json.dumps({"ticks": ticks, "t_first": t_first, "t_last": t_last, "error": err}), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_child_main())
